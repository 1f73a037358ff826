"""ART 0.5's supervised fine-tuning and ``backend.train`` on the real stack, written as an ART program writes them.

``model.train_sft`` (called by ``train_sft_from_file`` on a JSONL file) and ``backend.train_sft`` (each a
durable ``TrainSFT``: fine-tune on the trainer, publish, reload) teach the served model a reply it would never
give, each call one step; then a ``TemporalBackend`` on the same cluster trains a GRPO step with
``backend.train`` and logs it with ``model.log``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

import dgrpo as art
from activities.retention import metrics_by_step
from base_models.resolve import ensure_smollm2
from dgrpo.local import LocalBackend
from dgrpo.utils.sft import train_sft_from_file
from examples.arithmetic import rollout, scenarios

pytestmark = pytest.mark.slow

SYSTEM = {"role": "system", "content": "You answer with one word."}
TARGET = "Pineapple"
OWN = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}: {{ m['content'] }} END<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant: {% endif %}"
)
"""A chat template of the model's own: each turn ends with " END", which SmolLM2's does not."""


def chat(i: int) -> list[dict[str, str]]:
    return [SYSTEM, {"role": "user", "content": f"What is the secret word number {i}?"}]


async def greedy_reply(model: art.TrainableModel) -> tuple[str, list[Any]]:
    """The served model's greedy reply to example 0 and its first token's top logprobs."""
    completion = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(),
        messages=chat(0),  # type: ignore[arg-type]
        max_tokens=6,
        temperature=0.0,
        logprobs=True,
        top_logprobs=20,
    )
    choice = completion.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content
    return choice.message.content or "", choice.logprobs.content[0].top_logprobs


def logprob_of(token: str, top: list[Any]) -> float:
    """``token``'s logprob among the top ones, or (absent) at most the lowest of them."""
    found = [t.logprob for t in top if t.token == token]
    return found[0] if found else min(t.logprob for t in top) - 1e-3


async def test_train_sft_teaches_the_served_model_then_backend_train_and_log(
    held_backend: Path, tmp_path: Path
) -> None:
    examples = [
        art.Trajectory(messages_and_choices=[*chat(i), {"role": "assistant", "content": TARGET}], reward=0)
        for i in range(4)
    ]
    # The session's LocalBackend, reused (its server takes a model's own chat template).
    with LocalBackend(path=held_backend) as backend:
        model = art.TrainableModel(name="sft", project="art-sft")
        await model.register(backend)
        reply_before, top_before = await greedy_reply(model)

        # The first step from a JSONL file (ART's art.utils.sft), which calls model.train_sft.
        sft_file = tmp_path / "examples.jsonl"
        sft_file.write_text("".join(json.dumps({"messages": t.messages()}) + "\n" for t in examples))
        first = await train_sft_from_file(
            model, str(sft_file), batch_size=2, peak_lr=2e-3, schedule_type="constant", warmup_ratio=0
        )
        assert first is not None
        # ART's seam: model.train_sft went through backend._train_sft; its step is the backend's _get_step.
        first_steps = (await backend._get_step(model), await model.get_step())
        second = await backend.train_sft(model, examples, art.TrainSFTConfig(learning_rate=[2e-3, 1e-3]))
        await model.log(metrics=second.metrics, step=second.step, split="train")
        second_steps = (await backend._get_step(model), await model.get_step())
        reply_after, top_after = await greedy_reply(model)
        served = model.get_inference_name()
        records = metrics_by_step(backend.object_store(), model.run_id)

        # A model with a chat template of its own: LocalBackend's server renders its chats with it, and
        # its trainer renders its SFT examples with it.
        own = art.TrainableModel(name="own", project="art-sft", _internal_config={"chat_template": OWN})
        await own.register(backend)
        asked = await own.openai_client().chat.completions.create(
            model=own.name,
            messages=chat(0),
            max_tokens=2,
            extra_body={"return_token_ids": True},  # type: ignore[arg-type]
        )
        own_prompt = art.Choice.model_validate(asked.choices[0]).prompt_token_ids
        own_sft = await backend.train_sft(own, examples[:2], art.TrainSFTConfig(batch_size=2))

        # backend.train on a TemporalBackend pointed at the same cluster, as ART 0.5's main loop.
        remote = art.TemporalBackend(
            address=backend.stack.temporal_address,
            inference_url=backend.inference_url(),
            s3=backend.stack.s3_settings,
        )
        again = art.TrainableModel(name="sft", project="art-sft")
        await again.register(remote)
        step_before_rl = await again.get_step()
        groups = await art.gather_trajectory_groups(
            art.TrajectoryGroup(rollout(again, s) for _ in range(3)) for s in scenarios()[:2]
        )
        result = await remote.train(again, groups, learning_rate=2e-4)
        await again.log(groups, metrics=result.metrics, step=result.step, split="train")
        rl_records = metrics_by_step(remote.object_store(), again.run_id)

    # Each call is one step, published and served; the loss on the examples fell between the calls.
    assert (first.step, second.step, served) == (1, 2, "art--sft-sft@2")
    assert (first_steps, second_steps) == ((1, 1), (2, 2))
    assert (
        first.metrics["data/step_num_trajectories"] == 4
        and first.metrics["data/step_num_gradient_steps"] == 2
    )
    assert first.metrics["data/step_trainer_tokens"] > 0 and first.metrics["loss/learning_rate"] == 2e-3
    assert second.metrics["loss/learning_rate"] == pytest.approx(1.5e-3)
    assert second.metrics["loss/train"] < first.metrics["loss/train"] / 2, (first.metrics, second.metrics)
    assert records[1]["loss/train"] == pytest.approx(first.metrics["loss/train"])  # train_sft logs itself
    # The workflow's own times, its phases' too, came through backend._train_sft's batches into the row.
    for time_key in ("time/step_publish_s", "time/step_trainer_s"):
        assert first.metrics[time_key] > 0 and records[1][time_key] == pytest.approx(first.metrics[time_key])
    assert records[2]["loss/train"] == pytest.approx(second.metrics["loss/train"])  # model.log of the result

    # The served adapter is the fine-tuned one: it now gives the taught reply, its first token far likelier.
    assert not reply_before.startswith(TARGET) and reply_after.startswith(TARGET), (reply_before, reply_after)
    first_token = top_after[0].token
    assert TARGET.startswith(first_token.strip())
    assert logprob_of(first_token, top_after) > logprob_of(first_token, top_before) + math.log(2)

    tokenizer = AutoTokenizer.from_pretrained(str(ensure_smollm2()))
    rendered = tokenizer.apply_chat_template(
        chat(0), chat_template=OWN, add_generation_prompt=True, tokenize=False
    )
    assert own_prompt == tokenizer(rendered, add_special_tokens=False)["input_ids"]
    turn = tokenizer(f"{TARGET} END<|im_end|>", add_special_tokens=False)["input_ids"]  # SmolLM2's: no " END"
    assert own_sft.step == 1 and own_sft.metrics["data/step_trainer_tokens"] == 2 * len(turn)

    assert step_before_rl == 2 and isinstance(result, art.TrainResult) and result.step == 3
    assert str(result.checkpoint_path).startswith("s3://") and "art--sft-sft" in str(result.checkpoint_path)
    assert result.metrics["data/step_num_trajectories"] == 6
    assert rl_records[3]["train/reward"] == pytest.approx(sum(t.reward for g in groups for t in g) / 6)
    assert rl_records[3]["data/step_num_trajectories"] == 6
