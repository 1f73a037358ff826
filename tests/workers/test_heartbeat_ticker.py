"""Heartbeats from a ticker: a live worker busy for longer than the heartbeat timeout keeps its activity, and
the ticker repeats the activity's newest details (what a retry resumes from), against a real Temporal server."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from temporalio import activity, workflow
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError, TimeoutType
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from schemas.config import Scheduling
from workers.heartbeat_ticker import HeartbeatTicker
from workers.stack import EmbeddedStack
from workers.temporal import connect_client
from workflows.stages import Stage, run_stage

BUSY = "busy_without_heartbeats"
BUSY_STAGE = Stage(BUSY, timedelta(seconds=60), heartbeat=timedelta(seconds=1), max_attempts=2)  # type: ignore[arg-type]


@activity.defn(name=BUSY)
async def busy_without_heartbeats(seconds: float) -> dict[str, Any]:
    """Reports progress once, then works (off the event loop) for longer than the heartbeat timeout; fails
    its first attempt at the end, so the second shows what details the first left behind."""
    info = activity.info()
    activity.heartbeat({"done": 7, "attempt": info.attempt})
    await asyncio.to_thread(time.sleep, seconds)
    if info.attempt == 1:
        raise ApplicationError("first attempt fails after its work", type="Flaky")
    return {
        "attempt": info.attempt,
        "resumed_from": info.heartbeat_details[0] if info.heartbeat_details else None,
    }


@workflow.defn(sandboxed=False)
class RunBusy:
    @workflow.run
    async def run(self, queue: str, seconds: float) -> dict[str, Any]:
        return await run_stage(
            BUSY_STAGE, seconds, task_queue=queue, step=1, scheduling=Scheduling(), reraise=True
        )


async def run_busy(stack: EmbeddedStack, task_queue: str, interceptors: list[Any]) -> dict[str, Any]:
    client = await connect_client(address=stack.temporal_address)
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[RunBusy],
        activities=[busy_without_heartbeats],
        interceptors=interceptors,
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        return await client.execute_workflow(
            RunBusy.run,
            args=[task_queue, 3.0],
            id=f"busy-{uuid.uuid4().hex[:8]}",
            task_queue=task_queue,
            execution_timeout=timedelta(minutes=2),
        )


async def test_the_ticker_keeps_a_busy_activity_alive_and_its_details_for_the_retry(
    stack: EmbeddedStack, task_queue: str
) -> None:
    result = await run_busy(stack, task_queue, [HeartbeatTicker()])
    assert result == {"attempt": 2, "resumed_from": {"done": 7, "attempt": 1}}


async def test_without_the_ticker_the_same_work_times_out(stack: EmbeddedStack, task_queue: str) -> None:
    with pytest.raises(WorkflowFailureError) as failed:
        await run_busy(stack, task_queue, [])
    cause = failed.value.cause
    assert isinstance(cause, ActivityError) and isinstance(cause.cause, TimeoutError)
    assert cause.cause.type == TimeoutType.HEARTBEAT


async def test_a_ticker_that_no_longer_vouches_lets_the_same_work_time_out(
    stack: EmbeddedStack, task_queue: str
) -> None:
    """The inference worker's ticker while its engine leaves probes unanswered: no beat at all, the
    activity's own included, so Temporal's heartbeat timeout ends the attempt."""
    with pytest.raises(WorkflowFailureError) as failed:
        await run_busy(stack, task_queue, [HeartbeatTicker(vouches=lambda: False)])
    cause = failed.value.cause
    assert isinstance(cause, ActivityError) and isinstance(cause.cause, TimeoutError)
    assert cause.cause.type == TimeoutType.HEARTBEAT
