"""Workers and clients ride out a Temporal that is not there yet, or restarts, against real dev servers.

A worker started before Temporal keeps trying to connect (a log line per try) and serves once it is up. A
client waiting on a workflow while the dev server is killed and restarted on the same port (its SQLite file
keeps the workflow) gets the result, where a plain ``handle.result()`` gives up during the outage.
"""

from __future__ import annotations

import asyncio
import socket
import uuid
from datetime import timedelta
from pathlib import Path

import psutil
import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from host.processes import HOST, free_port
from schemas.activities import ActivityName, RetentionInput
from schemas.config import Scheduling, TaskQueues
from schemas.settings import ENV_HOME, ENV_TEMPORAL_ADDRESS
from workers.launcher import WorkerProcess
from workers.stack import EmbeddedStack
from workers.temporal import CUT_OFF, TemporalUnreachable, connect_client, result_across_restarts, unreachable
from workflows.stages import Stage, run_stage

REPO = Path(__file__).resolve().parents[2]
RETAIN = Stage(ActivityName.RETAIN_CHECKPOINTS, timedelta(minutes=1), max_attempts=1)
OUTAGE_S = 15.0
"""Longer than the SDK's own retries of a long poll (about 10 s), so a plain wait fails."""


@workflow.defn(sandboxed=False)
class RetainOnce:
    @workflow.run
    async def run(self, queue: str, inp: RetentionInput) -> list[int]:
        return await run_stage(
            RETAIN, inp, task_queue=queue, step=0, scheduling=Scheduling(), result_type=list[int]
        )


@workflow.defn(sandboxed=False)
class Sleeper:
    @workflow.run
    async def run(self, seconds: float) -> str:
        await workflow.sleep(seconds)
        return "woke up"


def own_stack(home: Path, temporal_port: int | None = None) -> EmbeddedStack:
    return EmbeddedStack(home, temporal_port=temporal_port, free_ports=True, ui=False, tied_to_parent=True)


async def test_a_worker_started_before_temporal_waits_for_it_and_then_serves(
    stack: EmbeddedStack, tmp_path: Path
) -> None:
    port = free_port()
    suffix = uuid.uuid4().hex[:8]
    queues = TaskQueues(control=f"o-control-{suffix}", inference=f"o-inf-{suffix}", trainer=f"o-tr-{suffix}")
    worker = WorkerProcess(
        "control",
        tmp_path / "control.log",
        task_queues=queues,
        env={ENV_HOME: str(tmp_path), ENV_TEMPORAL_ADDRESS: f"{HOST}:{port}"},  # S3: the session stack's
        cwd=REPO,
    )
    late = own_stack(tmp_path / "late", temporal_port=port)
    try:
        worker.spawn()
        await asyncio.to_thread(
            worker.child.wait_until, lambda: "Temporal does not answer" in worker.log_path.read_text(), 120
        )
        await asyncio.to_thread(late.start)
        await asyncio.to_thread(worker.wait_ready, 120)
        client = await connect_client(address=late.temporal_address)
        probe_queue = f"o-probe-{suffix}"
        async with Worker(
            client,
            task_queue=probe_queue,
            workflows=[RetainOnce],
            workflow_runner=UnsandboxedWorkflowRunner(),
        ):
            handle = await client.start_workflow(
                RetainOnce.run,
                args=[queues.control, RetentionInput(run_id=f"o-{suffix}", keep_last=1)],
                id=f"o-{suffix}",
                task_queue=probe_queue,
            )
            assert await handle.result() == []  # no checkpoints: nothing deleted
        identities = [
            e.activity_task_started_event_attributes.identity
            async for e in handle.fetch_history_events()
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
        ]
        assert identities == [f"{worker.info.pid}@{socket.gethostname()}"]
        assert worker.stop(30) == 0
    finally:
        worker.stop(30)
        late.stop()


async def test_a_client_waiting_on_a_workflow_gets_its_result_across_a_temporal_restart(
    tmp_path: Path, task_queue: str
) -> None:
    restarting = own_stack(tmp_path)
    await asyncio.to_thread(restarting.start)
    try:
        worker_client = await connect_client(address=restarting.temporal_address)
        async with Worker(
            worker_client,
            task_queue=task_queue,
            workflows=[Sleeper],
            workflow_runner=UnsandboxedWorkflowRunner(),
        ):
            client = await connect_client(address=restarting.temporal_address)
            handle = await client.start_workflow(
                Sleeper.run, 20.0, id=f"sleeper-{task_queue}", task_queue=task_queue
            )
            waiting = asyncio.ensure_future(result_across_restarts(handle))
            plain = asyncio.ensure_future(handle.result())
            await asyncio.sleep(1.0)
            temporal = psutil.Process(restarting.running().temporal.pid)
            temporal.kill()
            await asyncio.to_thread(temporal.wait, 10)
            await asyncio.sleep(OUTAGE_S)
            restarted = own_stack(tmp_path)  # the dead half comes back on its recorded port, same SQLite file
            await asyncio.to_thread(restarted.start)
            assert restarted.temporal_address == restarting.temporal_address
            assert await asyncio.wait_for(waiting, 120) == "woke up"
            with pytest.raises(RPCError):  # the premise: without riding out the restart, the wait fails
                await plain
    finally:
        own_stack(tmp_path).stop()


def test_what_counts_as_temporal_being_unreachable() -> None:
    assert unreachable(TemporalUnreachable("no Temporal server answers at 127.0.0.1:1"))
    assert unreachable(RPCError("tcp connect error", RPCStatusCode.UNAVAILABLE, b""))
    # Both seen by the chaos test's wait on its run: Temporal killed under the long poll, and a loaded restart.
    assert unreachable(RPCError(CUT_OFF, RPCStatusCode.UNKNOWN, b""))
    assert unreachable(RPCError("context deadline exceeded", RPCStatusCode.DEADLINE_EXCEEDED, b""))
    assert not unreachable(RPCError("workflow not found", RPCStatusCode.NOT_FOUND, b""))
    assert not unreachable(RPCError("bad request", RPCStatusCode.UNKNOWN, b""))
    assert not unreachable(RuntimeError("tcp connect error"))
