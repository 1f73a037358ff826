"""Runs sharing one fleet, on the real Temporal dev server (fairness on, as ``EmbeddedStack`` starts it): real
``TrainingRun`` workflows, scripted activities at the seams, and one inference worker that runs one activity at
a time. Its first rollout holds the slot until every run's rollouts are queued; the order the rest start in is
the order Temporal's matching dispatched them, which each run's priority and fairness decide."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from rich.console import Console
from temporalio import activity, workflow
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker
from workflow_stubs import WORKER_ID, ScriptedActivities

from dgrpo.cli import build_parser
from dgrpo.cli.fleet import cmd_runs
from dgrpo.client.fleet_view import list_runs, runs_table, stage_waits, waits_text
from schemas.config import RunSpec, Scheduling
from schemas.errors import CONFIG_ERROR
from schemas.layout import worker_task_queue
from schemas.run_state import RunState, RunStatus
from schemas.settings import FleetBounds
from workers.worker import WorkerOptions, interceptors
from workflows.training_run import TrainingRun

PERMISSIVE = WorkerOptions(bounds=FleetBounds(highest_priority=1, max_fairness_weight=10))


def fleet_spec(run_id: str, queue: str, shards: int, **overrides: Any) -> RunSpec:
    data: dict[str, Any] = {
        "run_id": run_id,
        "model": {"name": run_id, "project": "fleet", "base_model": "smollm2-135m-instruct"},
        "task": {"rollout": "examples.arithmetic:rollout", "scenarios": "examples.arithmetic:scenarios"},
        "steps": 1,
        "groups_per_step": shards,
        "groups_per_shard": 1,
        "group_size": 2,
        "task_queues": {"control": queue, "inference": f"{queue}-inference", "trainer": queue},
        "metrics": {"wandb": False},
    }
    return RunSpec.model_validate({**data, **overrides})


@contextlib.asynccontextmanager
async def fleet(
    stubs: ScriptedActivities, client: Client, queue: str, opts: WorkerOptions = PERMISSIVE
) -> AsyncIterator[None]:
    """The control and trainer stages on ``queue``, rollouts and reloads on one inference worker that runs
    one activity at a time."""
    control = [
        stubs.latest_checkpoint, stubs.publish_initial, stubs.store_scenarios, stubs.merge_rollouts,
        stubs.judge, stubs.compute_advantages, stubs.train, stubs.metrics_activity, stubs.retain_checkpoints,
    ]  # fmt: skip
    workers = [
        Worker(client, task_queue=queue, workflows=[TrainingRun], activities=control, interceptors=interceptors(opts)),
        Worker(client, task_queue=worker_task_queue(queue, WORKER_ID),
               activities=[stubs.publish, stubs.publish_adapter], interceptors=interceptors(opts)),
        Worker(client, task_queue=f"{queue}-inference", activities=[stubs.rollouts, stubs.reload],
               interceptors=interceptors(opts), max_concurrent_activities=1),
    ]  # fmt: skip
    async with contextlib.AsyncExitStack() as stack:
        for worker in workers:
            await stack.enter_async_context(worker)
        yield


async def start(client: Client, spec: RunSpec) -> WorkflowHandle[TrainingRun, RunStatus]:
    """The run as if continued as new at step 0 (its state given): its first activities are its rollouts, so no
    reload waits for the inference worker's one slot before them."""
    return await client.start_workflow(
        TrainingRun.run, args=[spec, RunState()], id=spec.run_id, task_queue=spec.task_queues.control
    )


async def rollouts_pending(handle: WorkflowHandle[Any, Any], count: int) -> None:
    """Wait until ``count`` of the run's rollouts activities are pending (queued, or the one in the slot)."""
    for _ in range(300):
        described = await handle.describe()
        pending = [
            a for a in described.raw_description.pending_activities if a.activity_type.name == "rollouts"
        ]
        if len(pending) >= count:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{handle.id}: {count} rollouts never became pending")


