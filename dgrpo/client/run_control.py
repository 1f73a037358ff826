"""Start, steer and watch ``TrainingRun`` workflows from Python (the ``dgrpo`` CLI and the demo use it)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowQueryFailedError,
)
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from activities.checkpoints import check_checkpoint_fits, published_trainer_state
from activities.object_store import ObjectStore
from dgrpo.client.attach import started_input
from schemas.config import RunSpec, parse_run_spec
from schemas.errors import DgrpoError, RunSpecError
from schemas.layout import spec_key
from schemas.run_state import RunStatus
from schemas.settings import ENV_S3_BUCKET
from workers.temporal import result_across_restarts
from workflows.stages import priority
from workflows.training_run import TrainingRun


class RunNotFoundError(DgrpoError, LookupError):
    """No workflow, and no stored spec, for this run id."""


class RunAlreadyRunningError(DgrpoError, RuntimeError):
    """A run was started under the id of a run that is still running."""


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
    """Start the workflow, then keep the spec in the object store (``runs/<run>/spec.json``): a start that
    fails (the run id is already running) leaves the stored spec as it was.

    The workflow id is the run id: starting a run whose earlier workflow was terminated, failed or whose
    stack died resumes it from its newest checkpoint.
    """
    too_big = spec.history_bounds_error()
    if too_big:
        raise RunSpecError(f"run {spec.run_id!r}: {too_big}")
    store = store or store_for(spec)
    await asyncio.to_thread(store.ensure_bucket)
    try:
        handle = await client.start_workflow(
            TrainingRun.run,
            spec,
            id=spec.run_id,
            task_queue=spec.task_queues.control,
            priority=priority(spec.scheduling()),  # its workflow tasks too queue as its activities do
        )
    except WorkflowAlreadyStartedError as err:
        raise RunAlreadyRunningError(
            f"run {spec.run_id!r} is already running; its stored spec is unchanged. Watch it with "
            f"`dgrpo status {spec.run_id} --watch`, stop it first (`dgrpo stop {spec.run_id}`), or give this "
            "spec another run_id"
        ) from err
    await asyncio.to_thread(store.put_bytes, spec_key(spec.run_id), spec.model_dump_json(indent=2).encode())
    return handle


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
    data = await started_input(client.get_workflow_handle(run_id))
    if data is not None:
        return parse_run_spec(data, f"workflow {run_id} input")
    raise RunNotFoundError(f"no run {run_id!r}: neither a workflow nor {store.uri(key)} exists")


async def resume_run(
    client: Client, run_id: str, store: ObjectStore | None = None
) -> tuple[str, RunStatus | None]:
    """Resume a paused run, or restart a terminated/failed/dead one from its newest checkpoint, refused when
    that checkpoint was trained for another base model or LoRA shape than the stored spec says."""
    if await is_running(client, run_id):
        return "resumed", await handle_of(client, run_id).execute_update(TrainingRun.resume)
    store = store or ObjectStore.from_env()
    spec = await stored_spec(client, run_id, store)
    newest = await asyncio.to_thread(store.latest_checkpoint, run_id)
    if newest is not None:
        state = await asyncio.to_thread(published_trainer_state, store, newest)
        check_checkpoint_fits(state, spec.model, newest.uri)
    await start_run(client, spec, store)
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
