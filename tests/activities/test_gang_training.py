"""A trainer over ranks (activities/gang/) trains what one device trains: the same data, the same adapter, optimizer
state, loss and metrics within fp32 rounding (real rank processes on gloo, real S3, the tiny Qwen3 shape).

One device trains steps 1-3 of a run (today's ``TrainerActivities``). Two ranks under FSDP train step 1 from their
own checkpoint 0 and step 2 from what the ranks hold; one device trains step 2 again from the 2-rank checkpoint 1,
and two replicated ranks train step 3 from the one-device checkpoint 2 (resumed at another world size, each way);
the FSDP gang also fine-tunes a step of chat examples. Each step equals the one-device step from the same start.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from activities import sft, trajectory_store
from activities.advantages import compute_step_advantages
from activities.gang.activities import GangTrainerActivities
from activities.object_store import ObjectStore
from activities.state_files import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from activities.tokenize import build_sequences
from activities.trainer import Trainer
from activities.training import TrainerActivities
from schemas import layout
from schemas.activities import InitialAdapterInput, PublishInput, SftConfig, SftInput, TrainInput, TrainResult
from schemas.config import LoraConfig, ModelSpec, TrainConfig
from schemas.refs import CheckpointRef, ObjectRef
from schemas.settings import ENV_CPU_SHARE_DIR, GangSettings
from schemas.trajectory import Choice, ChoiceLogprobs, TokenLogprob, Trajectory, TrajectoryGroup
from tests.gang_checks import step_differences

CONFIG = TrainConfig(learning_rate=5e-3, micro_batch_size=2, epochs=2, kl_coef=0.05)
"""Two epochs (two updates a step, the optimizer state carried between), micro-batches of 2 (accumulation, and
ranks with fewer micro-batches than others), a KL term (a forward with the adapter off)."""
UPDATE_BOUND = 2 * CONFIG.epochs * CONFIG.learning_rate
"""The most one weight may differ: two updates' worth (tests/gang_checks.py says why any may)."""
NUMBERS_RTOL = 1e-4
"""The step's loss and metrics (ART's names): the last epoch's, after the first epoch's update, so as near as
the weights are."""
GROUP_SIZES = (4, 3, 1)
"""Groups of unequal sizes: the ranks' shares differ in sequences and micro-batches."""


def spec(base: Path) -> ModelSpec:
    return ModelSpec(name="m", base_model=str(base), lora=LoraConfig(rank=8, alpha=16))


def step_groups(trainer: Trainer, seed: int) -> list[TrajectoryGroup]:
    """Random prompts and completions whose sampling logprobs are the policy's, nudged (ratios off 1)."""
    rng = random.Random(seed)
    groups = []
    for size in GROUP_SIZES:
        prompt = [rng.randrange(100, 20000) for _ in range(rng.randrange(8, 16))]
        trajectories = []
        for _ in range(size):
            completion = [rng.randrange(100, 20000) for _ in range(rng.randrange(4, 12))]
            choice = Choice(
                message={"role": "assistant", "content": ""}, token_ids=completion, prompt_token_ids=prompt
            )
            seqs = build_sequences([Trajectory(messages_and_choices=[choice])], [0.0], 64).sequences
            policy = trainer.sequence_logprobs(seqs)[0][len(prompt) - 1 :]
            logprobs = [
                TokenLogprob(token="x", logprob=min(0.0, v + 0.05 * rng.uniform(-1, 1))) for v in policy
            ]
            choice = choice.model_copy(update={"logprobs": ChoiceLogprobs(content=logprobs)})
            trajectories.append(Trajectory(messages_and_choices=[choice], reward=rng.random()))
        groups.append(TrajectoryGroup(trajectories))
    return groups


def train(acts: TrainerActivities, run_id: str, model: ModelSpec, advantages: ObjectRef, step: int,
          start: CheckpointRef) -> tuple[TrainResult, CheckpointRef]:  # fmt: skip
    inp = TrainInput(
        run_id=run_id, step=step, model=model, advantages=advantages, train=CONFIG, start_from=start
    )
    result = acts.train_sync(inp, micro_batch=CONFIG.micro_batch_size)
    published = acts.publish_sync(PublishInput(run_id=run_id, step=step, staging_dir=result.staging_dir))
    return result, published


def assert_same_step(got: str, want: str, got_result: object = None, want_result: object = None) -> None:
    """Two staged steps: the same adapter and optimizer state within fp32 rounding, and the same numbers."""
    distance = step_differences(got, want, UPDATE_BOUND)
    print(distance)
    assert not distance.problems, distance
    assert distance.moved > 1e-3  # the step trained (B starts at 0)
    if isinstance(got_result, TrainResult) and isinstance(want_result, TrainResult):
        assert got_result.n_sequences == want_result.n_sequences
        assert got_result.n_trainable_tokens == want_result.n_trainable_tokens
        assert got_result.loss == pytest.approx(want_result.loss, rel=NUMBERS_RTOL)
        for name, value in {"grad_norm": want_result.grad_norm, **want_result.metrics}.items():
            got_value = got_result.grad_norm if name == "grad_norm" else got_result.metrics[name]
            assert got_value == pytest.approx(value, rel=NUMBERS_RTOL, abs=1e-6), name


