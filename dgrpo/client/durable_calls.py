"""What a client's durable step calls (``TrainStep``, ``TrainSFT``) do alike: start the step's workflow under
an id that names the step (joining the one already running), and wait for its result across Temporal restarts,
a failure raised in the failing stage's own words (``innermost_failure``, which ``ServeModel``'s client quotes
too)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import FailureError

from workers.temporal import result_across_restarts

R = TypeVar("R")


async def start_step_workflow(
    client: Client, workflow: str, inp: Any, *, workflow_id: str, task_queue: str, result_type: type[R]
) -> WorkflowHandle[Any, R]:
    """Start ``workflow`` as ``workflow_id``, a step's own id: a failed step may be tried again, a finished one
    never runs twice, a running one is joined."""
    return await client.start_workflow(
        workflow,
        inp,
        id=workflow_id,
        task_queue=task_queue,
        result_type=result_type,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )


async def workflow_result(
    handle: WorkflowHandle[Any, R], result_type: type[R], failed: Callable[[str], Exception]
) -> R:
    """The workflow's result, waited for across Temporal restarts; ``failed(message)`` raised if it failed,
    the message naming the workflow and its innermost failure."""
    try:
        result = await result_across_restarts(handle)
    except WorkflowFailureError as err:
        raise failed(f"{handle.id} failed: {innermost_failure(err)}") from err
    assert isinstance(result, result_type)
    return result


def innermost_failure(err: BaseException) -> str:
    """The message of the innermost Temporal failure under ``err``: the failing stage's own words."""
    while isinstance(err.__cause__, FailureError):
        err = err.__cause__
    return str(err)
