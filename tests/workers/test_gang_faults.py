"""A rank of a trainer's gang killed or stopped (activities/gang/): the step's attempt fails at once, naming the
rank; the gang's processes are recycled (a stopped rank is killed, never reused) and Temporal retries the step from
its start checkpoint: nothing lost, nothing trained twice.

One run of 2 steps of the tiny Qwen3 shape on the session's real ``dgrpo worker all --model <tiny Qwen3> --ranks 2``
(its trainer child drives the two ranks), the run's heartbeat timeout 10 s:

1. step 1: a rank killed (SIGKILL) as soon as it started, while its gang forms;
2. step 2: a rank stopped (SIGSTOP) while the step rolls out: the step's training finds it silent.
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import psutil
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from activities.object_store import ObjectStore
from dgrpo.client import run_control
from schemas.config import RunSpec, TaskQueues
from schemas.settings import S3Settings
from tests.chaos.chaos_cluster import pending_activities
from tests.gang_checks import retrained
from workers.launcher import WorkerProcess
from workers.stack import EmbeddedStack
from workers.temporal import connect_client
from workflows.training_run import TrainingRun

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
STEPS = 2
RUN_TIMEOUT_S = 600.0
FAILS_WITHIN_S = 30.0


@pytest.fixture(scope="module")
def gang_worker(
    tiny_gang_worker: WorkerProcess, tiny_gang_queues: TaskQueues
) -> tuple[WorkerProcess, TaskQueues]:
    """The session's ``dgrpo worker all --model <tiny Qwen3> --ranks 2`` (tests/conftest.py): it replaces the
    ranks this module breaks, so the modules after it find it whole."""
    return tiny_gang_worker, tiny_gang_queues


def gang_ranks(worker: WorkerProcess) -> list[psutil.Process]:
    """The worker's rank processes (its trainer child's children), oldest first."""
    found = []
    for process in psutil.Process(worker.info.pid).children(recursive=True):
        try:
            if (
                "activities.gang.rank" in " ".join(process.cmdline())
                and process.status() != psutil.STATUS_ZOMBIE
            ):
                found.append(process)
        except psutil.NoSuchProcess:
            continue
    return sorted(found, key=lambda p: p.create_time())


def spec_of(run_id: str, queues: TaskQueues, base_model: Path) -> RunSpec:
    return RunSpec.model_validate(
        {
            "run_id": run_id,
            # a LoRA shape of its own: the gang starts ranks for it (the worker's, warm from other runs, are recycled)
            "model": {"name": run_id, "base_model": str(base_model), "lora": {"rank": 4, "alpha": 8}},
            "task": {
                "rollout": "examples.shape_check:rollout",
                "scenarios": "examples.shape_check:scenarios",
            },
            "steps": STEPS,
            "groups_per_step": 2,
            "group_size": 4,
            "train": {"learning_rate": 1e-3, "epochs": 2},
            "judge": {"kind": "rollout"},
            "task_queues": queues.model_dump(),
            "heartbeat_timeout_s": 10,
            "metrics": {"wandb": False},
        }
    )


async def retried_trainings(client: Client, handle: WorkflowHandle) -> list[tuple[int, str, datetime]]:  # type: ignore[type-arg]
    """Each training attempt after a first, of every run of the chain: (attempt, the failure before it, when it
    started)."""
    out = []
    async for execution in client.list_workflows(f"WorkflowId = '{handle.id}'"):
        scheduled: dict[int, str] = {}
        history = client.get_workflow_handle(handle.id, run_id=execution.run_id)
        async for event in history.fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                scheduled[event.event_id] = event.activity_task_scheduled_event_attributes.activity_type.name
            elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                attrs = event.activity_task_started_event_attributes
                if scheduled[attrs.scheduled_event_id] == "train" and attrs.attempt > 1:
                    out.append(
                        (attrs.attempt, attrs.last_failure.message, event.event_time.ToDatetime(tzinfo=UTC))
                    )
    return out


async def first_attempts_started(handle: WorkflowHandle, seen: dict[str, datetime]) -> None:  # type: ignore[type-arg]
    """Until cancelled: when each training's first attempt started (the history keeps only the last one's)."""
    while True:
        _, pendings = await pending_activities(handle)
        for pending in pendings:
            if (
                pending.activity_type.name == "train"
                and pending.attempt == 1
                and pending.HasField("last_started_time")
            ):
                seen.setdefault(pending.activity_id, pending.last_started_time.ToDatetime(tzinfo=UTC))
        await asyncio.sleep(0.1)


async def test_a_rank_killed_or_stopped_costs_its_gang_one_attempt_and_the_run_completes(
    gang_worker: tuple[WorkerProcess, TaskQueues],
    tiny_qwen3: Path,
    stack: EmbeddedStack,
    s3_settings: S3Settings,
) -> None:
    worker, queues = gang_worker
    client = await connect_client(address=stack.temporal_address)
    spec = spec_of(f"gang-faults-{uuid.uuid4().hex[:6]}", queues, tiny_qwen3)
    before = {rank.pid for rank in gang_ranks(worker)}
    handle = await run_control.start_run(client, spec)
    first_started: dict[str, datetime] = {}
    watching = asyncio.create_task(first_attempts_started(handle, first_started))
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while len(ranks := [r for r in gang_ranks(worker) if r.pid not in before]) < 2:  # the first training's
        assert time.monotonic() < deadline, "the gang's ranks never started"
        await asyncio.sleep(0.05)
    killed = ranks[1]
    killed.send_signal(signal.SIGKILL)
    faults = [datetime.now(UTC)]
    while (status := await handle.query(TrainingRun.status)).step < 1 or status.phase != "rollouts":
        assert time.monotonic() < deadline and status.phase not in ("done", "failed"), status
        await asyncio.sleep(0.1)
    stopped = gang_ranks(worker)[0]  # of the gang the retry started
    stopped.send_signal(signal.SIGSTOP)
    faults.append(datetime.now(UTC))
    try:
        final = await asyncio.wait_for(run_control.watch(handle, lambda _: None, interval=0.5), RUN_TIMEOUT_S)
    finally:
        watching.cancel()
        if stopped.is_running():
            stopped.send_signal(signal.SIGCONT)
    assert final.phase == "done" and final.step == STEPS, final
    retries = await retried_trainings(client, handle)
    # one retry per step, and each succeeded
    assert [attempt for attempt, _, _ in retries] == [2, 2], retries
    (_, killed_said, first_retry), (_, stopped_said, second_retry) = retries
    assert f"(pid {killed.pid}) was killed by SIGKILL" in killed_said, killed_said
    assert f"(pid {stopped.pid}) has sent nothing" in stopped_said, stopped_said
    # Each failed attempt ended soon after its fault, or after its own start (the rank stopped before it began).
    starts = sorted(first_started.values())
    assert len(starts) == STEPS, first_started
    for fault, start, retry in zip(faults, starts, (first_retry, second_retry), strict=True):
        seconds = (retry - max(fault, start)).total_seconds()
        print(
            f"fault at {fault:%H:%M:%S}, attempt 1 from {start:%H:%M:%S}: the retry started {seconds:.1f} s after"
        )
        assert seconds < FAILS_WITHIN_S
    # recycled: the stopped rank killed, not continued
    assert not stopped.is_running() or stopped.status() == psutil.STATUS_ZOMBIE
    assert all(rank.pid not in (killed.pid, stopped.pid) for rank in gang_ranks(worker))
    for step, distance in enumerate(retrained(ObjectStore(s3_settings), spec, STEPS), start=1):
        print(f"step {step} against one device trained from checkpoint {step - 1}: {distance}")
        assert not distance.problems, distance