def assert_same_fine_tuning(
    store: ObjectStore, model: ModelSpec, one: TrainerActivities, gang: GangTrainerActivities
) -> None:
    """A fine-tuning step of chat examples (two batches, micro-batches of 1) on ``gang`` as on ``one`` device."""
    chats = [[{"role": "user", "content": f"Say {word}."}, {"role": "assistant", "content": word}]
             for word in ("apple", "pear", "plum", "fig", "kiwi")]  # fmt: skip
    data = "\n".join(sft.example_line(chat, None) for chat in chats).encode()
    examples = store.put_bytes(layout.sft_examples_key(f"sft-{gang.worker_id}", 1), data)
    config = SftConfig(learning_rates=[1e-2, 1e-2], batch_size=3, micro_batch_size=1)
    results = []
    for acts in (one, gang):
        run_id = f"sft-{acts.worker_id}-{gang.worker_id}"
        first = acts.publish_initial_sync(InitialAdapterInput(run_id=run_id, model=model, seed=3))
        inp = SftInput(run_id=run_id, step=1, model=model, examples=examples, sft=config, start_from=first)
        results.append(acts.train_sft_sync(inp, micro_batch=1))
        acts.publish_sync(PublishInput(run_id=run_id, step=1, staging_dir=results[-1].staging_dir))
    alone, ranked = results
    assert ranked.losses == pytest.approx(alone.losses, abs=1e-6)
    assert ranked.grad_norms == pytest.approx(alone.grad_norms, rel=1e-5)
    assert_same_step(ranked.staging_dir, alone.staging_dir)


@pytest.fixture
def one_thread(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """One thread in this process (the one-device trainer) as in each rank: float sums in a fixed order."""
    monkeypatch.setenv(ENV_CPU_SHARE_DIR, "off")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_two_ranks_train_what_one_device_trains_and_resume_at_another_world_size(
    object_store: ObjectStore, tmp_path: Path, tiny_qwen3: Path, one_thread: None
) -> None:
    model = spec(tiny_qwen3)
    one = TrainerActivities(object_store, tmp_path / "one", "one")
    start = one.publish_initial_sync(InitialAdapterInput(run_id="one", model=model, seed=7))
    reference = one.trainer_for(model, "fp32")
    refs = {}
    for step in (1, 2, 3):
        adv = compute_step_advantages(step_groups(reference, seed=step), CONFIG)
        key = layout.advantages_key("data", step)
        refs[step] = trajectory_store.upload_groups(object_store, adv.groups, "data", step, key=key,
                                                    advantages=adv.advantages).ref  # fmt: skip
    want: dict[int, TrainResult] = {}
    published = {0: start}
    for step in (1, 2, 3):
        want[step], published[step] = train(one, "one", model, refs[step], step, published[step - 1])

    fsdp = GangTrainerActivities(object_store, tmp_path / "fsdp", GangSettings(ranks=2), "fsdp")
    try:
        start = fsdp.publish_initial_sync(InitialAdapterInput(run_id="fsdp", model=model, seed=7))
        ours, theirs = tmp_path / "checkpoint-0", tmp_path / "one-checkpoint-0"
        object_store.get_checkpoint(start, ours)
        object_store.get_checkpoint(published[0], theirs)
        # made without the ranks or the base's weights, yet the one device's own, bit for bit
        assert (
            load_file(f"{ours}/{ADAPTER_WEIGHTS}").keys() == load_file(f"{theirs}/{ADAPTER_WEIGHTS}").keys()
        )
        for key, tensor in load_file(f"{theirs}/{ADAPTER_WEIGHTS}").items():
            assert torch.equal(load_file(f"{ours}/{ADAPTER_WEIGHTS}")[key], tensor), key
        assert (ours / ADAPTER_CONFIG).read_text() == (theirs / ADAPTER_CONFIG).read_text()
        got, first = train(fsdp, "fsdp", model, refs[1], 1, start)
        assert_same_step(got.staging_dir, want[1].staging_dir, got, want[1])
        assert fsdp.world_size == 2
        assert 0.45 < fsdp.local.base_fraction < 0.55  # each rank holds half the frozen base
        got, _ = train(fsdp, "fsdp", model, refs[2], 2, first)
        assert not (fsdp.staging_root / "fsdp" / ".inputs" / layout.step_name(1)).exists()  # from memory
        # One device resumes the 2-rank checkpoint 1: the same step 2.
        resumed = TrainerActivities(object_store, tmp_path / "resumed", "resumed")
        again, _ = train(resumed, "fsdp", model, refs[2], 2, first)
        assert_same_step(got.staging_dir, again.staging_dir, got, again)

        # Fine-tuning on chat examples, on the same gang, as one device does it.
        assert_same_fine_tuning(object_store, model, one, fsdp)
    finally:
        fsdp.close()

    # Two replicated ranks resume the one-device checkpoint 2: the same step 3.
    replicated = GangTrainerActivities(
        object_store, tmp_path / "rep", GangSettings(ranks=2, shard="replicate"), "rep"
    )
    try:
        got, _ = train(replicated, "one", model, refs[3], 3, published[2])
        assert_same_step(got.staging_dir, want[3].staging_dir, got, want[3])
        assert replicated.local.base_fraction == 1.0
    finally:
        replicated.close()
