"""The pieces one GRPO step's chain is made of: advantages -> [sleep] -> train -> publish -> [wake] -> reload.

``TrainStep`` (workflows/train_step.py), ``TrainSFT``, ``TrainingRun`` in sync and pipelined mode
(workflows/pipeline.py) and the servable-first chain (workflows/servable.py) are built from these, so each
piece is written once: where a step is published (on the trainer that staged it, trained again when it
vanished), how the engine sleeps in mode ``shared``, how a checkpoint is reloaded.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Protocol, TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from schemas.activities import (
        AdvantagesInput,
        AdvantagesResult,
        CheckpointLookup,
        PublishInput,
        ReloadInput,
        ReloadResult,
        ServingControlInput,
        TrainInput,
        TrainResult,
    )
    from schemas.config import Scheduling
    from schemas.history_bounds import RETRAINS_AFTER_LOST_WORKER
    from schemas.layout import worker_task_queue
    from schemas.refs import AdapterRef, CheckpointRef
    from schemas.run_state import TrainSFTInput, TrainStepInput

from workflows.stages import (
    ADVANTAGES,
    LATEST_CHECKPOINT,
    NO_LEARNING_SIGNAL,
    PUBLISH,
    RELOAD,
    SERVING_CONTROL,
    TRAIN,
    NoLearningSignal,
    Stage,
    StageFailed,
    is_lost_worker,
    is_staged_state_lost,
    run_stage,
    stage_failure,
)

PhaseCallback = Callable[[str], None]
T = TypeVar("T")


class PhaseClock:
    """Wall seconds per phase, measured with the workflow's deterministic clock."""

    def __init__(self, on_phase: PhaseCallback | None = None) -> None:
        self.seconds: dict[str, float] = {}
        self._on_phase = on_phase
        self._phase: str | None = None
        self._since: datetime | None = None

    def enter(self, phase: str) -> None:
        self.stop()
        self._phase, self._since = phase, workflow.now()
        if self._on_phase is not None:
            self._on_phase(phase)

    def stop(self) -> None:
        if self._phase is not None and self._since is not None:
            elapsed = (workflow.now() - self._since).total_seconds()
            self.seconds[self._phase] = self.seconds.get(self._phase, 0.0) + elapsed
        self._phase = self._since = None


async def step_advantages(inp: TrainStepInput, clock: PhaseClock) -> AdvantagesResult:
    """The step's advantages (control queue)."""
    clock.enter("advantages")
    return await run_stage(
        ADVANTAGES,
        AdvantagesInput(run_id=inp.run_id, step=inp.step, trajectories=inp.trajectories, train=inp.train),
        task_queue=inp.task_queues.control,
        step=inp.step,
        scheduling=inp.scheduling,
        heartbeat_s=inp.heartbeat_timeout_s,
        result_type=AdvantagesResult,
    )


@asynccontextmanager
async def engine_asleep(inp: TrainStepInput, clock: PhaseClock) -> AsyncIterator[None]:
    """Mode ``shared``: the inference engine sleeps while the block trains, and wakes in every outcome (a failure
    of the block is what is raised). Other modes: nothing."""
    if not inp.shared_device:
        yield
        return
    clock.enter("sleep")
    await run_stage(
        SERVING_CONTROL,
        ServingControlInput(action="sleep"),
        task_queue=inp.task_queues.inference,
        step=inp.step,
        scheduling=inp.scheduling,
        heartbeat_s=inp.heartbeat_timeout_s,
    )
    try:
        yield
    except BaseException:
        try:
            await wake_up(inp, clock)
        except StageFailed as err:
            workflow.logger.warning("step %d: waking the server after the failure failed: %s", inp.step,
                                    err.message)  # fmt: skip
        raise
    await wake_up(inp, clock)


async def wake_up(inp: TrainStepInput | TrainSFTInput, clock: PhaseClock) -> None:
    clock.enter("wake_up")
    await run_stage(
        SERVING_CONTROL, ServingControlInput(action="wake_up"), task_queue=inp.task_queues.inference,
        step=inp.step, scheduling=inp.scheduling, heartbeat_s=inp.heartbeat_timeout_s,
    )  # fmt: skip


async def reload_checkpoint(
    inp: TrainStepInput | TrainSFTInput, checkpoint: CheckpointRef | AdapterRef, clock: PhaseClock
) -> ReloadResult:
    """Load ``checkpoint`` (servable or resumable) into the inference servers."""
    clock.enter("reload")
    return await run_stage(
        RELOAD,
        ReloadInput(
            model_name=inp.model.name,
            checkpoint=checkpoint,
            serving=inp.serving,
            lora_rank=inp.model.lora.rank,
            shared=inp.shared_device,
            chat_template=inp.model.chat_template is not None
            or (isinstance(inp, TrainStepInput) and inp.chat_template_ref is not None),
        ),
        task_queue=inp.task_queues.inference,
        step=checkpoint.step,
        scheduling=inp.scheduling,
        heartbeat_s=inp.heartbeat_timeout_s,
        result_type=ReloadResult,
    )


async def serve_checkpoint(
    inp: TrainStepInput | TrainSFTInput, checkpoint: CheckpointRef, clock: PhaseClock
) -> str:
    """Load ``checkpoint`` into the inference servers; returns the adapter name it is served under."""
    return (await reload_checkpoint(inp, checkpoint, clock)).adapter


