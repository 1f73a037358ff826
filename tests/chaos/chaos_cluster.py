"""A small real cluster to break: its own embedded stack, a control worker, N inference and M trainer workers.

``ChaosCluster`` starts them as ``dgrpo worker ROLE`` processes (workers/launcher.py), each with its own
``DGRPO_HOME`` (staging, adapters, the server's log), and injects faults the way a machine loses them:
``kill -9`` of the worker running a given activity, of the Temporal server, of the S3 server. Every fault is
recorded in ``faults`` with its wall-clock time; ``retry_delays`` reads, from the workflow history, when
the activity's next attempt started. Used by tests/chaos/test_chaos.py and bench/chaos.py.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import tempfile
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
from temporalio.api.enums.v1 import EventType, PendingActivityState
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError

from activities.checkpoints import download_checkpoint
from activities.object_store import ObjectStore
from schemas.config import TaskQueues
from schemas.layout import checkpoint_prefix, trajectories_key
from schemas.refs import CheckpointRef
from schemas.settings import ENV_HOME
from workers.launcher import WorkerProcess
from workers.stack import EmbeddedStack

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
MEMORY_CGROUPS = Path("/sys/fs/cgroup/memory")
"""cgroup v1's memory controller (root on these machines): where an OOM kill is caused for real."""


def oom_kill(process: psutil.Process, headroom_mb: int, timeout_s: float = 120.0) -> None:
    """Have the kernel's OOM killer end ``process``: move it into a new memory cgroup (v1) that allows it
    ``headroom_mb`` more than it is charged, and wait for its next allocations to overrun that. Raises unless
    the cgroup counted an OOM kill; a process that outlives ``timeout_s`` (it allocated too little) is moved
    back to its own cgroup, alive. The new cgroup is removed either way."""
    if not MEMORY_CGROUPS.is_dir():
        raise RuntimeError(f"no cgroup v1 memory controller at {MEMORY_CGROUPS}: cannot cause an OOM kill")
    (home,) = [line.split(":", 2)[2] for line in Path(f"/proc/{process.pid}/cgroup").read_text().splitlines()
               if line.split(":")[1] == "memory"]  # fmt: skip
    group = MEMORY_CGROUPS / f"dgrpo-oom-{process.pid}-{int(time.time())}"
    group.mkdir()
    try:
        (group / "cgroup.procs").write_text(str(process.pid))
        usage = int((group / "memory.usage_in_bytes").read_text())
        (group / "memory.limit_in_bytes").write_text(str(usage + headroom_mb * 2**20))
        try:
            process.wait(timeout_s)
        except psutil.TimeoutExpired:
            (MEMORY_CGROUPS / home.lstrip("/") / "cgroup.procs").write_text(str(process.pid))
            raise RuntimeError(
                f"pid {process.pid} allocated under {headroom_mb} MB in {timeout_s:.0f}s"
            ) from None
        oom = dict(line.split() for line in (group / "memory.oom_control").read_text().splitlines())
        if int(oom.get("oom_kill", 0)) < 1:
            raise RuntimeError(f"pid {process.pid} died, but not by the OOM killer: {oom}")
    finally:
        group.rmdir()


class MomentPassed(RuntimeError):
    """The run went past the phase a fault was waiting for."""


@dataclass
class Fault:
    """One injected fault: what was killed, when, and (for a worker) the activity attempt it was running."""

    kind: str
    """``kill worker``, ``kill temporal``, ``kill seaweed`` (the S3 server), ``stop server`` (``kill -STOP`` of a
    worker's inference server), ``kill trainer child`` or ``OOM-kill trainer child`` (of a ``worker all``)."""
    target: str
    at: datetime
    activity: str | None = None
    run_id: str | None = None
    """The workflow run (of a continue-as-new chain) the activity belongs to."""
    activity_id: str | None = None
    attempt: int | None = None
    outage_s: float | None = None
    """Seconds from the kill until the restarted server answered (temporal, seaweed)."""


