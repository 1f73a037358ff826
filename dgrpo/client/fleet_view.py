"""One view of the fleet: every ``TrainingRun`` on the cluster, its step, reward, pace, priority and what it waits on.

Runs are listed through Temporal's visibility API (``WorkflowType = 'TrainingRun'``), each one's ``status``
query gives its step, reward, recent step times and priority, and its pending activities (``describe``) say
what it waits on: per stage, activities queued for a worker (and how long the longest of them has waited since
it was scheduled, or since its retry came due), waiting out a retry's backoff, and running. ``dgrpo runs``
prints it as a table (whole run ids, on a terminal or not) or as JSON.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime

from pydantic import BaseModel, Field
from rich.table import Table
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.api.workflow.v1 import PendingActivityInfo
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowQueryFailedError
from temporalio.service import RPCError

from schemas.config import Scheduling
from schemas.run_state import RunStatus

RECENT_STEPS = 5
"""Steps per hour is measured over the run's newest this many steps."""
CONCURRENT_QUERIES = 16


class StageWait(BaseModel):
    """A stage's pending activities: queued for a worker, waiting out a retry's backoff, and running on one."""

    stage: str
    queued: int = 0
    """Attempts due now that no worker has taken yet."""
    retrying: int = 0
    """Attempts that failed and wait out their retry's backoff before they are queued again."""
    running: int = 0
    longest_wait_s: float = 0.0
    """How long the longest-queued of them has waited for a worker so far (since it was scheduled, or since its
    retry came due)."""
    next_retry_s: float | None = None
    """In how long the soonest of the retries comes due (None: none backs off)."""


class RunRow(BaseModel):
    """One run as ``dgrpo runs`` shows it."""

    run_id: str
    state: str
    """Temporal's status of the run's newest execution (``RUNNING``, ``COMPLETED``, ``FAILED``, ...)."""
    step: int | None = None
    steps: int | None = None
    phase: str | None = None
    reward: float | None = None
    steps_per_hour: float | None = None
    scheduling: Scheduling = Field(default_factory=Scheduling)
    waits: list[StageWait] = Field(default_factory=list)
    error: str | None = None
    """The run's own error, or why its status could not be read."""


def steps_per_hour(status: RunStatus) -> float | None:
    """From the wall time of the newest ``RECENT_STEPS`` steps (queue waits included)."""
    seconds = [h.seconds["step"] for h in status.history[-RECENT_STEPS:] if h.seconds.get("step")]
    return 3600.0 * len(seconds) / sum(seconds) if seconds else None


def stage_waits(pending: Sequence[PendingActivityInfo], now: datetime) -> list[StageWait]:
    """What the pending activities say the run waits on, per stage."""
    stages: dict[str, StageWait] = {}
    for activity in pending:
        wait = stages.setdefault(activity.activity_type.name, StageWait(stage=activity.activity_type.name))
        if activity.state != PendingActivityState.PENDING_ACTIVITY_STATE_SCHEDULED:
            wait.running += 1
        elif activity.HasField(
            "next_attempt_schedule_time"
        ):  # the server sets it only while a retry backs off
            due = (activity.next_attempt_schedule_time.ToDatetime(tzinfo=UTC) - now).total_seconds()
            wait.retrying += 1
            wait.next_retry_s = max(
                0.0, min(due, wait.next_retry_s if wait.next_retry_s is not None else due)
            )
        else:  # due: scheduled_time is when (the retry's, for a later attempt)
            wait.queued += 1
            if activity.HasField("scheduled_time"):
                waited = (now - activity.scheduled_time.ToDatetime(tzinfo=UTC)).total_seconds()
                wait.longest_wait_s = max(wait.longest_wait_s, waited)
    return sorted(stages.values(), key=lambda w: (-w.queued, w.stage))


async def run_row(client: Client, run_id: str, state: WorkflowExecutionStatus | None) -> RunRow:
    row = RunRow(run_id=run_id, state=state.name if state is not None else "UNKNOWN")
    handle = client.get_workflow_handle(run_id)
    try:
        status = await handle.query("status", result_type=RunStatus)
        if state == WorkflowExecutionStatus.RUNNING:
            described = await handle.describe()
            now = datetime.now(UTC)
            row.waits = stage_waits(described.raw_description.pending_activities, now)
    except (RPCError, WorkflowQueryFailedError) as err:
        row.error = f"status not read: {err}"
        return row
    newest = status.history[-1] if status.history else None
    row.step, row.steps, row.phase, row.error = status.step, status.steps, status.phase, status.error
    row.reward = newest.reward_mean if newest is not None else None
    row.steps_per_hour = steps_per_hour(status)
    row.scheduling = status.scheduling
    return row


async def list_runs(client: Client, include_closed: bool = False, limit: int = 200) -> list[RunRow]:
    """Every running ``TrainingRun`` (``include_closed``: ended ones too, newest first), at most ``limit``."""
    query = "WorkflowType = 'TrainingRun'"
    if not include_closed:
        query += " AND ExecutionStatus = 'Running'"
    newest: dict[str, WorkflowExecutionStatus | None] = {}
    async for execution in client.list_workflows(query):
        if execution.status == WorkflowExecutionStatus.CONTINUED_AS_NEW:
            continue  # an earlier stretch of a run whose newest execution is listed too
        newest.setdefault(execution.id, execution.status)
        if len(newest) >= limit:
            break
    slots = asyncio.Semaphore(CONCURRENT_QUERIES)

    async def row(run_id: str) -> RunRow:
        async with slots:
            return await run_row(client, run_id, newest[run_id])

    return list(await asyncio.gather(*(row(run_id) for run_id in newest)))


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f}s"
    return f"{seconds / 60:.0f}m" if seconds < 5400 else f"{seconds / 3600:.1f}h"


def waits_text(waits: Sequence[StageWait]) -> str:
    parts = []
    for w in waits:
        if w.queued:
            parts.append(f"{w.stage}: {w.queued} queued ({_duration(w.longest_wait_s)})")
        if w.retrying:
            parts.append(f"{w.stage}: {w.retrying} retrying in {_duration(w.next_retry_s or 0.0)}")
        if w.running:
            parts.append(f"{w.stage}: {w.running} running")
    return ", ".join(parts) or "-"


def runs_table(rows: Sequence[RunRow]) -> Table:
    table = Table(title=f"{len(rows)} run(s)", title_justify="left")
    for column in (
        "run",
        "state",
        "step",
        "phase",
        "reward",
        "steps/h",
        "priority",
        "owner (weight)",
        "waits on",
    ):
        table.add_column(
            column,
            justify="right" if column in ("step", "reward", "steps/h") else "left",
            overflow="fold" if column in ("run", "waits on") else "ellipsis",  # never cut: folded when narrow
        )
    for r in rows:
        s = r.scheduling
        table.add_row(
            r.run_id,
            r.state.lower(),
            "-" if r.step is None else f"{r.step}/{r.steps}",
            r.phase or "-",
            "-" if r.reward is None else f"{r.reward:.3f}",
            "-" if r.steps_per_hour is None else f"{r.steps_per_hour:.1f}",
            "-" if s.priority is None else str(s.priority),
            "-" if s.fairness_key is None else f"{s.fairness_key} ({s.fairness_weight or 1:g})",
            waits_text(r.waits) if r.error is None else f"{waits_text(r.waits)}; {r.error}",
        )
    return table
