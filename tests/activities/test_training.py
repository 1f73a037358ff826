"""The trainer: training-forward logprobs agree with sampling logprobs, and resume is exact (real S3)."""

from __future__ import annotations

import concurrent.futures
import gc
import logging
import math
import random
import time
from collections.abc import Callable

import pytest
import torch

from activities import trajectory_store
from activities.checkpoints import OomState, adapter_ref
from activities.tokenize import build_sequences
from activities.trainer import Trainer
from activities.training import TrainerActivities, next_micro_batch
from bench.local_sampling import max_sampling_logprob_gap, sample_choices
from schemas import layout
from schemas.activities import InitialAdapterInput, PublishInput, StagedRef, TrainInput
from schemas.config import LoraConfig, ModelSpec, TrainConfig
from schemas.errors import StagedStateLostError
from schemas.settings import ENV_CPU_SHARE_DIR
from schemas.trajectory import Choice, ChoiceLogprobs, TokenLogprob, Trajectory, TrajectoryGroup
from tests.cpu_neighbour import Neighbour

log = logging.getLogger(__name__)
MODEL = ModelSpec(name="m", base_model="smollm2-135m-instruct", lora=LoraConfig(rank=8, alpha=16))


def test_training_forward_logprobs_match_sampling_logprobs(trainer):
    prompts = [
        [{"role": "user", "content": "Name a colour."}],
        [{"role": "user", "content": "What is 2 + 2? Answer briefly."}],
    ]
    choices = sample_choices(trainer.model, trainer.tokenizer, prompts, 2, 12, seed=0)
    trajs = [Trajectory(messages_and_choices=[c]) for c in choices]
    step = build_sequences(trajs, [1.0] * len(trajs), max_seq_len=512)
    assert len({len(c.prompt_token_ids) for c in choices}) > 1  # left padding was exercised

    fp32 = max_sampling_logprob_gap(trainer, step.sequences)
    trainer.precision = "bf16"
    try:
        bf16 = max_sampling_logprob_gap(trainer, step.sequences)
    finally:
        trainer.precision = "fp32"
    log.warning("max |training - sampling| logprob per token: fp32 %.2e, bf16 autocast %.2e", fp32, bf16)
    assert fp32 < 1e-4
    assert bf16 > fp32  # bf16 autocast is the noisy one (issue: up to ~0.2 per token)


def synthetic_groups(trainer: Trainer, n_groups: int, size: int, seed: int) -> list[TrajectoryGroup]:
    """Random prompts/completions with the current policy's logprobs as sampling logprobs."""
    rng = random.Random(seed)
    groups = []
    for _ in range(n_groups):
        trajs = []
        for _ in range(size):
            prompt = [rng.randrange(100, 20000) for _ in range(rng.randrange(8, 16))]
            completion = [rng.randrange(100, 20000) for _ in range(rng.randrange(4, 12))]
            trajs.append((prompt, completion, rng.random()))
        groups.append(trajs)
    seqs = build_sequences(
        [
            Trajectory(
                messages_and_choices=[
                    Choice(message={"role": "assistant", "content": ""}, token_ids=c, prompt_token_ids=p)
                ]
            )
            for g in groups
            for p, c, _ in g
        ],
        [0.0] * (n_groups * size),
        max_seq_len=64,
    ).sequences
    lps = iter(trainer.sequence_logprobs(seqs))
    out = []
    for g in groups:
        trajs = []
        for p, c, r in g:
            lp = next(lps)[len(p) - 1 :]
            choice = Choice(
                message={"role": "assistant", "content": ""},
                token_ids=c,
                prompt_token_ids=p,
                logprobs=ChoiceLogprobs(content=[TokenLogprob(token="x", logprob=v) for v in lp]),
            )
            trajs.append(Trajectory(messages_and_choices=[choice], reward=r))
        out.append(TrajectoryGroup(trajs))
    return out