def started_order(stubs: ScriptedActivities) -> list[str]:
    """The run of each rollouts activity, in the order they started (after the one that held the slot)."""
    return [inp.run_id for inp in stubs.rollout_inputs[1]][1:]


async def scheduled_priorities(handle: WorkflowHandle[Any, Any]) -> set[tuple[int, str, float]]:
    """(priority, fairness key, weight) of every activity the run scheduled, from its history."""
    history = await handle.fetch_history()
    return {
        (a.priority.priority_key, a.priority.fairness_key, round(a.priority.fairness_weight, 3))
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
        for a in [e.activity_task_scheduled_event_attributes]
    }


async def test_runs_share_a_saturated_worker_by_fairness_weight_and_none_starves(
    client: Client, task_queue: str
) -> None:
    """Weights 3 and 1: while both have rollouts queued, they start 3 to 1 (within 20 %), and the light run,
    queued behind the heavy run's whole backlog, starts among the first rollouts (no FIFO wait)."""
    stubs = ScriptedActivities(rollout_gate=asyncio.Event())
    heavy = fleet_spec(f"heavy-{task_queue}", task_queue, shards=30, owner="team-heavy", fairness_weight=3)
    light = fleet_spec(f"light-{task_queue}", task_queue, shards=8, owner="team-light", fairness_weight=1)
    async with fleet(stubs, client, task_queue):
        started = time.monotonic()
        heavy_run = await start(client, heavy)
        await rollouts_pending(heavy_run, 30)  # queued first: FIFO would run all of it before the light run
        light_run = await start(client, light)
        await rollouts_pending(light_run, 8)
        await asyncio.sleep(1.0)  # every queued rollout has now waited at least this long
        rows = {r.run_id: r for r in await list_runs(client) if r.run_id in (heavy.run_id, light.run_id)}
        waited = time.monotonic() - started
        table, listed = await asyncio.to_thread(dgrpo_runs), await asyncio.to_thread(dgrpo_runs, "-o", "json")
        stubs.rollout_gate.set()
        await asyncio.gather(heavy_run.result(), light_run.result())
    order = "".join("L" if run == light.run_id else "H" for run in started_order(stubs))
    assert order.index("L") < 4, f"the light run (L) waited behind the heavy run's backlog: {order}"
    window = order[: order.rindex("L") + 1]  # while both had rollouts queued
    ratio = window.count("H") / window.count("L")
    assert 2.4 <= ratio <= 3.6, f"heavy:light started {ratio:.2f}:1 while both had rollouts queued: {order}"
    assert await scheduled_priorities(heavy_run) == {(3, "team-heavy", 3.0)}
    assert await scheduled_priorities(light_run) == {(3, "team-light", 1.0)}
    # `dgrpo runs` saw both runs waiting on their rollouts, with their owners and weights
    assert rows[heavy.run_id].scheduling == Scheduling(
        priority=3, fairness_key="team-heavy", fairness_weight=3
    )
    waits = {w.stage: w for w in rows[heavy.run_id].waits}
    assert waits["rollouts"].queued + waits["rollouts"].running == 30
    assert rows[light.run_id].waits[0].stage == "rollouts" and rows[light.run_id].waits[0].queued == 8
    assert rows[light.run_id].phase == "rollouts" and rows[light.run_id].step == 0
    shown = Console(file=io.StringIO(), width=250)
    shown.print(runs_table(list(rows.values())))
    assert "team-light (1)" in shown.file.getvalue() and "rollouts: 8 queued" in shown.file.getvalue()
    # ... each queued for as long as it really waited, and whole: `dgrpo runs | grep RUN` finds its row
    for run in (heavy, light):
        queued = next(w for w in rows[run.run_id].waits if w.stage == "rollouts")
        assert 1.0 <= queued.longest_wait_s <= waited + 1.0, (queued, waited)
        line = next((line for line in table.splitlines() if run.run_id in line), None)
        assert line is not None and f"rollouts: {queued.queued} queued" in line, table
    as_json = {r["run_id"]: r for r in json.loads(listed)}
    assert as_json[light.run_id]["waits"][0]["stage"] == "rollouts"
    assert (
        as_json[light.run_id]["waits"][0]["queued"] == 8
        and as_json[light.run_id]["waits"][0]["longest_wait_s"] >= 1
    )
    assert as_json[heavy.run_id]["scheduling"] == {
        "priority": 3,
        "fairness_key": "team-heavy",
        "fairness_weight": 3.0,
    }


