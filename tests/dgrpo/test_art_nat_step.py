"""NeMo Agent Toolkit's way through ART on the real stack: a model built as NAT builds it (an
``InternalModelConfig`` of ``None`` sections), registered with ART's server configuration
(``register(backend, _openai_client_config=...)``), trained on trajectories whose choices NAT made from its own
LLM calls: an openai ``Choice`` of the message and the call's logprobs, no token ids. The trainer recovers the
sampled tokens from the logprobs (``token_id:<n>``, as ART's server returns them) and trains them with their
sampling logprobs, as ART 0.5.17 does; tests/activities/test_tokenize.py checks the sequences exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from openai.types.chat.chat_completion import Choice as OpenAIChoice

import dgrpo as art
from activities.checkpoints import METRICS_FILE
from activities.retention import metrics_by_step
from dgrpo.errors import ArtSettingIgnored, UnsupportedArtOption
from dgrpo.local import LocalBackend
from schemas import layout
from schemas.run_state import TrainStepResult

pytestmark = pytest.mark.slow


async def nat_trajectory(
    model: art.TrainableModel, question: str, seed: int, reward: float
) -> art.Trajectory:
    """One turn as NAT records it: its LLM call (logprobs on; ART's server gives tokens as ``token_id:<n>``),
    then NAT's own ``Choice`` of the reply's text and logprobs."""
    messages = [{"role": "user", "content": question}]
    reply = await model.openai_client().chat.completions.create(
        model=model.name,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=4,
        logprobs=True,
        seed=seed,
        extra_body={"return_tokens_as_token_ids": True},
    )
    sampled = reply.choices[0]
    assert sampled.logprobs is not None
    choice = OpenAIChoice(
        index=0,
        logprobs=sampled.logprobs.model_dump(),  # type: ignore[arg-type]
        message={"role": "assistant", "content": sampled.message.content or ""},  # type: ignore[arg-type]
        finish_reason="stop",
    )
    return art.Trajectory(messages_and_choices=[*messages, choice], reward=reward)


async def test_nats_model_registers_with_arts_server_config_and_trains_its_choices(
    held_backend: Path,
) -> None:
    with LocalBackend(path=held_backend) as backend:
        model = art.TrainableModel(
            name="nat",
            project="nat-compat",
            base_model="smollm2-135m-instruct",
            _internal_config=art.dev.InternalModelConfig(init_args=None, engine_args=None, trainer_args=None),
        )
        with pytest.warns(ArtSettingIgnored) as warned:
            await model.register(
                backend,
                _openai_client_config={
                    "server_args": {"port": 8000, "api_key": "default", "return_tokens_as_token_ids": True},
                    "engine_args": {"gpu_memory_utilization": 0.9},
                },
            )
        [warning] = warned
        assert "server_args.port=8000" in str(warning.message) and "--gpu-memory-utilization" in str(
            warning.message
        )
        assert model.inference_base_url == backend.inference_url()
        with pytest.raises(UnsupportedArtOption, match="lora_modules"):
            await model.register(backend, _openai_client_config={"server_args": {"lora_modules": ["x=/a"]}})
        await model.register(backend)

        groups = [
            art.TrajectoryGroup(
                [await nat_trajectory(model, q, seed, reward) for seed, reward in ((1, 1.0), (2, 0.0))]
            )
            for q in ("Say yes.", "Say no.")
        ]
        assert all(c.token_ids is None for g in groups for t in g for c in t.choices())
        result = await model.train(groups, config=art.types.TrainConfig(beta=0, learning_rate=5e-5))
        assert isinstance(result, TrainStepResult)
        assert result.trained and result.step == 1 and result.loss == result.loss  # a number, not NaN
        store = backend.object_store()
        trainer = json.loads(store.get_bytes(layout.checkpoint_prefix(model.run_id, 1) + METRICS_FILE))
        assert (trainer["n_recovered_choices"], trainer["n_template_choices"]) == (4, 0)
        # The importance ratio compares the recovered tokens with their own sampling logprobs: 1 at step 0.
        ratio = metrics_by_step(store, model.run_id)[1]["loss/mean_importance_ratio"]
        assert ratio == pytest.approx(1.0, abs=1e-3)
        assert model.get_inference_name() == "nat--compat-nat@1"