def test_next_micro_batch_halves_after_an_oom_down_to_one():
    assert next_micro_batch(8, None, None) == 8
    assert next_micro_batch(8, OomState(micro_batch_size=8, attempt=1), None) == 4
    assert next_micro_batch(8, None, {"micro_batch": 1, "of": 4, "oom_micro_batch_size": 4}) == 2
    assert next_micro_batch(8, OomState(micro_batch_size=1, attempt=4), None) == 1


def train_steps(acts: TrainerActivities, run_id: str, refs, steps: range, start, config: TrainConfig):
    """Train ``steps``, each published as a step is: its adapter first (servable), then the rest (resumable)."""
    for step in steps:
        result = acts.train_sync(
            TrainInput(
                run_id=run_id, step=step, model=MODEL, advantages=refs[step], train=config, start_from=start
            ),
            micro_batch=config.micro_batch_size,
        )
        publish = PublishInput(run_id=run_id, step=step, staging_dir=result.staging_dir)
        servable = acts.publish_adapter_sync(publish)  # from memory, as the trainer serialized it
        start = acts.publish_sync(publish)
        assert (
            adapter_ref(acts.store, start)[0] == servable
        )  # the adapter the servers load is the one resumed
    return start


def after_one_update(acts: TrainerActivities) -> Callable[[], bool]:
    """A ``should_stop`` that stops a training once its optimizer has stepped (the model changed)."""
    seen: list[float] = []

    def should_stop() -> bool:
        optimizer = acts.trainer.optimizer if acts.trainer is not None else None
        steps = [float(s["step"]) for s in optimizer.state.values()] if optimizer is not None else []
        seen.append(max(steps, default=0.0))
        return seen[-1] > seen[0]

    return should_stop


def test_resume_from_published_checkpoint_or_from_a_staged_step_is_exact(
    object_store, tmp_path, trainer, monkeypatch: pytest.MonkeyPatch
):
    # One thread for every worker: a thread count that follows the host's other processes (CpuShare) changes the
    # order of float sums between the workers compared below to 1e-6.
    monkeypatch.setenv(ENV_CPU_SHARE_DIR, "off")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        resume_and_continue(object_store, tmp_path, trainer)
    finally:
        torch.set_num_threads(threads)