async def train_and_publish(
    inp: TrainStepInput, advantages: AdvantagesResult, clock: PhaseClock
) -> tuple[TrainResult, CheckpointRef]:
    """Train the step, then publish it whole from the worker that holds it; train again if that worker died."""
    return await trained_and_published(inp, advantages, clock, PUBLISH, CheckpointRef)


async def trained_and_published(
    inp: TrainStepInput, advantages: AdvantagesResult, clock: PhaseClock, stage: Stage, result_type: type[T]
) -> tuple[TrainResult, T]:
    """Train the step, then publish it (``stage``) from the worker that holds it; train again if that worker
    died."""

    async def train() -> TrainResult:
        return await run_stage(
            TRAIN,
            TrainInput(
                run_id=inp.run_id,
                step=inp.step,
                model=inp.model,
                advantages=advantages.ref,
                train=inp.train,
                start_from=inp.start_from,
                chat_template_ref=inp.chat_template_ref,
            ),
            task_queue=inp.task_queues.trainer,
            step=inp.step,
            scheduling=inp.scheduling,
            heartbeat_s=inp.heartbeat_timeout_s,
            result_type=TrainResult,
        )

    return await staged_and_published(
        inp,
        clock,
        train,
        lambda trained: {"loss": trained.loss, "grad_norm": trained.grad_norm},
        "training again",
        stage=stage,
        result_type=result_type,
    )


class Staged(Protocol):
    """A trainer activity's result: the step it staged, and the trainer worker that holds it."""

    @property
    def staging_dir(self) -> str: ...

    @property
    def worker_id(self) -> str: ...


StagedT = TypeVar("StagedT", bound=Staged)


async def staged_and_published(
    inp: TrainStepInput | TrainSFTInput,
    clock: PhaseClock,
    train: Callable[[], Awaitable[StagedT]],
    metrics: Callable[[StagedT], dict[str, float]],
    again: str,
    *,
    stage: Stage,
    result_type: type[T],
) -> tuple[StagedT, T]:
    """``train`` the step (a GRPO or an SFT training), then publish what it staged (``stage``: ``PUBLISH``, whole,
    or ``PUBLISH_ADAPTER``, the adapter first) on the worker that holds it, with ``metrics`` of the training;
    ``train`` again (saying ``again``) when that worker vanished before publishing, up to
    ``RETRAINS_AFTER_LOST_WORKER`` times."""
    for attempt in range(RETRAINS_AFTER_LOST_WORKER + 1):
        clock.enter("train")
        trained = await train()
        clock.enter("publish")
        publish = PublishInput(
            run_id=inp.run_id, step=inp.step, staging_dir=trained.staging_dir, metrics=metrics(trained)
        )
        published = await on_its_trainer(
            stage,
            publish,
            trained.worker_id,
            inp.task_queues.trainer,
            inp.scheduling,
            inp.heartbeat_timeout_s,
            result_type,
            lost_ok=attempt < RETRAINS_AFTER_LOST_WORKER,
        )
        if published is not None:
            return trained, published
        workflow.logger.warning(
            "step %d: trainer %s vanished before publishing; %s", inp.step, trained.worker_id, again
        )
    raise AssertionError("unreachable: the loop returns or raises")


async def publish_on_its_trainer(
    publish: PublishInput,
    worker_id: str,
    trainer_queue: str,
    scheduling: Scheduling,
    heartbeat_s: float,
    *,
    lost_ok: bool,
) -> CheckpointRef | None:
    """Publish a staged step on the trainer worker that staged it (its own task queue): resumable. None when that
    worker vanished before publishing and ``lost_ok`` (the caller trains the step again); any other final
    failure, or a lost worker when not ``lost_ok``, is the step's ``StageFailed``."""
    return await on_its_trainer(
        PUBLISH, publish, worker_id, trainer_queue, scheduling, heartbeat_s, CheckpointRef, lost_ok=lost_ok
    )


async def on_its_trainer(
    stage: Stage,
    publish: PublishInput,
    worker_id: str,
    trainer_queue: str,
    scheduling: Scheduling,
    heartbeat_s: float,
    result_type: type[T],
    *,
    lost_ok: bool,
) -> T | None:
    """Run ``stage`` (a publish) on the trainer worker that staged the step, as ``publish_on_its_trainer``; a
    worker started again without the staged step (``StagedStateLost``) has vanished too."""
    try:
        return await run_stage(
            stage,
            publish,
            task_queue=worker_task_queue(trainer_queue, worker_id),
            step=publish.step,
            scheduling=scheduling,
            heartbeat_s=heartbeat_s,
            result_type=result_type,
            reraise=True,
        )
    except ActivityError as err:
        if lost_ok and (is_lost_worker(err) or is_staged_state_lost(err)):
            return None
        raise stage_failure(stage, publish.step, err) from err


def no_learning_signal(step: int, n_groups: int) -> NoLearningSignal:
    return NoLearningSignal(
        f"step {step}: no learning signal: in all {n_groups} groups every rollout got the same reward; use a "
        "larger group_size or a finer-grained reward",
        type=NO_LEARNING_SIGNAL,
        non_retryable=True,
    )


async def latest_checkpoint(
    run_id: str, trainer_queue: str, step: int, scheduling: Scheduling, heartbeat_s: float | None = None
) -> CheckpointRef | None:
    return await run_stage(
        LATEST_CHECKPOINT,
        CheckpointLookup(run_id=run_id),
        task_queue=trainer_queue,
        step=step,
        scheduling=scheduling,
        heartbeat_s=heartbeat_s,
        result_type=CheckpointRef | None,  # type: ignore[arg-type]
    )