@dataclass
class ChaosCluster:
    """The stack and the workers under ``root``; ``inference`` and ``trainers`` say how many of each."""

    root: Path
    queues: TaskQueues
    inference: int = 2
    trainers: int = 2
    all_in_one: int = 0
    """``dgrpo worker all`` processes (each with its server and its trainer child), named ``all-<n>``."""
    stack: EmbeddedStack = field(init=False)
    workers: dict[str, WorkerProcess] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.stack = EmbeddedStack(self.root / "stack", free_ports=True, ui=False, tied_to_parent=True)

    @property
    def names(self) -> list[str]:
        return (
            ["control"]
            + [f"inference-{i}" for i in range(1, self.inference + 1)]
            + [f"trainer-{i}" for i in range(1, self.trainers + 1)]
            + [f"all-{i}" for i in range(1, self.all_in_one + 1)]
        )

    def start(self) -> None:
        """The stack, then every worker (started together, so their imports and model loads overlap)."""
        self.stack.start()
        for name in self.names:
            self.spawn(name)
        for name in self.names:
            self.workers[name].wait_ready()

    def spawn(self, name: str) -> WorkerProcess:
        """Start (or start again) worker ``name``; it polls once its ready file appears. Call it from the main
        thread: the worker dies with this process."""
        home = self.root / name
        worker = WorkerProcess(
            name.split("-")[0],
            home / "logs" / "worker.log",
            task_queues=self.queues,
            env={**self.stack.env(), ENV_HOME: str(home)},
            cwd=REPO,
            die_with_parent=True,
        )
        worker.spawn()
        self.workers[name] = worker
        return worker

    async def ready(self, name: str) -> None:
        """Until worker ``name`` polls again (it raises if the worker exited instead)."""
        await asyncio.to_thread(self.workers[name].wait_ready)

    def dead(self) -> list[str]:
        """Workers that exited by themselves (none of ours is left dead: each kill is followed by a restart)."""
        return [name for name, worker in self.workers.items() if not worker.alive()]

    def stop(self) -> None:
        for worker in self.workers.values():
            for child in self.children(worker, ""):  # a stopped server handles no signal until continued
                child.send_signal(signal.SIGCONT)
            worker.kill()
        self.stack.stop()

    @staticmethod
    def children(worker: WorkerProcess, marker: str) -> list[psutil.Process]:
        """``worker``'s live child processes whose command line holds ``marker``."""
        if not worker.alive():
            return []
        found = []
        for child in psutil.Process(worker.info.pid).children():
            try:
                if marker in " ".join(child.cmdline()):
                    found.append(child)
            except psutil.Error:
                continue
        return found

    def name_of(self, identity: str) -> str | None:
        """The worker whose Temporal identity (``pid@host``) this is, if it is one of ours and alive."""
        pid, _, host = identity.partition("@")
        if host != socket.gethostname():
            return None
        for name, worker in self.workers.items():
            if worker.alive() and str(worker.info.pid) == pid:
                return name
            if any(str(child.pid) == pid for child in self.children(worker, "worker trainer")):
                return f"{name}/trainer"
        return None

    async def running(
        self, handle: WorkflowHandle, activity: str, *, after_s: float = 1.0, timeout_s: float = 600.0
    ) -> Fault:
        """Once ``activity`` has run ``after_s`` seconds on one of our workers (or a ``worker all``'s trainer
        child, named ``<name>/trainer``): the fault to record for it (``kind`` left for the caller)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            run_id, pendings = await pending_activities(handle)
            for pending in pendings:
                if (
                    pending.activity_type.name != activity
                    or pending.state != PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
                ):
                    continue
                name = self.name_of(pending.last_worker_identity)
                started = pending.last_started_time.ToDatetime(tzinfo=UTC)
                if name is None or (datetime.now(UTC) - started).total_seconds() < after_s:
                    continue
                return Fault(
                    "",
                    name,
                    datetime.now(UTC),
                    activity,
                    run_id,
                    pending.activity_id,
                    pending.attempt,
                )
            await asyncio.sleep(0.3)
        raise TimeoutError(f"{activity} never ran on one of our workers within {timeout_s:.0f}s")

    async def kill_worker_running(
        self, handle: WorkflowHandle, activity: str, *, after_s: float = 1.0, timeout_s: float = 600.0
    ) -> Fault:
        """Wait until ``activity`` has run ``after_s`` seconds on one of our workers, ``kill -9`` that worker,
        and start it again at once (it polls again after its start-up)."""
        fault = await self.running(handle, activity, after_s=after_s, timeout_s=timeout_s)
        fault.kind, fault.at = "kill worker", datetime.now(UTC)
        self.workers[fault.target].kill()
        self.faults.append(fault)
        log.warning("killed %s running %s (attempt %s)", fault.target, activity, fault.attempt)
        self.spawn(fault.target)
        return fault

    async def stop_server_running(
        self, handle: WorkflowHandle, activity: str, *, after_s: float = 1.0
    ) -> Fault:
        """``kill -STOP`` the inference server of the worker running ``activity`` (a hung engine: its process
        lives and answers nothing); nothing restarts it but the worker's own watch."""
        fault = await self.running(handle, activity, after_s=after_s)
        (server,) = self.children(self.workers[fault.target], "serving.server")
        fault.kind, fault.at, fault.target = "stop server", datetime.now(UTC), f"{fault.target}/server"
        server.send_signal(signal.SIGSTOP)
        self.faults.append(fault)
        log.warning("stopped %s running %s (attempt %s)", fault.target, activity, fault.attempt)
        return fault

    async def _trainer_child_running(
        self, handle: WorkflowHandle, after_s: float
    ) -> tuple[Fault, psutil.Process]:
        """Once a ``worker all``'s trainer child has run train ``after_s`` seconds: the fault to record (``kind``
        left for the caller) and the child."""
        while True:
            fault = await self.running(handle, "train", after_s=after_s)
            if fault.target.endswith("/trainer"):
                break
            await asyncio.sleep(0.3)
        (child,) = self.children(self.workers[fault.target.removesuffix("/trainer")], "worker trainer")
        return fault, child

    async def kill_trainer_child_running(self, handle: WorkflowHandle, *, after_s: float = 1.0) -> Fault:
        """``kill -9`` the trainer child of the ``worker all`` running train; nothing restarts it but its parent."""
        fault, child = await self._trainer_child_running(handle, after_s)
        fault.kind, fault.at = "kill trainer child", datetime.now(UTC)
        child.kill()
        self.faults.append(fault)
        log.warning("killed %s running train (attempt %s)", fault.target, fault.attempt)
        return fault

    async def oom_kill_trainer_child_running(
        self, handle: WorkflowHandle, *, after_s: float = 1.0, headroom_mb: int = 64
    ) -> Fault:
        """The kernel's OOM killer ends the trainer child of the ``worker all`` running train: the child is moved
        into a memory cgroup (v1) that allows ``headroom_mb`` more than it holds, so the step's next allocations
        overrun it. ``fault.at`` is when the child died; raises unless the cgroup counted an OOM kill."""
        fault, child = await self._trainer_child_running(handle, after_s)
        await asyncio.to_thread(oom_kill, child, headroom_mb)
        fault.kind, fault.at = "OOM-kill trainer child", datetime.now(UTC)
        self.faults.append(fault)
        log.warning("OOM-killed %s running train (attempt %s)", fault.target, fault.attempt)
        return fault

    async def kill_worker_now(self, name: str) -> Fault:
        """``kill -9`` worker ``name`` wherever the run is, and start it again at once."""
        fault = Fault("kill worker", name, datetime.now(UTC))
        self.workers[name].kill()
        self.faults.append(fault)
        log.warning("killed %s", name)
        self.spawn(name)
        return fault

    async def kill_server(self, which: str, down_s: float) -> Fault:
        """``kill -9`` the stack's ``temporal`` or ``seaweed`` process, keep it down ``down_s`` seconds, then
        restart it on its recorded ports the way ``dgrpo up`` does."""
        state = self.stack.running()
        info = state.temporal if which == "temporal" else state.seaweed
        fault = Fault(f"kill {which}", which, datetime.now(UTC))
        process = psutil.Process(info.pid)
        process.kill()
        await asyncio.to_thread(process.wait, 10)
        log.warning("killed %s; restarting it in %.0fs", which, down_s)
        await asyncio.sleep(down_s)
        restarted = EmbeddedStack(self.stack.home, free_ports=True, ui=False, tied_to_parent=True)
        self.stack = restarted
        restarted.start()  # in this (main) thread: the server dies with this process, not with a pool thread
        fault.outage_s = (datetime.now(UTC) - fault.at).total_seconds()
        self.faults.append(fault)
        return fault


