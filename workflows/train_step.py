"""``TrainStep``: advantages -> train -> publish -> reload, the chain one GRPO step runs after scoring.

The ART-style client's ``model.train`` runs it as a workflow; ``TrainingRun`` calls ``train_and_serve``
inline for each of its sync steps, so the chain is written once (its pieces: workflows/step_chain.py). Since
``servable-before-resumable`` the adapter is served before the rest of the checkpoint is written
(workflows/servable.py); ``TrainStep`` still returns once the checkpoint is resumable.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from schemas.activities import AdvantagesResult, InitialAdapterInput, RepublishInput
    from schemas.errors import CONFIG_ERROR
    from schemas.refs import CheckpointRef
    from schemas.run_state import TrainStepInput, TrainStepResult

from workflows.servable import SERVABLE_PATCH, train_and_serve_adapter, until_resumable
from workflows.stages import PUBLISH_INITIAL, REPUBLISH, NoLearningSignal, StageFailed, run_stage
from workflows.step_chain import (
    PhaseCallback,
    PhaseClock,
    engine_asleep,
    latest_checkpoint,
    no_learning_signal,
    reload_checkpoint,
    serve_checkpoint,
    step_advantages,
    train_and_publish,
)

ADVANCE_WITHOUT_SIGNAL_PATCH = "train-step-advance-without-signal"
"""Marks histories whose untrained step (no group's rewards differ) was republished rather than failed."""


async def train_and_serve(
    inp: TrainStepInput, on_phase: PhaseCallback | None = None, *, servable_first: bool = False
) -> TrainStepResult:
    """advantages -> [sleep] -> train -> publish -> [wake] -> reload, the step resumable when it returns;
    ``inp.start_from`` must be resolved. ``servable_first`` (``servable-before-resumable``): the adapter is
    published and reloaded before the rest is written (trained again if its trainer vanished in between)."""
    clock = PhaseClock(on_phase)
    advantages = await step_advantages(inp, clock)
    if advantages.n_trajectories == 0:
        if inp.advance_without_signal and workflow.patched(ADVANCE_WITHOUT_SIGNAL_PATCH):
            return await advance_untrained(inp, advantages, clock)
        raise no_learning_signal(inp.step, advantages.n_groups)
    if servable_first:
        served = await train_and_serve_adapter(inp, advantages, clock)
        reloaded = await until_resumable(served, clock) or served.reloaded
        assert served.checkpoint is not None
        trained, checkpoint = served.trained, served.checkpoint
    else:
        async with engine_asleep(inp, clock):
            trained, checkpoint = await train_and_publish(inp, advantages, clock)
        reloaded = await reload_checkpoint(inp, checkpoint, clock)
    clock.stop()
    return TrainStepResult(
        step=inp.step,
        checkpoint=checkpoint,
        adapter=reloaded.adapter,
        adapter_sha256=reloaded.adapter_sha256,
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
            result = await train_and_serve(
                inp, self._set_phase, servable_first=workflow.patched(SERVABLE_PATCH)
            )
        except (StageFailed, NoLearningSignal):
            self._phase = "failed"
            raise
        self._phase = "done"
        return result