def dgrpo_runs(*flags: str) -> str:
    """What ``dgrpo runs FLAGS`` prints off a terminal (piped, as into ``grep`` or a script)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cmd_runs(build_parser().parse_args(["runs", *flags])) == 0
    return out.getvalue()


async def test_a_high_priority_run_overtakes_a_low_priority_backlog(client: Client, task_queue: str) -> None:
    stubs = ScriptedActivities(rollout_gate=asyncio.Event())
    low = fleet_spec(f"low-{task_queue}", task_queue, shards=12, priority=5)
    high = fleet_spec(f"high-{task_queue}", task_queue, shards=6, priority=1)
    async with fleet(stubs, client, task_queue):
        low_run = await start(client, low)
        await rollouts_pending(low_run, 12)
        high_run = await start(client, high)
        await rollouts_pending(high_run, 6)
        stubs.rollout_gate.set()
        await asyncio.gather(low_run.result(), high_run.result())
    order = started_order(stubs)
    assert order == [high.run_id] * 6 + [low.run_id] * 11, order
    assert await scheduled_priorities(high_run) == {(1, "fleet", 1.0)}  # every activity, not only rollouts


@pytest.mark.parametrize(
    ("ask", "refused"),
    [({"priority": 2}, "priority 2 is above the highest this fleet allows, 3 (--highest-priority"),
     ({"fairness_weight": 4}, "fairness_weight 4 is above the largest this fleet allows, 1 (--max-fairness-weight")],
)  # fmt: skip
async def test_a_run_beyond_the_operators_bounds_is_refused_at_its_first_activity(
    client: Client, task_queue: str, ask: dict[str, Any], refused: str
) -> None:
    stubs = ScriptedActivities()
    spec = fleet_spec(f"greedy-{task_queue}", task_queue, shards=1, **ask)
    async with fleet(stubs, client, task_queue, WorkerOptions(bounds=FleetBounds())):
        with pytest.raises(WorkflowFailureError) as failed:
            await (await start(client, spec)).result()
    assert refused in str(failed.value.cause) and failed.value.cause.type == CONFIG_ERROR
    assert stubs.calls == []  # nothing ran: refused before the activity did anything


@activity.defn(name="fails_first")
async def fails_first() -> None:
    if activity.info().attempt == 1:
        raise ApplicationError("the first attempt fails")


@workflow.defn(sandboxed=False)
class RetriesAfterAMinute:
    @workflow.run
    async def run(self) -> None:
        await workflow.execute_activity(
            fails_first,
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(initial_interval=timedelta(seconds=60), maximum_attempts=2),
        )


async def test_a_retry_waiting_out_its_backoff_is_retrying_not_queued(
    client: Client, task_queue: str
) -> None:
    """What ``dgrpo runs`` says of an activity whose attempt failed: its retry comes due in about a minute; no
    worker is awaited yet, so it is no queue wait."""
    async with Worker(
        client, task_queue=task_queue, workflows=[RetriesAfterAMinute], activities=[fails_first]
    ):
        handle = await client.start_workflow(RetriesAfterAMinute.run, id=task_queue, task_queue=task_queue)
        for _ in range(300):
            pending = list((await handle.describe()).raw_description.pending_activities)
            if pending and pending[0].attempt == 2:
                break
            await asyncio.sleep(0.1)
        waits = stage_waits(pending, datetime.now(UTC))
        await handle.terminate("seen")
    assert [(w.stage, w.queued, w.retrying, w.running) for w in waits] == [("fails_first", 0, 1, 0)]
    assert waits[0].next_retry_s is not None and 40 < waits[0].next_retry_s <= 60, waits
    assert waits_text(waits).startswith("fails_first: 1 retrying in ")