async def unless_done(result: asyncio.Future[Any], injection: Awaitable[object]) -> None:
    """Run ``injection`` (wait for its moment, strike) unless the run ends first; a failed run raises here."""
    strike = asyncio.ensure_future(injection)
    await asyncio.wait({strike, result}, return_when=asyncio.FIRST_COMPLETED)
    if not strike.done():
        strike.cancel()
        result.result()  # the run failed: say why; done early: nothing left to break
        return
    strike.result()


async def pending_activities(handle: WorkflowHandle) -> tuple[str, list[Any]]:  # type: ignore[type-arg]
    """The current run's id and its pending activities (none while Temporal is unreachable)."""
    try:
        described = await handle.describe()
    except RPCError:
        return "", []
    return described.run_id, list(described.raw_description.pending_activities)


async def wait_for_phase(handle: WorkflowHandle, phase: str, step: int, timeout_s: float = 600.0) -> None:
    """Until the run's status query answers ``phase`` at ``step`` (the step being worked on is ``step``)."""
    from workflows.training_run import TrainingRun

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            status = await handle.query(TrainingRun.status)
        except Exception as err:  # a restarting worker or server: ask again
            log.debug("status not answered: %s", err)
        else:
            if status.phase == phase and status.step == step - 1:
                return
            if status.step >= step or status.phase in ("done", "stopped", "failed"):
                raise MomentPassed(
                    f"the run is past {phase} of step {step} ({status.phase}, step {status.step})"
                )
        await asyncio.sleep(0.3)
    raise TimeoutError(f"the run never reached {phase} of step {step} within {timeout_s:.0f}s")


