"""Servable before resumable on the real stack: real Temporal, real S3, the session's ``dgrpo worker all`` (CPU
server, control) and real trainer workers, SmolLM2; checked against the run's Temporal history and its store.

- A real trainer killed after step 1 is served and before it is resumable (its optimizer state's upload stalls,
  then the process is killed and its disk lost; it comes back under the same worker id without it): the run
  resumes exactly from checkpoint 0, trains step 1 again, serves that, and trains step 2 only on rollouts its
  adapter sampled, by their sha256 (docs/pipelining.md#servable-before-resumable).
- Retention with ``keep_last = 1`` behind a slow metrics stage, in sync and pipelined mode: no checkpoint is
  deleted while it is served, reloaded or sampled with (docs/pipelining.md#retention-decides-when-it-deletes).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Worker

from activities.checkpoints import adapter_ref
from activities.metrics import MetricsActivities
from activities.object_store import ObjectStore
from activities.retention import RetentionActivities, complete_checkpoint_steps
from activities.rollouts import RolloutActivities
from activities.serving import ServingActivities
from activities.trajectory_store import download_groups
from dgrpo.client import run_control
from schemas.activities import ActivityName, MetricsInput, RetentionInput, RolloutsInput
from schemas.config import RunSpec, TaskQueues
from schemas.layout import checkpoint_prefix
from schemas.refs import CheckpointRef, TrajectoriesRef
from schemas.run_state import RunStatus
from schemas.settings import S3Settings
from workers.launcher import WorkerProcess
from workers.stack import EmbeddedStack
from workers.temporal import connect_client
from workers.worker import WorkerOptions, control_activities, interceptors
from workflows.training_run import TrainingRun
from workflows.versioned import WORKFLOWS

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
HEARTBEAT_S = 10.0
"""The runs' heartbeat timeout (the least a run may set): the killed trainer's upload is retried this long after."""


@pytest.fixture(scope="module")
def queues(shared_queues: TaskQueues, shared_worker: WorkerProcess) -> TaskQueues:
    """The session worker's control and inference queues; trainers of each test's own."""
    return shared_queues


def spec_of(run_id: str, queues: TaskQueues, **overrides: Any) -> RunSpec:
    data = json.loads((REPO / "examples" / "run.json").read_text())
    data.update(run_id=run_id, task_queues=queues.model_dump(), metrics={"wandb": False})
    data.update(heartbeat_timeout_s=HEARTBEAT_S, **overrides)
    data["model"]["name"] = run_id
    data["train"] = {"learning_rate": 2e-4}
    return RunSpec.model_validate(data)


@dataclass
class Span:
    """One activity of a run, as its Temporal history has it (server clock)."""

    name: str
    input: Any
    scheduled: float
    started: float | None = None
    closed: float | None = None
    result: Any = None
    failure: str | None = None


def decoded(payloads: Any) -> Any:
    """An activity's one input or result, as JSON (None for none)."""
    return json.loads(payloads[0].data) if payloads and payloads[0].data else None


async def spans_of(client: Client, run_id: str) -> list[Span]:
    """Every activity of the run, every execution of its continue-as-new chain, in the order scheduled."""
    spans: list[Span] = []
    execution: str | None = (await client.get_workflow_handle(run_id).describe()).raw_description.workflow_execution_info.first_run_id  # fmt: skip
    while execution:
        handle, execution = client.get_workflow_handle(run_id, run_id=execution), None
        by_id: dict[int, Span] = {}
        async for event in handle.fetch_history_events():
            at = event.event_time.ToMicroseconds() / 1e6
            if event.HasField("activity_task_scheduled_event_attributes"):
                scheduled = event.activity_task_scheduled_event_attributes
                span = Span(scheduled.activity_type.name, decoded(scheduled.input.payloads), at)
                by_id[event.event_id] = span
                spans.append(span)
            elif event.HasField("activity_task_started_event_attributes"):
                by_id[event.activity_task_started_event_attributes.scheduled_event_id].started = at
            elif event.HasField("activity_task_completed_event_attributes"):
                done = event.activity_task_completed_event_attributes
                span = by_id[done.scheduled_event_id]
                span.closed = at
                span.result = decoded(done.result.payloads)
            elif event.HasField("activity_task_failed_event_attributes"):
                failed = event.activity_task_failed_event_attributes
                span = by_id[failed.scheduled_event_id]
                span.closed, span.failure = at, failed.failure.application_failure_info.type or "failed"
            elif event.HasField("activity_task_timed_out_event_attributes"):
                timed_out = event.activity_task_timed_out_event_attributes
                span = by_id[timed_out.scheduled_event_id]
                span.closed, span.failure = at, "timed out"
            elif event.HasField("workflow_execution_continued_as_new_event_attributes"):
                execution = event.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
    return spans


