"""SIGTERM (a spot-preemption notice) on a worker mid-activity: what ends within the grace period completes
there, what does not is failed and retried on another worker at once, and the worker exits 0.

Real ``dgrpo worker inference`` processes, each with its own CPU server. Worker ``a`` starts alone and picks
up two rollouts activities (tests/workers/preempted_task.py): ``finishes`` ends half a second after the
shutdown begins, ``endless`` never does. Then worker ``b`` joins the queue and ``a`` gets SIGTERM. The
stage's heartbeat timeout here is 10 minutes, so only ``a`` failing ``endless`` at the end of its grace
period gets its retry going within the test's wait.
"""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlparse

from temporalio import workflow
from temporalio.api.enums.v1 import EventType, PendingActivityState
from temporalio.client import WorkflowHandle
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from host.processes import port_answers
from schemas.activities import ActivityName, RolloutsInput
from schemas.config import Scheduling, TaskQueues, TaskSpec
from schemas.refs import TrajectoriesRef
from schemas.settings import ENV_HOME
from workers.launcher import WorkerProcess
from workers.stack import EmbeddedStack
from workers.temporal import connect_client
from workflows.stages import Stage, run_stage

REPO = Path(__file__).resolve().parents[2]
TASK = "tests.workers.preempted_task"
GRACE_S = 5.0
STOP_SLACK_S = 60.0
"""Liveness bound only: the SIGTERMed worker must exit 0 within its grace plus this (else it is killed)."""
SLOW_ROLLOUTS = Stage(
    ActivityName.ROLLOUTS, timedelta(hours=1), heartbeat=timedelta(minutes=10), max_attempts=3
)


@workflow.defn(sandboxed=False)
class PreemptedRollouts:
    @workflow.run
    async def run(self, queue: str, inputs: list[RolloutsInput]) -> list[TrajectoriesRef]:
        stages = [
            run_stage(
                SLOW_ROLLOUTS,
                inp,
                task_queue=queue,
                step=inp.step,
                scheduling=Scheduling(),
                result_type=TrajectoriesRef,
            )
            for inp in inputs
        ]
        return list(await asyncio.gather(*stages))


def rollouts(run_id: str, step: int, scenario: str) -> RolloutsInput:
    return RolloutsInput(
        run_id=run_id,
        step=step,
        model_name="agent",
        task=TaskSpec(rollout=f"{TASK}:rollout", scenarios=[{"id": scenario}]),
        groups_per_step=1,
        group_size=1,
    )


def inference_worker(name: str, queues: TaskQueues, root: Path) -> WorkerProcess:
    home = root / name
    return WorkerProcess(
        "inference",
        home / "worker.log",
        task_queues=queues,
        env={ENV_HOME: str(home)},
        cwd=REPO,
        extra_args=["--task-module", TASK, "--grace-s", str(GRACE_S)],
    )


async def all_started(handle: WorkflowHandle, n: int, timeout_s: float = 120.0) -> list[tuple[int, str]]:  # type: ignore[type-arg]
    """The attempt and worker identity of each of the workflow's ``n`` activities, once all of them run."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pending = (await handle.describe()).raw_description.pending_activities
        running = [p for p in pending if p.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED]
        if len(running) == n:
            return [(p.attempt, p.last_worker_identity) for p in running]
        await asyncio.sleep(0.3)
    raise TimeoutError(f"{n} activities never ran at once within {timeout_s:.0f}s")


async def test_a_sigtermed_worker_finishes_what_it_can_hands_the_rest_to_another_and_exits_0(
    stack: EmbeddedStack, tmp_path: Path
) -> None:
    suffix = uuid.uuid4().hex[:8]
    queues = TaskQueues(control=f"p-control-{suffix}", inference=f"p-inf-{suffix}", trainer=f"p-tr-{suffix}")
    workers = {name: inference_worker(name, queues, tmp_path) for name in ("a", "b")}
    client = await connect_client(address=stack.temporal_address)
    probe_queue = f"p-probe-{suffix}"
    probe = Worker(
        client,
        task_queue=probe_queue,
        workflows=[PreemptedRollouts],
        workflow_runner=UnsandboxedWorkflowRunner(),
    )
    run_id = f"p-{suffix}"
    try:
        await asyncio.to_thread(workers["a"].start, 300)
        by_pid = {f"{workers['a'].info.pid}@{socket.gethostname()}": "a"}
        async with probe:
            handle = await client.start_workflow(
                PreemptedRollouts.run,
                args=[queues.inference, [rollouts(run_id, 1, "finishes"), rollouts(run_id, 2, "endless")]],
                id=run_id,
                task_queue=probe_queue,
            )
            assert [(attempt, by_pid.get(who)) for attempt, who in await all_started(handle, 2)] == [
                (1, "a")
            ] * 2
            await asyncio.to_thread(workers["b"].start, 300)
            by_pid[f"{workers['b'].info.pid}@{socket.gethostname()}"] = "b"
            server_port = urlparse(workers["a"].server_urls[0]).port
            exit_code = await asyncio.to_thread(workers["a"].stop, GRACE_S + STOP_SLACK_S)
            refs = await asyncio.wait_for(handle.result(), 240)

        assert exit_code == 0, workers["a"].log_path.read_text()[-3000:]
        assert [(ref.step, ref.n_trajectories) for ref in refs] == [(1, 1), (2, 1)]
        # The history keeps the attempt that completed each activity: `finishes` within a's grace period,
        # `endless` on b after a failed it.
        started = [
            e.activity_task_started_event_attributes
            async for e in handle.fetch_history_events()
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
        ]
        assert sorted((s.attempt, by_pid.get(s.identity)) for s in started) == [(1, "a"), (2, "b")]
        assert server_port is not None and not port_answers(server_port)  # a's CPU server went with it
        log = workers["a"].log_path.read_text()
        assert "SIGTERM received" in log and "inference worker shut down" in log
    finally:
        for worker in workers.values():
            worker.stop(30)
