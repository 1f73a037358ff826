"""Start, steer and watch ``TrainingRun`` workflows from Python (the ``dgrpo`` CLI and the demo use it)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle, WorkflowQueryFailedError
from temporalio.service import RPCError, RPCStatusCode

from activities.object_store import ObjectStore
from schemas.config import RunSpec, parse_run_spec
from schemas.errors import DgrpoError, RunSpecError
from schemas.layout import spec_key
from schemas.run_state import RunStatus
from schemas.settings import ENV_S3_BUCKET
from workers.temporal import result_across_restarts
from workflows.training_run import TrainingRun


class RunNotFoundError(DgrpoError, LookupError):
    """No workflow, and no stored spec, for this run id."""


def store_for(spec: RunSpec) -> ObjectStore:
    """The object store the run's workers use (``DGRPO_S3_*``); a spec naming another bucket is refused."""
    store = ObjectStore.from_env()
    if spec.storage.bucket and spec.storage.bucket != store.bucket:
        raise RunSpecError(
            f"storage.bucket is {spec.storage.bucket!r}, but the workers' bucket is {store.bucket!r} "
            f"({ENV_S3_BUCKET}); storage.bucket is deprecated: leave it out of the run spec"
        )
    return store


async def start_run(
    client: Client, spec: RunSpec, store: ObjectStore | None = None
) -> WorkflowHandle[TrainingRun, RunStatus]:
    """Keep the spec in the object store (``runs/<run>/spec.json``), then start the workflow.

    The workflow id is the run id: starting a run whose earlier workflow was terminated, failed or whose
    stack died resumes it from its newest checkpoint.
    """
    store = store or store_for(spec)
    await asyncio.to_thread(store.ensure_bucket)
    await asyncio.to_thread(store.put_bytes, spec_key(spec.run_id), spec.model_dump_json(indent=2).encode())
    return await client.start_workflow(
        TrainingRun.run, spec, id=spec.run_id, task_queue=spec.task_queues.control
    )


def handle_of(client: Client, run_id: str) -> WorkflowHandle[TrainingRun, RunStatus]:
    return client.get_workflow_handle_for(TrainingRun.run, run_id)


async def is_running(client: Client, run_id: str) -> bool:
    try:
        desc = await client.get_workflow_handle(run_id).describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return False
        raise
    return desc.status == WorkflowExecutionStatus.RUNNING


async def stored_spec(client: Client, run_id: str, store: ObjectStore | None = None) -> RunSpec:
    """The run's spec: ``runs/<run>/spec.json``, else the input of its last workflow execution."""
    store = store or ObjectStore.from_env()
    key = spec_key(run_id)
    if await asyncio.to_thread(store.exists, key):
        data = json.loads(await asyncio.to_thread(store.get_bytes, key))
        return parse_run_spec(data, store.uri(key))
    try:
        async for event in client.get_workflow_handle(run_id).fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
                payload = event.workflow_execution_started_event_attributes.input.payloads[0]
                return parse_run_spec(json.loads(payload.data), f"workflow {run_id} input")
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            raise
    raise RunNotFoundError(f"no run {run_id!r}: neither a workflow nor {store.uri(key)} exists")


async def resume_run(client: Client, run_id: str) -> tuple[str, RunStatus | None]:
    """Resume a paused run, or restart a terminated/failed/dead one from its newest checkpoint."""
    if await is_running(client, run_id):
        return "resumed", await handle_of(client, run_id).execute_update(TrainingRun.resume)
    spec = await stored_spec(client, run_id)
    await start_run(client, spec)
    return "restarted", None


async def watch(
    handle: WorkflowHandle[TrainingRun, RunStatus],
    on_status: Callable[[RunStatus], None],
    interval: float = 1.0,
) -> RunStatus:
    """Call ``on_status`` with each polled status until the workflow ends; returns its result. A Temporal
    restart meanwhile is waited out."""
    result_task = asyncio.ensure_future(result_across_restarts(handle))
    try:
        while not result_task.done():
            try:
                on_status(await handle.query(TrainingRun.status))
            except (RPCError, WorkflowQueryFailedError):
                pass  # between continue-as-new runs, a busy or restarting worker: ask again
            await asyncio.wait({result_task}, timeout=interval)
        final = result_task.result()
        on_status(final)
        return final
    finally:
        result_task.cancel()