def done(spans: list[Span], name: str, step: int | None = None) -> list[Span]:
    """Completed activities ``name`` (of ``step``: its input's step, a reload's checkpoint's), in order."""

    def step_of(span: Span) -> int:
        inp = span.input
        return int(inp["checkpoint"]["step"] if name == ActivityName.RELOAD else inp["step"])

    return [s for s in spans if s.name == name and s.failure is None and s.closed is not None
            and (step is None or step_of(s) == step)]  # fmt: skip


# --- the crash between servable and resumable ---------------------------------------------------------------


@pytest.fixture
def trainer_queues(queues: TaskQueues) -> TaskQueues:
    return queues.model_copy(update={"trainer": f"sv-t-{uuid.uuid4().hex[:8]}"})


@pytest.fixture
def trainers(tmp_path: Path) -> Iterator[list[WorkerProcess]]:
    """The trainer workers a test starts, stopped at its end however it ends."""
    started: list[WorkerProcess] = []
    yield started
    for worker in started:
        worker.stop(timeout=10)


def trainer(
    home: Path, queues: TaskQueues, worker_id: str, *, log: str, stall_step: int | None = None
) -> WorkerProcess:
    """``dgrpo worker trainer`` with its worker id, staging on ``home``'s disk; with ``stall_step``, that step's
    optimizer state never finishes uploading (tests/workflows/stalled_upload.py)."""
    proc = WorkerProcess(
        "trainer", home / f"trainer-{log}.log", task_queues=queues, cwd=REPO,
        extra_args=["--worker-id", worker_id, "--staging", str(home / "disk")],
    )  # fmt: skip
    if stall_step is not None:
        proc.child.argv[1:3] = ["-m", "tests.workflows.stalled_upload", "--step", str(stall_step)]
    return proc


async def test_a_trainer_killed_after_its_step_is_served_and_before_it_is_resumable(
    stack: EmbeddedStack,
    trainer_queues: TaskQueues,
    trainers: list[WorkerProcess],
    s3_settings: S3Settings,
    tmp_path: Path,
) -> None:
    client = await connect_client(address=stack.temporal_address)
    store = ObjectStore(s3_settings)
    worker_id = f"sv-{uuid.uuid4().hex[:6]}"
    lost = trainer(tmp_path, trainer_queues, worker_id, log="lost", stall_step=1)
    trainers.append(lost)
    await asyncio.to_thread(lost.start)
    spec = spec_of(f"sv-kill-{uuid.uuid4().hex[:6]}", trainer_queues, steps=2)
    handle = await run_control.start_run(client, spec)
    # Its replacement (the machine back under its worker id) starts meanwhile: sync mode sends a trainer nothing
    # between step 1's adapter and step 1's optimizer state, which the lost one holds.
    back = trainer(tmp_path, trainer_queues, worker_id, log="back")
    trainers.append(back)
    starting = asyncio.ensure_future(asyncio.to_thread(back.start))
    for _ in range(3000):  # step 1 served ...
        if (await handle.query(TrainingRun.status)).step >= 1:
            break
        await asyncio.sleep(0.2)
    newest = store.latest_checkpoint(spec.run_id)
    assert (
        newest is not None and newest.step == 0
    )  # ... not resumable: its optimizer state is still uploading
    await starting
    lost.kill()
    shutil.rmtree(tmp_path / "disk")  # its disk is lost with it
    final = await asyncio.wait_for(handle.result(), 600)

    assert final.phase == "done" and final.step == 2, final.error
    spans = await spans_of(client, spec.run_id)
    checkpoint_0 = CheckpointRef.model_validate(done(spans, ActivityName.PUBLISH_INITIAL)[0].result)
    # Step 1 trained twice: on the lost trainer, then again exactly from checkpoint 0 (the newest resumable).
    first, again = done(spans, ActivityName.TRAIN, 1)
    assert (
        first.input["start_from"] is None
        or CheckpointRef.model_validate(first.input["start_from"]) == checkpoint_0
    )
    assert again.input["start_from"] is not None
    assert CheckpointRef.model_validate(again.input["start_from"]) == checkpoint_0
    assert again.result["worker_id"] == worker_id
    # Served first from the lost adapter, then from the one trained again; the run holds the second.
    [served] = done(spans, ActivityName.PUBLISH_ADAPTER, 1)
    lost_sha = served.result["adapter_sha256"]
    reloads = [r.result["adapter_sha256"] for r in done(spans, ActivityName.RELOAD, 1)]
    checkpoint_1 = store.latest_checkpoint(spec.run_id)
    assert checkpoint_1 is not None and checkpoint_1.step == 2
    held = adapter_ref(store, CheckpointRef.model_validate(done(spans, ActivityName.PUBLISH, 1)[-1].result))[
        0
    ]
    assert reloads[0] == lost_sha and reloads[-1] == held.adapter_sha256
    summary = final.history[0]
    assert summary.trained_again and summary.adapter_sha256 == held.adapter_sha256
    assert summary.checkpoint is not None and adapter_ref(store, summary.checkpoint)[0] == held
    # Step 2 trained only on rollouts the held adapter sampled, by content: the lost adapter's were rolled out
    # again (unless training again came out the same adapter, bit for bit).
    trained_on = done(spans, ActivityName.ADVANTAGES, 2)[-1].input["trajectories"]
    assert trained_on["policy_adapters"] == [held.adapter_sha256]
    groups = download_groups(store, trained_on["ref"]["uri"])
    assert {t.policy_sha256 for g in groups for t in g.trajectories} == {held.adapter_sha256}
    merges = done(spans, ActivityName.MERGE_ROLLOUTS, 2)
    if lost_sha != held.adapter_sha256:
        assert len(merges) == 2 and merges[0].result["policy_adapters"] == [lost_sha]
        assert final.dropped_lost_adapter_groups == spec.groups_per_step
    else:
        assert len(merges) == 1 and final.dropped_lost_adapter_groups == 0
    print(f"step 1 trained again into {'another' if lost_sha != held.adapter_sha256 else 'the same'} adapter")


