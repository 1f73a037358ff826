"""A run's priority and fairness weight, held to the worker operator's bounds at each activity it runs.

A run asks for its place in the queues (``RunSpec.priority``, ``fairness_weight``) and every activity it
schedules carries it (``workflows/stages.py``). The bounds are the operator's (``FleetBounds``: flags and
environment), so they are checked where the work is done: every worker refuses an activity whose priority or
weight is beyond its bounds with a non-retryable ``ConfigError`` naming the setting, which fails the run at its
first activity. Checked here rather than in the workflow, a workflow of the user's own that schedules our
activities with priority 1 is refused the same way.
"""

from __future__ import annotations

from typing import Any

from temporalio import activity
from temporalio.common import Priority
from temporalio.exceptions import ApplicationError
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from schemas.errors import CONFIG_ERROR
from schemas.settings import ENV_HIGHEST_PRIORITY, ENV_MAX_FAIRNESS_WEIGHT, FleetBounds


class Admission(Interceptor):
    """Register on every ``Worker``: activities beyond ``bounds`` are refused."""

    def __init__(self, bounds: FleetBounds) -> None:
        self.bounds = bounds

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Admitting(next, self.bounds)


class _Admitting(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, bounds: FleetBounds) -> None:
        super().__init__(next)
        self.bounds = bounds

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        refusal = refusal_of(activity.info().priority, self.bounds)
        if refusal is not None:
            raise ApplicationError(refusal, type=CONFIG_ERROR, non_retryable=True)
        return await self.next.execute_activity(input)


def refusal_of(priority: Priority, bounds: FleetBounds) -> str | None:
    """Why ``priority`` is beyond ``bounds`` (None: within them; unset fields are Temporal's defaults)."""
    problems = []
    if priority.priority_key is not None and priority.priority_key < bounds.highest_priority:
        problems.append(
            f"priority {priority.priority_key} is above the highest this fleet allows, "
            f"{bounds.highest_priority} (--highest-priority / {ENV_HIGHEST_PRIORITY}): set the run's priority "
            f"to {bounds.highest_priority} or more"
        )
    weight = priority.fairness_weight
    if weight is not None and weight > bounds.max_fairness_weight:
        problems.append(
            f"fairness_weight {weight:g} is above the largest this fleet allows, {bounds.max_fairness_weight:g} "
            f"(--max-fairness-weight / {ENV_MAX_FAIRNESS_WEIGHT}): set the run's fairness_weight to at most "
            f"{bounds.max_fairness_weight:g}"
        )
    if not problems:
        return None
    return "refused by this worker's operator: " + "; ".join(problems) + ", or ask the operator to raise it"
