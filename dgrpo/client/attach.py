"""Joining a workflow another client started: what it was started with, read back from its history.

A client that calls ``model.train`` for a step whose ``TrainStep`` already runs (or finished) attaches to it
instead of training twice; it first checks that the workflow trains this very model with this step's
settings, so a model never takes another's result (or waits on another's step) for its own.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

from dgrpo.errors import ModelConflictError
from schemas.config import ModelSpec, TrainConfig
from schemas.run_state import TrainStepInput
from workers.temporal import across_restarts

COMPARED_MODEL_FIELDS = ("project", "name", "base_model", "lora")
"""What makes a ``TrainStep`` this model's: its identity and the adapter's base and shape."""


async def workflow_status(handle: WorkflowHandle[Any, Any]) -> WorkflowExecutionStatus | None:
    """The status of the workflow's newest run, or None when no run has that id."""
    try:
        description = await across_restarts(handle.describe, f"asking for workflow {handle.id}")
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    return description.status


async def started_input(handle: WorkflowHandle[Any, Any]) -> Any:
    """The (JSON) input the workflow's first execution was started with, or None when no such workflow."""
    try:
        async for event in handle.fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
                payload = event.workflow_execution_started_event_attributes.input.payloads[0]
                return json.loads(payload.data)
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            raise
    return None


def _show(value: Any) -> str:
    return repr(value.model_dump()) if isinstance(value, BaseModel) else repr(value)


async def check_train_step(
    handle: WorkflowHandle[Any, Any], run_id: str, model: ModelSpec, train: TrainConfig
) -> None:
    """Raise ``ModelConflictError`` unless the ``TrainStep`` behind ``handle`` trains run ``run_id``'s
    ``model`` (same project, name, base model and LoRA shape) with ``train``; the message names what differs."""
    data = await started_input(handle)
    theirs = None if data is None else TrainStepInput.model_validate(data)
    if theirs is None:
        return
    mine: dict[str, Any] = {"run_id": run_id, "train": train}
    started: dict[str, Any] = {"run_id": theirs.run_id, "train": theirs.train}
    for field in COMPARED_MODEL_FIELDS:
        mine[f"model.{field}"], started[f"model.{field}"] = (
            getattr(model, field),
            getattr(theirs.model, field),
        )
    differ = [k for k in mine if mine[k] != started[k]]
    if differ:
        what = "; ".join(f"{k}={_show(started[k])}, not {_show(mine[k])}" for k in differ)
        raise ModelConflictError(
            f"{handle.id} already runs (or ran) step {theirs.step} with {what}: it is not this model's step "
            "with these settings, so model.train does not attach to it. Give this model another name or "
            "project, or call train with the settings that step was started with"
        )