# --- retention behind a slow metrics stage ------------------------------------------------------------------


@dataclass
class SlowStages:
    """The real control and inference activities of this test's own workers, two of them held as the world holds
    them: a step's metrics as a slow sink (W&B online) does, and a pipelined step's rollouts sampling an older
    policy as a slow environment does, until a newer checkpoint is resumable."""

    client: Client
    store: ObjectStore
    metrics: MetricsActivities
    rollouts: RolloutActivities
    steps: int = 0
    held_metrics: list[int] = field(default_factory=list)
    held_rollouts: list[tuple[int, int]] = field(default_factory=list)
    """(step, policy) of each rollouts activity held."""
    retained: int = 0

    async def _until(self, run_id: str, done: Any, bound_s: float = 120.0) -> None:
        for _ in range(int(bound_s / 0.2)):
            status = await self.client.get_workflow_handle_for(TrainingRun.run, run_id).query(
                TrainingRun.status
            )
            newest = await asyncio.to_thread(self.store.latest_checkpoint, run_id)
            if status.phase in ("metrics", "done", "failed") or done(
                status, -1 if newest is None else newest.step
            ):
                return
            await asyncio.sleep(0.2)

    @activity.defn(name=ActivityName.METRICS)
    async def log_metrics(self, inp: MetricsInput) -> None:
        """Step n's metrics written once step n + 2 is served and resumable (or the run has no such step)."""
        last = min(inp.step + 2, self.steps)
        await self._until(inp.run_id, lambda status, newest: status.step >= last and newest >= last)
        self.held_metrics.append(inp.step)
        await self.metrics.log_metrics(inp)

    @activity.defn(name=ActivityName.ROLLOUTS)
    async def sample(self, inp: RolloutsInput) -> TrajectoriesRef:
        """The last step's rollouts, when they sample policy p < step - 1 (pipelined), go on once checkpoint p + 1
        is resumable and step p - 1's retention is done: they sample a policy that is no longer the newest."""
        if inp.step == self.steps and inp.policy_step < inp.step - 1:
            self.held_rollouts.append((inp.step, inp.policy_step))
            await self._until(inp.run_id, lambda _, newest: newest > inp.policy_step
                              and self.retained >= inp.policy_step - 1)  # fmt: skip
        return await self.rollouts.rollouts(inp)