def resume_and_continue(object_store, tmp_path, trainer) -> None:
    from activities.advantages import compute_step_advantages

    config = TrainConfig(learning_rate=5e-3, micro_batch_size=3, epochs=2)
    trainer.init_adapter(seed=0)
    refs = {}
    for step in (1, 2, 3):
        groups = synthetic_groups(trainer, 2, 4, seed=step)
        adv = compute_step_advantages(groups, config)
        refs[step] = trajectory_store.upload_groups(
            object_store,
            adv.groups,
            "data",
            step,
            key=layout.advantages_key("data", step),
            advantages=adv.advantages,
        ).ref

    # Uninterrupted: one warm worker trains steps 1..3.
    a = TrainerActivities(object_store, tmp_path / "a", "worker-a")
    start = a.publish_initial_sync(InitialAdapterInput(run_id="run-a", model=MODEL, seed=7))
    train_steps(a, "run-a", refs, range(1, 4), start, config)
    assert a.trainer is not None
    want = a.trainer.adapter_state()
    del a
    gc.collect()
    # The same worker started again with its disk: its adapter goes up from the staged files, the same one.
    publish = PublishInput(run_id="run-a", step=3, staging_dir=str(tmp_path / "a" / "run-a" / "000003"))
    again = TrainerActivities(object_store, tmp_path / "a", "worker-a").publish_adapter_sync(publish)
    assert again == adapter_ref(object_store, object_store.latest_checkpoint("run-a"))[0]

    # Interrupted: train 1..2, drop the worker (trainer, optimizer and all), resume from S3 on a new one.
    b = TrainerActivities(object_store, tmp_path / "b", "worker-b")
    start = b.publish_initial_sync(InitialAdapterInput(run_id="run-b", model=MODEL, seed=7))
    train_steps(b, "run-b", refs, range(1, 3), start, config)
    del b
    gc.collect()
    c = TrainerActivities(object_store, tmp_path / "c", "worker-c")
    latest = object_store.latest_checkpoint("run-b")
    assert latest is not None and latest.step == 2
    train_steps(c, "run-b", refs, range(3, 4), latest, config)
    got = c.trainer.adapter_state()
    # Publishing again (a retried publish) reuses the complete checkpoint with the same files.
    staged = tmp_path / "c" / "run-b" / "000003"
    again = c.publish_sync(PublishInput(run_id="run-b", step=3, staging_dir=str(staged)))
    assert again == object_store.latest_checkpoint("run-b")

    assert want.keys() == got.keys()
    moved = 0.0
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=1e-6, atol=1e-7)
        if "lora_B" in key:  # zero at init: only training moves it
            moved = max(moved, float(want[key].abs().max()))
    assert 1e-4 < moved < math.inf

    # Pipelined: each step continues from the one this worker staged, which is published beside it (from inside
    # its training, which holds the model); step 3's first attempt fails after changing the model, and its retry
    # continues from step 2's staged files.
    d = TrainerActivities(object_store, tmp_path / "d", "worker-d")
    start = d.publish_initial_sync(InitialAdapterInput(run_id="run-d", model=MODEL, seed=7))
    staged, staging_dir, published = None, "", {}

    def publish_beside(step: int) -> Callable[[], bool]:
        def should_stop() -> bool:
            if step > 1 and step - 1 not in published:
                publish = PublishInput(run_id="run-d", step=step - 1, staging_dir=staging_dir)
                pool = concurrent.futures.ThreadPoolExecutor(1)
                try:  # a publish that waits for this training fails the test here, after 60 s
                    published[step - 1] = pool.submit(d.publish_sync, publish).result(timeout=60)
                finally:
                    pool.shutdown(wait=False)
            return False

        return should_stop

    for step in (1, 2, 3):
        inp = TrainInput(run_id="run-d", step=step, model=MODEL, advantages=refs[step], train=config,
                         start_from=start if staged is None else None, continue_from=staged)  # fmt: skip
        if step == 3:
            with pytest.raises(InterruptedError):  # the attempt stops after its first epoch's update
                d.train_sync(inp, config.micro_batch_size, should_stop=after_one_update(d))
        result = d.train_sync(inp, config.micro_batch_size, should_stop=publish_beside(step))
        staged = StagedRef(run_id="run-d", step=step, worker_id="worker-d", staged_id=result.staged_id)
        staging_dir = result.staging_dir
    assert d.trainer is not None
    for key, value in d.trainer.adapter_state().items():
        torch.testing.assert_close(value, want[key], rtol=1e-6, atol=1e-7)
    assert object_store.latest_checkpoint("run-d") == published[2]

    # A staging this worker no longer holds (another staging of the step replaced it) is refused.
    lost = StagedRef(run_id="run-d", step=3, worker_id="worker-d", staged_id="another")
    inp = TrainInput(
        run_id="run-d", step=4, model=MODEL, advantages=refs[3], train=config, continue_from=lost
    )
    with pytest.raises(StagedStateLostError, match="no longer holds step 3"):
        d.train_sync(inp, micro_batch=config.micro_batch_size)


