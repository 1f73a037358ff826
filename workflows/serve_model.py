"""``ServeModel``: serve a run's newest checkpoint, publishing checkpoint 0 first when it has none.

``TrainingRun`` starts (and recovers) with ``serve_newest``; the ART-style client's ``register`` runs it
as a workflow when the newest step is not served yet (a fresh server, or a warm-start adapter at step 0).
"""

from __future__ import annotations

from collections.abc import Callable

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from schemas.activities import InitialAdapterInput, ReloadInput, ReloadResult
    from schemas.refs import CheckpointRef
    from schemas.run_state import ServeModelInput, ServeModelResult

from workflows.stages import PUBLISH_INITIAL, RELOAD, run_stage
from workflows.step_chain import latest_checkpoint


async def serve_newest(inp: ServeModelInput, on_phase: Callable[[str], None]) -> ServeModelResult:
    """The newest manifested checkpoint (or a freshly published checkpoint 0), loaded on the servers."""
    queues = inp.task_queues
    checkpoint = await latest_checkpoint(
        inp.run_id, queues.trainer, 0, inp.scheduling, inp.heartbeat_timeout_s
    )
    if checkpoint is None:
        on_phase("publish")
        checkpoint = await run_stage(
            PUBLISH_INITIAL,
            InitialAdapterInput(run_id=inp.run_id, model=inp.model, seed=inp.seed),
            task_queue=queues.trainer,
            step=0,
            scheduling=inp.scheduling,
            heartbeat_s=inp.heartbeat_timeout_s,
            result_type=CheckpointRef,
        )
    else:
        workflow.logger.info("run %s: newest checkpoint is step %d", inp.run_id, checkpoint.step)
    on_phase("reload")
    reloaded = await run_stage(
        RELOAD,
        ReloadInput(
            model_name=inp.model.name,
            checkpoint=checkpoint,
            serving=inp.serving,
            lora_rank=inp.model.lora.rank,
            shared=inp.shared,
            chat_template=inp.model.chat_template is not None,
            bucket=inp.bucket,
        ),
        task_queue=queues.inference,
        step=checkpoint.step,
        scheduling=inp.scheduling,
        heartbeat_s=inp.heartbeat_timeout_s,
        result_type=ReloadResult,
    )
    return ServeModelResult(step=checkpoint.step, checkpoint=checkpoint, adapter=reloaded.adapter,
                            adapter_sha256=reloaded.adapter_sha256)  # fmt: skip


@workflow.defn(name="ServeModel", failure_exception_types=[ValidationError])
class ServeModel:
    """Query ``phase``; idempotent: running it again only loads the newest checkpoint again."""

    def __init__(self) -> None:
        self._phase = "starting"

    @workflow.query
    def phase(self) -> str:
        return self._phase

    def _set_phase(self, phase: str) -> None:
        self._phase = phase

    @workflow.run
    async def run(self, inp: ServeModelInput) -> ServeModelResult:
        result = await serve_newest(inp, self._set_phase)
        self._phase = "done"
        return result
