"""``TrainStep``: advantages -> train -> publish -> reload, the chain one GRPO step runs after scoring.

The ART-style client's ``model.train`` runs it as a workflow; ``TrainingRun`` calls ``train_and_serve``
inline for each of its steps, so the chain is written once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Protocol, TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from schemas.activities import (
        AdvantagesInput,
        AdvantagesResult,
        CheckpointLookup,
        InitialAdapterInput,
        PublishInput,
        ReloadInput,
        ReloadResult,
        RepublishInput,
        ServingControlInput,
        TrainInput,
        TrainResult,
    )
    from schemas.config import Scheduling
    from schemas.errors import CONFIG_ERROR
    from schemas.history_bounds import RETRAINS_AFTER_LOST_WORKER
    from schemas.layout import worker_task_queue
    from schemas.refs import CheckpointRef
    from schemas.run_state import TrainSFTInput, TrainStepInput, TrainStepResult

from workflows.stages import (
    ADVANTAGES,
    LATEST_CHECKPOINT,
    NO_LEARNING_SIGNAL,
    PUBLISH,
    PUBLISH_INITIAL,
    RELOAD,
    REPUBLISH,
    SERVING_CONTROL,
    TRAIN,
    NoLearningSignal,
    StageFailed,
    is_lost_worker,
    run_stage,
    stage_failure,
)

PhaseCallback = Callable[[str], None]

ADVANCE_WITHOUT_SIGNAL_PATCH = "train-step-advance-without-signal"
"""Marks histories whose untrained step (no group's rewards differ) was republished rather than failed."""


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


async def serve_checkpoint(
    inp: TrainStepInput | TrainSFTInput, checkpoint: CheckpointRef, clock: PhaseClock
) -> str:
    """Load ``checkpoint`` into the inference servers; returns the adapter name it is served under."""
    clock.enter("reload")
    reloaded = await run_stage(
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
    return reloaded.adapter


async def train_and_publish(
    inp: TrainStepInput, advantages: AdvantagesResult, clock: PhaseClock
) -> tuple[TrainResult, CheckpointRef]:
    """Train the step, then publish it from the worker that holds it; train again if that worker died."""

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
) -> tuple[StagedT, CheckpointRef]:
    """``train`` the step (a GRPO or an SFT training), then publish what it staged on the worker that holds it,
    with ``metrics`` of the training; ``train`` again (saying ``again``) when that worker vanished before
    publishing, up to ``RETRAINS_AFTER_LOST_WORKER`` times."""
    for attempt in range(RETRAINS_AFTER_LOST_WORKER + 1):
        clock.enter("train")
        trained = await train()
        clock.enter("publish")
        publish = PublishInput(
            run_id=inp.run_id, step=inp.step, staging_dir=trained.staging_dir, metrics=metrics(trained)
        )
        checkpoint = await publish_on_its_trainer(
            publish,
            trained.worker_id,
            inp.task_queues.trainer,
            inp.scheduling,
            inp.heartbeat_timeout_s,
            lost_ok=attempt < RETRAINS_AFTER_LOST_WORKER,
        )
        if checkpoint is not None:
            return trained, checkpoint
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
    """Publish a staged step on the trainer worker that staged it (its own task queue). None when that worker
    vanished before publishing and ``lost_ok`` (the caller trains the step again); any other final failure, or a
    lost worker when not ``lost_ok``, is the step's ``StageFailed``."""
    try:
        return await run_stage(
            PUBLISH,
            publish,
            task_queue=worker_task_queue(trainer_queue, worker_id),
            step=publish.step,
            scheduling=scheduling,
            heartbeat_s=heartbeat_s,
            result_type=CheckpointRef,
            reraise=True,
        )
    except ActivityError as err:
        if lost_ok and is_lost_worker(err):
            return None
        raise stage_failure(PUBLISH, publish.step, err) from err


def no_learning_signal(step: int, n_groups: int) -> NoLearningSignal:
    return NoLearningSignal(
        f"step {step}: no learning signal: in all {n_groups} groups every rollout got the same reward; use a "
        "larger group_size or a finer-grained reward",
        type=NO_LEARNING_SIGNAL,
        non_retryable=True,
    )


async def train_and_serve(inp: TrainStepInput, on_phase: PhaseCallback | None = None) -> TrainStepResult:
    """advantages -> [sleep] -> train -> publish -> [wake] -> reload; ``inp.start_from`` must be resolved."""
    clock = PhaseClock(on_phase)
    queues = inp.task_queues
    clock.enter("advantages")
    advantages = await run_stage(
        ADVANTAGES,
        AdvantagesInput(run_id=inp.run_id, step=inp.step, trajectories=inp.trajectories, train=inp.train),
        task_queue=queues.control,
        step=inp.step,
        scheduling=inp.scheduling,
        heartbeat_s=inp.heartbeat_timeout_s,
        result_type=AdvantagesResult,
    )
    if advantages.n_trajectories == 0:
        if inp.advance_without_signal and workflow.patched(ADVANCE_WITHOUT_SIGNAL_PATCH):
            return await advance_untrained(inp, advantages, clock)
        raise no_learning_signal(inp.step, advantages.n_groups)
    if inp.shared_device:
        clock.enter("sleep")
        await run_stage(
            SERVING_CONTROL,
            ServingControlInput(action="sleep"),
            task_queue=queues.inference,
            step=inp.step,
            scheduling=inp.scheduling,
            heartbeat_s=inp.heartbeat_timeout_s,
        )
    try:
        trained, checkpoint = await train_and_publish(inp, advantages, clock)
    except BaseException:
        if inp.shared_device:  # the server wakes in every outcome; the training failure is what is raised
            try:
                await wake_up(inp, clock)
            except StageFailed as err:
                workflow.logger.warning("step %d: waking the server after the failure failed: %s", inp.step,
                                        err.message)  # fmt: skip
        raise
    if inp.shared_device:
        await wake_up(inp, clock)
    adapter = await serve_checkpoint(inp, checkpoint, clock)
    clock.stop()
    return TrainStepResult(
        step=inp.step,
        checkpoint=checkpoint,
        adapter=adapter,
        loss=trained.loss,
        n_trajectories=advantages.n_trajectories,
        n_groups_zero_variance=advantages.n_groups_zero_variance,
        seconds=clock.seconds,
        metrics=trained.metrics,
    )


async def advance_untrained(
    inp: TrainStepInput, advantages: AdvantagesResult, clock: PhaseClock
) -> TrainStepResult:
    """ART >= 0.4.4's skipped step: checkpoint ``step - 1`` published again as ``step`` and served."""
    clock.enter("publish")
    source = inp.start_from
    if source is None:  # a fresh LoRA's step 0, served as the base model until now: publish it first
        source = await run_stage(
            PUBLISH_INITIAL,
            InitialAdapterInput(run_id=inp.run_id, model=inp.model, seed=inp.train.seed),
            task_queue=inp.task_queues.trainer,
            step=0,
            scheduling=inp.scheduling,
            heartbeat_s=inp.heartbeat_timeout_s,
            result_type=CheckpointRef,
        )
    workflow.logger.warning(
        "step %d: no group of the %d has rewards that differ; nothing trained, checkpoint %d served as step %d",
        inp.step, advantages.n_groups, source.step, inp.step,
    )  # fmt: skip
    checkpoint = await run_stage(
        REPUBLISH,
        RepublishInput(source=source, step=inp.step),
        task_queue=inp.task_queues.trainer,
        step=inp.step,
        scheduling=inp.scheduling,
        heartbeat_s=inp.heartbeat_timeout_s,
        result_type=CheckpointRef,
    )
    adapter = await serve_checkpoint(inp, checkpoint, clock)
    clock.stop()
    return TrainStepResult(
        step=inp.step,
        checkpoint=checkpoint,
        adapter=adapter,
        n_groups_zero_variance=advantages.n_groups_zero_variance,
        trained=False,
        seconds=clock.seconds,
    )


async def wake_up(inp: TrainStepInput | TrainSFTInput, clock: PhaseClock) -> None:
    clock.enter("wake_up")
    await run_stage(
        SERVING_CONTROL, ServingControlInput(action="wake_up"), task_queue=inp.task_queues.inference,
        step=inp.step, scheduling=inp.scheduling, heartbeat_s=inp.heartbeat_timeout_s,
    )  # fmt: skip


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


@workflow.defn(name="TrainStep", failure_exception_types=[ValidationError])
class TrainStep:
    """One durable ``model.train`` call; idempotent per (run, step): a finished step is only served again."""

    def __init__(self) -> None:
        self._phase = "starting"

    @workflow.query
    def phase(self) -> str:
        return self._phase

    def _set_phase(self, phase: str) -> None:
        self._phase = phase

    @workflow.run
    async def run(self, inp: TrainStepInput) -> TrainStepResult:
        if inp.start_from is None:
            newest = await latest_checkpoint(
                inp.run_id, inp.task_queues.trainer, inp.step, inp.scheduling, inp.heartbeat_timeout_s
            )
            if newest is not None and newest.step == inp.step:
                # A retried call whose step already finished: serve it, do not train twice.
                adapter = await serve_checkpoint(inp, newest, PhaseClock(self._set_phase))
                self._phase = "done"
                return TrainStepResult(step=inp.step, checkpoint=newest, adapter=adapter, skipped=True)
            newest_step = -1 if newest is None else newest.step
            if newest_step > inp.step or (
                newest_step < inp.step - 1 and not (newest is None and inp.step == 1)
            ):
                raise ApplicationError(
                    f"cannot train step {inp.step} of run {inp.run_id!r}: its newest checkpoint is step "
                    f"{newest_step if newest else 'none'}; train step {newest_step + 1} next",
                    type=CONFIG_ERROR,
                    non_retryable=True,
                )
            inp = inp.model_copy(update={"start_from": newest})
        try:
            result = await train_and_serve(inp, self._set_phase)
        except (StageFailed, NoLearningSignal):
            self._phase = "failed"
            raise
        self._phase = "done"
        return result
