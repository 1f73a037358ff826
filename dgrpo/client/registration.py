"""What ``TrainableModel.register`` does on the cluster (``join_run``, dgrpo's backends' ``register`` hook): the
model's record kept (or checked), a step an earlier client left running awaited, and the model's newest step
served.

A model's record (``runs/<run id>/model.json``) pins its base model and LoRA shape: its checkpoints belong to
them, so a model of the same name and project with another shape is refused. A new inference server (or a
warm-start adapter at step 0) gets the newest checkpoint loaded by a ``ServeModel`` workflow, which clients
registering at once share.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy

from activities.object_store import ObjectStore
from activities.rollout_model import discover_base_model
from dgrpo.client.attach import workflow_status
from dgrpo.client.backends import Backend
from dgrpo.client.durable_calls import innermost_failure
from dgrpo.client.train_step import train_step_result, train_workflow_id
from dgrpo.errors import BackendError, ModelConflictError
from schemas import layout
from schemas.config import ModelSpec, Scheduling, TaskQueues
from schemas.run_state import ServeModelInput, ServeModelResult, TrainStepResult
from serving.client import ServingClient, openai_base_url
from workers.temporal import result_across_restarts

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JoinedRun:
    """A registered model's place on the cluster: its store, the base model's served name, its newest step and
    that step's served name."""

    store: ObjectStore
    base_served: str
    step: int
    served: str


async def join_run(backend: Backend, run_id: str, spec: ModelSpec, warm_start: bool) -> JoinedRun:
    """Register run ``run_id`` of model ``spec`` on ``backend``: record it (or check the record), wait for a
    step an earlier client left running, and serve its newest step."""
    await backend.start()
    store = backend.object_store()
    await asyncio.to_thread(store.ensure_bucket)
    await asyncio.to_thread(check_record, store, run_id, spec)
    url = openai_base_url(backend.inference_url())
    client = await backend.temporal_client()
    await await_earlier_train(client, run_id, await newest_step(store, run_id))
    base_served = await discover_base_model(url)
    step, served = await serve_newest(
        client, store, backend.task_queues, run_id, spec, url, base_served, warm_start
    )
    return JoinedRun(store, base_served, step, served)


def check_record(store: ObjectStore, run_id: str, model: ModelSpec) -> None:
    """Record the model under its run, or refuse it when the record names another base model or LoRA shape."""
    key = layout.model_key(run_id)
    if not store.exists(key):
        store.put_bytes(key, model.model_dump_json(indent=2).encode())
        return
    recorded = ModelSpec.model_validate_json(store.get_bytes(key))
    for field in ("base_model", "lora"):
        if getattr(recorded, field) != getattr(model, field):
            raise ModelConflictError(
                f"model {model.name!r} of project {model.project!r} is already registered with "
                f"{field}={shown(getattr(recorded, field))}, not {shown(getattr(model, field))}; "
                f"its checkpoints belong to that {field}. Use another name (or project) for this one, "
                f"or pass {field}={shown(getattr(recorded, field))}"
            )


def changed_since_register(was_id: str, was: ModelSpec, run_id: str, spec: ModelSpec) -> ModelConflictError:
    """The error for a registered model whose run id or spec (``was_id``, ``was``) became ``run_id``, ``spec``."""
    changed = [f"run id {was_id!r} -> {run_id!r}"] if run_id != was_id else []
    for field in ("name", "project", "base_model", "lora", "chat_template"):
        old, new = getattr(was, field), getattr(spec, field)
        if old != new:
            changed.append(f"{field} {shown(old)} -> {shown(new)}")
    return ModelConflictError(
        f"model {was.name!r} was registered as run {was_id!r}; changed since: {'; '.join(changed)}. Its "
        "checkpoints belong to what it registered with: set name/project/run_name/base_model/LoRA before "
        "`register`, or `model_copy()` it and register the copy"
    )


async def newest_step(store: ObjectStore, run_id: str) -> int:
    newest = await asyncio.to_thread(store.latest_checkpoint, run_id)
    return 0 if newest is None else newest.step


async def await_earlier_train(client: Client, run_id: str, newest: int) -> None:
    """A train call of a client that died may still be finishing: wait for it, never race it."""
    for step in (newest, newest + 1):
        handle = client.get_workflow_handle(train_workflow_id(run_id, step), result_type=TrainStepResult)
        if await workflow_status(handle) == WorkflowExecutionStatus.RUNNING:
            log.info("waiting for the running %s of an earlier client", handle.id)
            await train_step_result(handle)


async def serve_newest(
    client: Client,
    store: ObjectStore,
    queues: TaskQueues,
    run_id: str,
    model: ModelSpec,
    url: str,
    base_served: str,
    warm_start: bool,
) -> tuple[int, str]:
    """The newest checkpoint's step and served name, loading it into the server if it is not there (a new
    server); step 0 of a fresh LoRA is ``base_served``, the base model itself (its B matrices are zero)."""
    checkpoint = await asyncio.to_thread(store.latest_checkpoint, run_id)
    if checkpoint is None and not warm_start:
        return 0, base_served
    if checkpoint is not None:
        adapter = layout.adapter_name(run_id, checkpoint.step)
        if adapter in await _served_models(url):
            return checkpoint.step, adapter
    # A new server, or a warm-start adapter at step 0: ServeModel publishes checkpoint 0 if there is
    # none, and loads the newest checkpoint. Clients registering at once share one run of it.
    handle = await client.start_workflow(
        "ServeModel",
        ServeModelInput(
            run_id=run_id,
            model=model,
            task_queues=queues,
            scheduling=Scheduling.of_owner(model.project),
        ),
        id=f"serve-{run_id}",
        task_queue=queues.control,
        result_type=ServeModelResult,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    try:
        served = await result_across_restarts(handle)
    except WorkflowFailureError as err:
        raise BackendError(f"{handle.id} could not serve {run_id}: {innermost_failure(err)}") from err
    return served.step, served.adapter


async def _served_models(url: str) -> set[str]:
    return {str(m.get("id")) for m in await ServingClient(url, timeout_s=10.0).models()}


def shown(value: Any) -> str:
    return repr(value.model_dump()) if isinstance(value, BaseModel) else repr(value)
