"""What the whole-step benches share: a private embedded stack, the demo's run spec, a timed TrainingRun.

Not a bench itself (``bench/orchestration.py``, ``bench/pipelined.py`` and ``bench/vs_trl.py`` use it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHandle, WorkflowQueryFailedError
from temporalio.service import RPCError

from dgrpo.cli.demo import DEMO_TASKS
from dgrpo.client import run_control
from schemas.activities import ActivityName, RolloutsInput
from schemas.config import RunSpec, TaskQueues, load_run_spec
from schemas.layout import adapter_name
from schemas.run_state import RunStatus
from schemas.settings import ENV_HOME
from workers.stack import EmbeddedStack
from workflows.training_run import TrainingRun

OUT = Path(__file__).resolve().parent / "out"
"""Where benches write their JSON and markdown (ignored by git)."""


def command_line() -> str:
    """The exact command that ran this bench, to print with its results."""
    return "PYTHONPATH=$PWD python " + shlex.join(sys.argv)


def write_results(name: str, results: dict[str, Any], markdown: str) -> None:
    OUT.mkdir(exist_ok=True)
    (OUT / f"{name}.json").write_text(json.dumps(results, indent=2) + "\n")
    (OUT / f"{name}.md").write_text(markdown + "\n")
    print(markdown)
    print(f"\nresults: {OUT / name}.json and .md")


@contextmanager
def private_stack(keep: bool = False) -> Iterator[tuple[EmbeddedStack, Path]]:
    """An embedded stack on free ports in a temporary ``DGRPO_HOME``, exported to this process's environment
    (its children, workers included, find it); stopped afterwards."""
    home = Path(tempfile.mkdtemp(prefix="dgrpo-bench-"))
    stack = EmbeddedStack(home, free_ports=True, ui=False, tied_to_parent=True)
    stack.start()
    os.environ.update({**stack.env(), ENV_HOME: str(home)})
    try:
        yield stack, home
    finally:
        stack.stop()
        if not keep:
            import shutil

            shutil.rmtree(home, ignore_errors=True)


def demo_run_spec(run_id: str, steps: int, queues: TaskQueues, **overrides: Any) -> RunSpec:
    """``examples/run.toml`` (the demo's arithmetic task and settings) on ``queues``, without W&B."""
    values: dict[str, Any] = {
        "run_id": run_id,
        "steps": steps,
        "metrics.wandb": False,
        "task_queues.control": queues.control,
        "task_queues.inference": queues.inference,
        "task_queues.trainer": queues.trainer,
        **overrides,
    }
    return load_run_spec(DEMO_TASKS["arithmetic"], values)


@dataclass
class TimedRun:
    """A finished ``TrainingRun`` and when each step was served (seconds after its start)."""

    status: RunStatus | None
    """The workflow's final status (None for runs that did not go through Temporal)."""
    served_at: dict[int, float] = field(default_factory=dict)
    """Step -> seconds from the start until its adapter was served (step 0: the run's start-up)."""
    total_s: float = 0.0

    def step_seconds(self) -> dict[int, float]:
        """Step n -> time from step n-1 served to step n served."""
        return {
            n: self.served_at[n] - self.served_at[n - 1]
            for n in sorted(self.served_at)
            if n - 1 in self.served_at
        }


async def timed_run(client: Client, spec: RunSpec, watch_s: float | None = None) -> TimedRun:
    """Start ``spec``, wait for its end and time its steps from its history (``served_times``); with
    ``watch_s``, a client meanwhile asks the run for its status every ``watch_s`` seconds (as ``dgrpo train``
    does every second), to see what watching costs."""
    started = time.perf_counter()
    handle = await run_control.start_run(client, spec)
    result = asyncio.ensure_future(handle.result())
    watcher = None if watch_s is None else asyncio.create_task(watch(handle, result, watch_s))
    served = await served_times(client, handle)
    final = await result
    if watcher is not None:
        await watcher
    return TimedRun(status=final, served_at=served, total_s=time.perf_counter() - started)


async def watch(handle: WorkflowHandle[Any, Any], result: asyncio.Future[Any], every_s: float) -> None:
    """Query the run's status every ``every_s`` until ``result`` is done."""
    while not result.done():
        with contextlib.suppress(RPCError, WorkflowQueryFailedError):  # a busy worker: ask again
            await handle.query(TrainingRun.status)
        await asyncio.wait({result}, timeout=every_s)


async def served_times(client: Client, handle: WorkflowHandle[Any, Any]) -> dict[int, float]:
    """Step k -> seconds from the run's start until its k-th ``reload`` activity completed (step 0: the
    run's first adapter served), as Temporal's history records them, across continue-as-new.

    The history streams from the server as it grows (a long poll): nothing asks the workers anything, where
    asking the workflow for its status every 0.1 s (a query each) kept the worker's process and the
    Temporal server busy beside the step being timed."""
    served: dict[int, float] = {}
    start = None
    run_id: str | None = handle.first_execution_run_id or handle.run_id
    while run_id:
        run, run_id = client.get_workflow_handle(handle.id, run_id=run_id), None
        scheduled: dict[int, str] = {}
        async for event in run.fetch_history_events(wait_new_event=True):
            at = event.event_time.ToDatetime()
            start = start or at
            if event.HasField("activity_task_scheduled_event_attributes"):
                scheduled[event.event_id] = event.activity_task_scheduled_event_attributes.activity_type.name
            elif event.HasField("activity_task_completed_event_attributes"):
                attributes = event.activity_task_completed_event_attributes
                if scheduled.get(attributes.scheduled_event_id) == ActivityName.RELOAD:
                    served[len(served)] = (at - start).total_seconds()
            elif event.HasField("workflow_execution_continued_as_new_event_attributes"):
                run_id = event.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
    return served


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


@dataclass
class ActivitySpan:
    """One completed activity of a run, as Temporal's history records it (epoch seconds)."""

    name: str
    step: int
    """From the activity's summary (``step <n>``); -1 without one."""
    scheduled: float
    started: float
    closed: float
    result: dict[str, Any] | None
    """Its result, decoded (a JSON object), else None."""


async def activity_spans(client: Client, workflow_id: str) -> list[ActivitySpan]:
    """Every completed activity of the run ``workflow_id``, across continue-as-new, in the order they closed."""
    spans: list[ActivitySpan] = []
    first = client.get_workflow_handle(workflow_id)
    run_id: str | None = (await first.describe()).raw_description.workflow_execution_info.first_run_id
    while run_id:
        handle, run_id = client.get_workflow_handle(workflow_id, run_id=run_id), None
        scheduled: dict[int, tuple[str, int, float]] = {}
        started: dict[int, float] = {}
        async for event in handle.fetch_history_events():
            at = event.event_time.ToMicroseconds() / 1e6
            if event.HasField("activity_task_scheduled_event_attributes"):
                name = event.activity_task_scheduled_event_attributes.activity_type.name
                match = re.match(r"step (\d+)", json.loads(event.user_metadata.summary.data or b'""'))
                scheduled[event.event_id] = (name, int(match.group(1)) if match else -1, at)
            elif event.HasField("activity_task_started_event_attributes"):
                started[event.activity_task_started_event_attributes.scheduled_event_id] = at
            elif event.HasField("activity_task_completed_event_attributes"):
                done = event.activity_task_completed_event_attributes
                name, step, at_scheduled = scheduled[done.scheduled_event_id]
                payloads = done.result.payloads
                try:
                    result = json.loads(payloads[0].data) if payloads else None
                except ValueError:
                    result = None
                if not isinstance(result, dict):
                    result = None
                spans.append(
                    ActivitySpan(name, step, at_scheduled, started[done.scheduled_event_id], at, result)
                )
            elif event.HasField("workflow_execution_continued_as_new_event_attributes"):
                run_id = event.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
    return spans


SCORING = (ActivityName.ROLLOUTS, ActivityName.MERGE_ROLLOUTS, ActivityName.JUDGE)
"""The activities that make a step's data: its scored rollouts (advantages are durability's, and cheap)."""


def trainer_idle(spans: list[ActivitySpan]) -> dict[int, float]:
    """Step n -> seconds the trainer sat idle before training step n that neither its data (step n's scored
    rollouts) nor the previous training explains: train n's start - max(train n-1's end, step n scored)."""
    trains = {s.step: s for s in spans if s.name == ActivityName.TRAIN}  # a step's last training
    ready: dict[int, float] = {}
    for s in spans:  # a step's last scoring activity (of its last round, when it was rolled out again)
        if s.name in SCORING:
            ready[s.step] = max(ready.get(s.step, 0.0), s.closed)
    return {
        n: train.started - max(trains[n - 1].closed, ready[n])
        for n, train in sorted(trains.items())
        if n - 1 in trains and n in ready
    }


def step_rollouts(spec: RunSpec, step: int) -> RolloutsInput:
    """Step ``step``'s rollouts as a sync run schedules them: sampled by step ``step - 1``'s adapter, on the
    step's own slice of the scenarios."""
    return RolloutsInput(
        run_id=spec.run_id,
        step=step,
        model_name=spec.model.name,
        adapter=adapter_name(spec.run_id, step - 1),
        policy_step=step - 1,
        task=spec.task,
        groups_per_step=spec.groups_per_step,
        group_size=spec.group_size,
        scenario_offset=(step - 1) * spec.groups_per_step,
        seed=spec.seed,
    )
