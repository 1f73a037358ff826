"""ART's client API on dgrpo, without a stack: config mapping, Model, RULER, gathering, batching, datasets.

The training end of the same API (register, backend.train, model.log) is tests/dgrpo/test_art_program.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

import dgrpo as art
from dgrpo.capture.exchange_training import PolicyNames
from dgrpo.client.train_step import check_trainable
from dgrpo.errors import (
    NoTrainableChoiceError,
    NotRegisteredError,
    TooManyRolloutErrors,
    UnsupportedArtOption,
)
from dgrpo.local import LocalBackend
from dgrpo.metrics import MetricsBuilder
from dgrpo.rewards import JudgeFailed, ruler, ruler_score_group
from dgrpo.utils import iterate_dataset

sys.path.insert(0, str(Path(__file__).parents[1] / "activities"))
from openai_stub import MODEL, USAGE, StubServer, openai_stub

POLICY = PolicyNames("agent", "agent", ("agent",))
"""The policy as the model named ``agent`` sends it (no exchanges here: not read)."""


@pytest.fixture
def stub() -> StubServer:
    with openai_stub() as server:
        yield server  # type: ignore[misc]


# ---- TrainableModel / TrainConfig: ART's settings mapped, or refused with the reason -----------------
def test_internal_config_peft_and_init_args_map_to_lora_and_max_seq_len() -> None:
    model = art.TrainableModel(
        name="m",
        project="p",
        base_model="smollm2-135m-instruct",
        _internal_config=art.dev.InternalModelConfig(
            peft_args=art.dev.PeftArgs(r=8, lora_alpha=16), init_args=art.dev.InitArgs(max_seq_length=512)
        ),
    )
    assert (model.spec.lora.rank, model.spec.lora.alpha) == (8, 16)
    assert model.step_config(None, {}).max_seq_len == 512
    assert model.step_config(art.TrainConfig(max_seq_len=300), {}).max_seq_len == 300
    config = model.step_config(art.TrainConfig(learning_rate=1e-5, beta=0.05), {"epsilon": 0.3})
    assert (config.learning_rate, config.kl_coef, config.epsilon) == (1e-5, 0.05, 0.3)
    assert type(config) is not art.TrainConfig  # the workflow input gets the plain schema class


def test_art_05_dedicated_mode_keys_accept_lora_weights_and_refuse_merged() -> None:
    lora = art.dev.InternalModelConfig(rollout_weights_mode="lora", peft_args=art.dev.PeftArgs(r=4))
    assert art.TrainableModel(name="m", _internal_config=lora).spec.lora.rank == 4
    # GPU ids are refused by register, as ART checks them there (tests/dgrpo/test_local_gpu_cost.py)
    dedicated = art.dev.InternalModelConfig(trainer_gpu_ids=[0], inference_gpu_ids=[1])
    assert art.TrainableModel(name="m", _internal_config=dedicated)._internal_config == dedicated
    with pytest.raises(UnsupportedArtOption, match=r"rollout_weights_mode='merged'.*LoRA adapter"):
        art.TrainableModel(
            name="m", _internal_config=art.dev.InternalModelConfig(rollout_weights_mode="merged")
        )


def test_settings_without_an_equivalent_are_refused_saying_why() -> None:
    with pytest.raises(UnsupportedArtOption, match=r"full_finetuning=True.*trains a LoRA adapter"):
        art.TrainableModel(name="m", _internal_config={"init_args": {"full_finetuning": True}})
    with pytest.raises(
        UnsupportedArtOption, match=r"run id is always <project>-<run_name or name> \(.p-m.\)"
    ):
        art.TrainableModel(name="m", project="p", run_id="wandb-run-7")
    with pytest.raises(ValidationError, match="same setting"):
        art.TrainConfig(beta=0.1, kl_coef=0.2)


async def test_train_refuses_an_art_option_before_touching_a_backend(tmp_path: Path) -> None:
    model = art.TrainableModel(name="m")
    with pytest.raises(UnsupportedArtOption, match=r"importance_sampling_level='sequence'"):
        await model.train([], _config={"importance_sampling_level": "sequence"})
    with pytest.raises(NotRegisteredError, match="register"):
        await LocalBackend(path=tmp_path).train(model, [], learning_rate=1e-5, verbose=True)


async def test_model_trains_config_refuses_save_checkpoint_false(tmp_path: Path) -> None:
    from dgrpo.art_compat.options import train_config_fields

    assert train_config_fields("backend.train", {"learning_rate": 1e-5, "beta": 0.0, "verbose": True}) == {
        "learning_rate": 1e-5,
        "kl_coef": 0.0,
    }
    with pytest.raises(UnsupportedArtOption, match="every dgrpo step publishes its checkpoint"):
        train_config_fields("backend.train", {"save_checkpoint": False})


def test_backend_train_maps_art_05_loss_keywords() -> None:
    from dgrpo.art_compat.options import train_config_fields

    fields = train_config_fields(
        "backend.train", {"loss_fn": "ppo", "normalize_advantages": False, "adam_params": None}
    )
    assert fields == {"importance_sampling": "ppo_clip", "scale_rewards": False}
    assert train_config_fields("backend.train", {"loss_fn": "cispo", "normalize_advantages": True}) == {
        "importance_sampling": "cispo"
    }
    assert train_config_fields("backend.train", {"loss_fn": None}) == {}  # the TrainConfig default
    with pytest.raises(UnsupportedArtOption, match=r"loss_fn='dapo'.*'cispo' or 'ppo'"):
        train_config_fields("backend.train", {"loss_fn": "dapo"})
    with pytest.raises(UnsupportedArtOption, match="loss_fn_config"):
        train_config_fields("backend.train", {"loss_fn_config": {"clip": 0.2}})


def test_model_train_finds_appended_choices_and_refuses_history_choices() -> None:
    from openai.types.chat.chat_completion import Choice as OpenAIChoice

    sampled = OpenAIChoice.model_validate(
        {
            "index": 0,
            "finish_reason": "stop",
            "message": {"role": "assistant", "content": "4"},
            "token_ids": [7],
        }
    )
    traj = art.Trajectory(messages_and_choices=[{"role": "user", "content": "2+2?"}], reward=1)
    traj.messages_and_choices.append(sampled)
    assert check_trainable([art.TrajectoryGroup([traj, traj])], POLICY)
    traj.additional_histories.append(art.History(messages_and_choices=[sampled]))
    with pytest.raises(NoTrainableChoiceError, match="additional_histories"):
        check_trainable([art.TrajectoryGroup([traj, traj])], POLICY)


# ---- art.Model: a baseline behind any OpenAI-compatible endpoint ------------------------------------
async def test_model_behind_an_endpoint(stub: StubServer, tmp_path: Path) -> None:
    model = art.Model(
        name="baseline",
        project="p",
        inference_base_url=stub.base_url,
        inference_model_name=MODEL,
        base_path=str(tmp_path),
    )
    assert (model.get_inference_name(), model.get_inference_name(3)) == (MODEL, f"{MODEL}@3")
    assert model.litellm_completion_params() == {
        "model": MODEL,
        "base_url": stub.base_url,
        "api_key": model.inference_api_key,
        "temperature": 1,
    }
    reply = await model.openai_client().chat.completions.create(
        model=model.name, messages=[{"role": "user", "content": "hi"}]
    )
    assert reply.choices[0].message.content is not None
    assert stub.requests[0]["model"] == MODEL
    assert await model.get_step() == 0
    await model.log([art.Trajectory(reward=1)])  # before register: ART's local files only (test_local_log.py)
    assert (tmp_path / "p/models/baseline/history.jsonl").exists()
    with pytest.raises(NotRegisteredError, match="inference_base_url"):
        art.Model(name="x").openai_client()


# ---- dgrpo.rewards: ART's RULER signature on our judge ----------------------------------------------
def judged_group() -> art.TrajectoryGroup:
    def traj(answer: str, reward: float) -> art.Trajectory:
        return art.Trajectory(
            messages_and_choices=[
                {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": answer},
            ],
            reward=reward,
        )

    group = art.TrajectoryGroup([traj("4, correct", 0.0), traj("5", 1.0)], metadata={"scenario": "a"})
    group.log("kept")
    return group


async def test_ruler_score_group_with_art_arguments(stub: StubServer) -> None:
    judged = await ruler_score_group(judged_group(), f"openai/{MODEL}", {"api_base": stub.base_url})
    assert judged is not None
    assert stub.requests[0]["model"] == MODEL  # litellm's provider prefix is not sent
    assert [t.reward for t in judged] == [0.9, 0.1]
    assert [t.metrics["independent_reward"] for t in judged] == [0.0, 1.0]
    assert (judged.metadata, judged.logs) == ({"scenario": "a"}, ["kept"])


async def test_ruler_failures_raise_or_drop_the_group(stub: StubServer) -> None:
    stub.script = ["nonsense", "still nonsense"]
    with pytest.raises(JudgeFailed, match="no valid judgement in 2 answers"):
        await ruler_score_group(judged_group(), MODEL, {"api_base": stub.base_url})
    stub.script = ["nonsense", "still nonsense"]
    assert (
        await ruler_score_group(judged_group(), MODEL, {"api_base": stub.base_url}, swallow_exceptions=True)
        is None
    )
    await ruler_score_group(judged_group(), MODEL, {"api_base": stub.base_url, "temperature": 0.3, "seed": 7})
    assert (stub.requests[-1]["temperature"], stub.requests[-1]["seed"]) == (0.3, 7)  # as litellm sends them


async def test_ruler_scores_message_lists(stub: StubServer) -> None:
    lists = [
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": a}] for a in ("correct", "no")
    ]
    scores = await ruler(lists, MODEL, {"api_base": stub.base_url})
    assert [(s.trajectory_id, s.score) for s in scores] == [("1", 0.9), ("2", 0.1)]


async def test_ruler_judge_calls_cost_goes_to_the_active_builder_when_priced(stub: StubServer) -> None:
    lists = [
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": a}] for a in ("correct", "no")
    ]
    builder = MetricsBuilder(cost_context="train")
    token = builder.activate()
    try:
        stub.script = ["nonsense"]  # a re-ask: two calls, both paid for
        await ruler(lists, "openai/gpt-4.1", {"api_base": stub.base_url})
        await ruler_score_group(judged_group(), "openai/gpt-4.1", {"api_base": stub.base_url})
        await ruler(lists, "hosted_vllm/judge", {"api_base": stub.base_url})  # no price: no cost, no error
        await ruler(lists, "judge", {"api_base": stub.base_url})  # no provider to price it by
    finally:
        token.var.reset(token)
    assert stub.calls == 5
    metrics = await builder.flush()
    per_call = (USAGE["prompt_tokens"] * 2.0 + USAGE["completion_tokens"] * 8.0) / 1e6  # gpt-4.1's prices
    assert metrics["costs/train/judge/ruler"] == pytest.approx(3 * per_call)
    assert metrics["costs/all"] == pytest.approx(3 * per_call)
    # Outside an active builder the judge is simply asked.
    assert [s.score for s in await ruler(lists, "openai/gpt-4.1", {"api_base": stub.base_url})] == [0.9, 0.1]


# ---- gathering and batching ------------------------------------------------------------------------
async def rollout(reward: float, fail: bool = False) -> art.Trajectory:
    if fail:
        raise ValueError(f"rollout {reward} failed")
    return art.Trajectory(reward=reward)


async def test_gather_trajectories_keeps_exceptions_in_place_up_to_the_limit() -> None:
    async def pair() -> list[art.Trajectory]:
        return [art.Trajectory(reward=5), art.Trajectory(reward=6)]

    results = await art.gather_trajectories(
        [rollout(1), rollout(2, fail=True), pair()], pbar_desc=None, max_exceptions=1
    )
    assert isinstance(results[0], art.Trajectory) and results[0].reward == 1
    assert isinstance(results[1], ValueError)
    assert [t.reward for t in results[2]] == [5, 6]
    with pytest.raises(TooManyRolloutErrors, match="rollout 2 failed"):
        await art.gather_trajectories([rollout(1), rollout(2, fail=True)], pbar_desc=None)


async def test_after_each_may_split_a_group() -> None:
    async def split(group: art.TrajectoryGroup) -> list[art.TrajectoryGroup]:
        return [art.TrajectoryGroup([t]) for t in group]

    groups = await art.gather_trajectory_groups(
        [art.TrajectoryGroup([rollout(1), rollout(2)])], pbar_desc=None, max_metrics=3, after_each=split
    )
    assert [[t.reward for t in g] for g in groups] == [[1], [2]]


async def test_trajectory_group_batches_stream_full_batches_then_the_rest() -> None:
    started: list[int] = []

    async def group(i: int) -> art.TrajectoryGroup:
        started.append(i)
        return art.TrajectoryGroup([art.Trajectory(reward=i)])

    batches = [
        [g.trajectories[0].reward for g in batch]
        async for batch in art.trajectory_group_batches(
            (group(i) for i in range(5)), batch_size=2, pbar_desc=None
        )
    ]
    assert [len(b) for b in batches] == [2, 2, 1]
    assert sorted(r for b in batches for r in b) == [0, 1, 2, 3, 4]

    started.clear()
    coros = [group(i) for i in range(5)]
    resumed = [
        b async for b in art.trajectory_group_batches(coros, batch_size=2, skip_batches=1, pbar_desc=None)
    ]
    assert sorted(started) == [2, 3, 4] and sum(len(b) for b in resumed) == 3
    for skipped in coros[:2]:
        skipped.close()  # never started: the first batch was skipped

    failing = [art.TrajectoryGroup([rollout(1, fail=True), rollout(2)]) for _ in range(2)]
    with pytest.raises(TooManyRolloutErrors, match="max_batch_exceptions=1"):
        async for _ in art.trajectory_group_batches(
            failing, batch_size=2, max_batch_exceptions=1, pbar_desc=None
        ):
            pass


def test_iterate_dataset_covers_each_epoch_and_resumes_where_it_stopped() -> None:
    data = list("abcde")
    full = list(iterate_dataset(data, groups_per_step=2, num_epochs=2, use_tqdm=False))
    assert [b.step for b in full] == [0, 1, 2, 3, 4, 5]
    assert [(b.epoch, b.epoch_step) for b in full][2:4] == [(0, 2), (1, 0)]
    for epoch in (0, 1):
        assert sorted(i for b in full if b.epoch == epoch for i in b.items) == data
    resumed = list(iterate_dataset(data, groups_per_step=2, num_epochs=2, initial_step=4, use_tqdm=False))
    assert resumed == full[4:]
    items, epoch, step, epoch_step = resumed[0]  # ART 0.3's tuple form
    assert (items, epoch, step, epoch_step) == (full[4].items, 1, 4, 1)
    assert list(iterate_dataset([], use_tqdm=False)) == []


def test_art_import_paths_resolve() -> None:
    from dgrpo.local import LocalBackend as Local
    from dgrpo.rewards import ruler_score_group as score
    from dgrpo.trajectories import History, get_messages
    from dgrpo.types import Messages, MessagesAndChoices, Tools, TrainConfig
    from dgrpo.utils import iterate_dataset as iterate

    assert (art.LocalBackend, art.rewards.ruler_score_group, art.utils.iterate_dataset) == (
        Local,
        score,
        iterate,
    )
    assert (art.History, art.Messages, art.MessagesAndChoices, art.Tools) == (
        History,
        Messages,
        MessagesAndChoices,
        Tools,
    )
    assert art.TrainConfig is TrainConfig and art.trajectories.get_messages is get_messages
    assert get_messages([{"role": "user", "content": "hi"}]) == [{"role": "user", "content": "hi"}]