@pytest.fixture
async def slow_stages(
    stack: EmbeddedStack,
    queues: TaskQueues,
    shared_worker: WorkerProcess,
    s3_settings: S3Settings,
    tmp_path: Path,
) -> AsyncIterator[tuple[TaskQueues, SlowStages]]:
    """Control and inference workers of this test's own (the workflows, the real control activities, the real
    inference activities on the session worker's server), their metrics and some rollouts slow."""
    client = await connect_client(address=stack.temporal_address)
    store = ObjectStore(s3_settings)
    own = queues.model_copy(
        update={"control": f"sv-c-{uuid.uuid4().hex[:8]}", "inference": f"sv-i-{uuid.uuid4().hex[:8]}"}
    )
    serving = ServingActivities(
        shared_worker.server_urls, store, adapter_root=shared_worker.log_path.parent / "adapters"
    )
    slow = SlowStages(client, store, MetricsActivities(store, local_dir=tmp_path),
                      RolloutActivities(shared_worker.server_urls, store, serving=serving))  # fmt: skip
    retention = RetentionActivities(store)

    @activity.defn(name=ActivityName.RETAIN_CHECKPOINTS)
    async def retain(inp: RetentionInput) -> list[int]:
        deleted = await retention.retain_checkpoints(inp)
        slow.retained += 1
        return deleted

    opts = WorkerOptions()
    control = [a for a in control_activities(store, None, opts) if getattr(a, "__name__", "") not in
               ("log_metrics", "retain_checkpoints")]  # fmt: skip
    workers = [
        Worker(client, task_queue=own.control, workflows=WORKFLOWS, activities=[*control, slow.log_metrics, retain],
               interceptors=interceptors(opts)),
        Worker(client, task_queue=own.inference, activities=[slow.sample, *serving.all()],
               interceptors=interceptors(opts)),
    ]  # fmt: skip
    async with contextlib.AsyncExitStack() as running:
        for worker in workers:
            await running.enter_async_context(worker)
        yield own, slow


def assert_nothing_held_was_deleted(spans: list[Span]) -> list[int]:
    """Each retention's deletions against what the run held while it ran: the served step, the policies rollouts
    were sampling with, the steps being reloaded. The steps it deleted."""
    reloads = done(spans, ActivityName.RELOAD)
    deleted_all: list[int] = []
    for retention in done(spans, ActivityName.RETAIN_CHECKPOINTS):
        start, end = retention.started or retention.scheduled, retention.closed or retention.scheduled
        served = [
            r.input["checkpoint"]["step"] for r in reloads if r.closed is not None and r.closed <= start
        ][-1:]
        served += [
            r.input["checkpoint"]["step"] for r in reloads if r.closed is not None and start < r.closed <= end
        ]
        reloading = [
            r.input["checkpoint"]["step"]
            for r in reloads
            if r.scheduled <= end and (r.closed or end) >= start
        ]
        sampling = [s.input["policy_step"] for s in spans if s.name == ActivityName.ROLLOUTS
                    and s.scheduled <= end and (s.closed or end) >= start]  # fmt: skip
        deleted = retention.result or []
        held = set(served) | set(reloading) | set(sampling)
        assert not set(deleted) & held, (
            deleted,
            {"served": served, "reloading": reloading, "sampling": sampling},
        )
        deleted_all += deleted
    return deleted_all


@pytest.mark.parametrize(("mode", "steps"), [("pipelined", 4), ("sync", 2)])
async def test_retention_behind_slow_metrics_never_deletes_what_the_run_holds(
    stack: EmbeddedStack,
    slow_stages: tuple[TaskQueues, SlowStages],
    s3_settings: S3Settings,
    mode: str,
    steps: int,
) -> None:
    """Step n's retention runs once step n + 2 is served and resumable. Pipelined, step 4's rollouts sample policy
    2 meanwhile: with what to keep worked out when step 1 was served, step 1's retention deleted checkpoint 2
    under them (issue 45)."""
    own, slow = slow_stages
    slow.steps = steps
    client = await connect_client(address=stack.temporal_address)
    spec = spec_of(f"sv-keep-{mode[0]}-{uuid.uuid4().hex[:6]}", own, steps=steps, mode=mode,
                   checkpoints={"keep_last": 1})  # fmt: skip
    handle: WorkflowHandle[TrainingRun, RunStatus] = await run_control.start_run(client, spec)
    final = await asyncio.wait_for(handle.result(), 900)
    assert final.phase == "done" and final.step == steps, final.error
    assert slow.held_metrics == list(range(1, steps + 1))
    if mode == "pipelined":  # the held rollouts sampled policy 2 while checkpoint 3 was resumable
        assert (4, 2) in slow.held_rollouts, slow.held_rollouts
    spans = await spans_of(client, spec.run_id)
    deleted = assert_nothing_held_was_deleted(spans)
    assert sorted(deleted) == list(range(steps))  # every checkpoint but the last went, each once
    store = ObjectStore(s3_settings)
    assert complete_checkpoint_steps(store, spec.run_id) == [steps]
    assert all(store.list(checkpoint_prefix(spec.run_id, step)) == [] for step in deleted)
