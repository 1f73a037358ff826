"""``TrainSFT``: one durable ``model.train_sft`` call: [sleep] -> fine-tune -> publish -> [wake] -> reload.

It produces checkpoint ``step`` from ``step - 1`` as a GRPO step does (``workflows/train_step.py``), with the
same publish, reload and retries, so an SFT warm start and the RL steps after it share one run and one step
counter. A call whose step is already published only serves it again.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from schemas.activities import (
        ServingControlInput,
        SftInput,
        SftResult,
    )
    from schemas.errors import CONFIG_ERROR
    from schemas.refs import CheckpointRef
    from schemas.run_state import TrainSFTInput, TrainSFTResult

from workflows.stages import (
    PUBLISH,
    SERVING_CONTROL,
    TRAIN_SFT,
    StageFailed,
    run_stage,
)
from workflows.step_chain import (
    PhaseClock,
    latest_checkpoint,
    serve_checkpoint,
    staged_and_published,
    wake_up,
)


async def fine_tune_and_publish(
    inp: TrainSFTInput, start_from: CheckpointRef | None, clock: PhaseClock
) -> tuple[SftResult, CheckpointRef]:
    """Fine-tune, then publish from the worker that holds the result; fine-tune again if that worker died."""

    async def fine_tune() -> SftResult:
        return await run_stage(
            TRAIN_SFT,
            SftInput(
                run_id=inp.run_id,
                step=inp.step,
                model=inp.model,
                examples=inp.examples,
                sft=inp.sft,
                start_from=start_from,
            ),
            task_queue=inp.task_queues.trainer,
            step=inp.step,
            scheduling=inp.scheduling,
            heartbeat_s=inp.heartbeat_timeout_s,
            result_type=SftResult,
        )

    def metrics(trained: SftResult) -> dict[str, float]:
        return {"loss": sum(trained.losses) / len(trained.losses), "grad_norm": trained.grad_norms[-1]}

    return await staged_and_published(
        inp, clock, fine_tune, metrics, "fine-tuning again", stage=PUBLISH, result_type=CheckpointRef
    )


@workflow.defn(name="TrainSFT", failure_exception_types=[ValidationError])
class TrainSFT:
    """Supervised fine-tuning as one step of a run; idempotent per (run, step)."""

    def __init__(self) -> None:
        self._phase = "starting"

    @workflow.query
    def phase(self) -> str:
        return self._phase

    def _set_phase(self, phase: str) -> None:
        self._phase = phase

    @workflow.run
    async def run(self, inp: TrainSFTInput) -> TrainSFTResult:
        clock = PhaseClock(self._set_phase)
        queues = inp.task_queues
        newest = await latest_checkpoint(
            inp.run_id, queues.trainer, inp.step, inp.scheduling, inp.heartbeat_timeout_s
        )
        if newest is not None and newest.step == inp.step:  # a retried call whose step already finished
            adapter = await serve_checkpoint(inp, newest, clock)
            self._phase = "done"
            return TrainSFTResult(step=inp.step, checkpoint=newest, adapter=adapter)
        newest_step = -1 if newest is None else newest.step
        if newest_step != inp.step - 1 and not (newest is None and inp.step == 1):
            raise ApplicationError(
                f"cannot fine-tune step {inp.step} of run {inp.run_id!r}: its newest checkpoint is step "
                f"{newest_step if newest else 'none'}; train step {newest_step + 1} next",
                type=CONFIG_ERROR,
                non_retryable=True,
            )
        try:
            if inp.shared_device:
                clock.enter("sleep")
                await run_stage(
                    SERVING_CONTROL, ServingControlInput(action="sleep"), task_queue=queues.inference,
                    step=inp.step, scheduling=inp.scheduling, heartbeat_s=inp.heartbeat_timeout_s,
                )  # fmt: skip
            try:
                trained, checkpoint = await fine_tune_and_publish(inp, newest, clock)
            finally:
                if inp.shared_device:  # the server wakes in every outcome
                    await wake_up(inp, clock)
            adapter = await serve_checkpoint(inp, checkpoint, clock)
        except StageFailed:
            self._phase = "failed"
            raise
        clock.stop()
        self._phase = "done"
        return TrainSFTResult(
            step=inp.step, checkpoint=checkpoint, adapter=adapter, trained=trained, seconds=clock.seconds
        )