async def retry_delays(client: Client, workflow_id: str, faults: list[Fault]) -> dict[int, float | None]:
    """For each worker kill (by index in ``faults``): seconds from the kill to the start of the attempt that
    followed, read from the history's ActivityTaskStarted events (None: no later attempt recorded)."""
    started: list[tuple[str, str, int, datetime]] = []  # run id, activity id, attempt, when
    for run_id in sorted({f.run_id for f in faults if f.run_id}):
        scheduled: dict[int, str] = {}  # event id -> activity id
        async for event in client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                scheduled[event.event_id] = event.activity_task_scheduled_event_attributes.activity_id
            elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                attrs = event.activity_task_started_event_attributes
                when = event.event_time.ToDatetime(tzinfo=UTC)
                started.append((run_id, scheduled[attrs.scheduled_event_id], attrs.attempt, when))
    delays: dict[int, float | None] = {}
    for i, fault in enumerate(faults):
        if fault.activity_id is None or fault.attempt is None:
            continue
        later = [
            when
            for run_id, activity_id, attempt, when in started
            if (run_id, activity_id) == (fault.run_id, fault.activity_id) and attempt > fault.attempt
        ]
        delays[i] = (min(later) - fault.at).total_seconds() if later else None
    return delays


def stored_steps(store: ObjectStore, run_id: str, steps: int) -> list[dict[str, int]]:
    """What a faulted run left, checked: the checkpoint of each step 0 to ``steps`` downloaded with every file
    sha256-verified against its manifest (raises on a missing or changed file), and each trained step's
    trajectories table: its rows and its distinct (group, rollout) pairs. bench/chaos.py and
    tests/cluster/observer.py both judge a run by it."""
    found = []
    with tempfile.TemporaryDirectory(prefix="dgrpo-verify-") as scratch:
        for step in range(steps + 1):
            prefix = checkpoint_prefix(run_id, step)
            _, sha256 = store.read_manifest(prefix)
            ref = CheckpointRef(run_id=run_id, step=step, uri=store.uri(prefix), manifest_sha256=sha256)
            download_checkpoint(store, ref, Path(scratch) / str(step))
            if step == 0:
                continue
            table = pq.read_table(pa.BufferReader(store.get_bytes(trajectories_key(run_id, step))))
            pairs = zip(
                table.column("group_index").to_pylist(),
                table.column("trajectory_index").to_pylist(),
                strict=True,
            )
            found.append({"step": step, "rows": table.num_rows, "distinct": len(set(pairs))})
    return found