def test_a_steps_rest_is_written_once_asked_for_not_beside_its_adapters_reload(
    object_store, tmp_path, trainer, monkeypatch: pytest.MonkeyPatch
):
    """The optimizer and trainer state of a trained step are written once its publish (or the next staging) asks,
    not while its adapter, up already, is being reloaded on a host the trainer may share."""
    from activities import training
    from activities.advantages import compute_step_advantages

    monkeypatch.setattr(training, "REST_WAIT_S", 600.0)  # nothing but a request writes it during this test
    config = TrainConfig(learning_rate=5e-3, micro_batch_size=4)
    refs = {}
    for step in (1, 2):
        adv = compute_step_advantages(synthetic_groups(trainer, 2, 4, seed=step), config)
        refs[step] = trajectory_store.upload_groups(object_store, adv.groups, "rest", step,
                                                    key=layout.advantages_key("rest", step),
                                                    advantages=adv.advantages).ref  # fmt: skip
    acts = TrainerActivities(object_store, tmp_path / "w", "worker-w")
    start = acts.publish_initial_sync(InitialAdapterInput(run_id="rest", model=MODEL, seed=7))
    first = acts.train_sync(TrainInput(run_id="rest", step=1, model=MODEL, advantages=refs[1], train=config,
                                       start_from=start), micro_batch=4)  # fmt: skip
    publish = PublishInput(run_id="rest", step=1, staging_dir=first.staging_dir)
    servable = acts.publish_adapter_sync(publish)
    staged = tmp_path / "w" / "rest" / "000001"
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        time.sleep(1.0)  # the rest's write takes milliseconds once it may start
        assert not staged.exists()  # servable, the rest not written
        resumable = acts.publish_sync(publish)  # asks for it
        assert object_store.latest_checkpoint("rest") == resumable
        assert adapter_ref(object_store, resumable)[0] == servable
        assert {"optimizer.safetensors", "trainer_state.json"} <= {p.name for p in staged.iterdir()}

        # Step 2, its rest never asked for: the next staging writes it, and its adapter does not queue behind it.
        second = acts.train_sync(TrainInput(run_id="rest", step=2, model=MODEL, advantages=refs[2], train=config,
                                            continue_from=StagedRef(run_id="rest", step=1, worker_id="worker-w",
                                                                    staged_id=first.staged_id)),
                                 micro_batch=4)  # fmt: skip
        third = acts.train_sync(TrainInput(run_id="rest", step=3, model=MODEL, advantages=refs[2], train=config,
                                           continue_from=StagedRef(run_id="rest", step=2, worker_id="worker-w",
                                                                   staged_id=second.staged_id)),
                                micro_batch=4)  # fmt: skip
        up = pool.submit(
            acts.publish_adapter_sync, PublishInput(run_id="rest", step=3, staging_dir=third.staging_dir)
        )
        assert up.result(timeout=60).step == 3  # a rest that held up the writer thread fails the test here
        assert (tmp_path / "w" / "rest" / "000002" / "trainer_state.json").is_file()
        assert acts.publish_sync(PublishInput(run_id="rest", step=3, staging_dir=third.staging_dir)).step == 3
    finally:
        for wanted in acts._wanted.values():  # a failed test leaves no write waiting for the process to end
            wanted.set()
        pool.shutdown(wait=False)


@pytest.mark.parametrize("neighbour_busy", [False, True])
def test_a_cpu_step_takes_its_share_of_the_cores_while_a_neighbour_works(
    tmp_path, monkeypatch: pytest.MonkeyPatch, neighbour_busy: bool
):
    """A CPU server busy on the same host (pipelined rollouts) halves the step's torch threads."""
    monkeypatch.setenv(ENV_CPU_SHARE_DIR, str(tmp_path))
    trainer = Trainer(MODEL)
    assert trainer.cpu_share is not None
    trainer.cpu_share.cores = 2
    trainer.init_adapter(seed=0)
    neighbour = Neighbour(tmp_path)
    seen: list[int] = []
    try:
        neighbour.say("busy" if neighbour_busy else "idle")
        seqs = build_sequences(
            [t for g in synthetic_groups(trainer, n_groups=2, size=2, seed=3) for t in g.trajectories],
            [1.0, -1.0, 0.5, -0.5],
            max_seq_len=64,
        ).sequences
        trainer.train_step(seqs, TrainConfig(), step=1, micro_batch_size=2, progress=lambda *_: seen.append(
            torch.get_num_threads()))  # fmt: skip
    finally:
        neighbour.kill()
    assert seen == ([1, 1] if neighbour_busy else [2, 2])
