"""Activity names and call options of every stage, stated once: the failure behaviour of a step reads here.

Workflows call activities by NAME (the modules that define them import torch, vllm, ...). Each stage's
timeouts and retry policy sit next to its name, and ``run_stage`` turns an activity failure into an
``ApplicationError`` whose message names the step and the stage and keeps the activity's own message. Every
activity carries its run's priority and fairness (``Scheduling``), so runs sharing a fleet queue fairly.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import Priority, RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError, TimeoutType

with workflow.unsafe.imports_passed_through():
    from schemas.activities import ActivityName
    from schemas.config import HEARTBEAT_TIMEOUT_S, Scheduling
    from schemas.errors import NON_RETRYABLE, STAGED_STATE_LOST

T = TypeVar("T")

HEARTBEAT = timedelta(seconds=HEARTBEAT_TIMEOUT_S)
"""Every stage's heartbeat timeout unless the run sets its own (``RunSpec.heartbeat_timeout_s``): how long a
dead or hung worker can hold an activity. With the 2 s first retry interval, a killed worker's activity starts
again on another worker within about 22 s."""

QUEUE_WAIT = timedelta(hours=1)
"""What a stage's bound allows, beyond its attempts, for retry backoff and for waiting on a worker to poll."""


@dataclass(frozen=True)
class Stage:
    """One activity as the workflows call it."""

    name: ActivityName
    start_to_close: timedelta
    heartbeat: timedelta | None = HEARTBEAT
    max_attempts: int = 5
    schedule_to_start: timedelta | None = None
    """Set where the activity is pinned to one worker that may have died (publish)."""

    def heartbeat_timeout(self, run_s: float | None) -> timedelta | None:
        """The run's heartbeat timeout (``run_s`` seconds) for a stage that heartbeats; None: the stage's own."""
        if run_s is None or self.heartbeat is None:
            return self.heartbeat
        return timedelta(seconds=run_s)

    @property
    def schedule_to_close(self) -> timedelta:
        """The bound on the whole activity, every attempt and every wait for a worker included: a stage whose
        workers are all gone (a trainer queue nobody polls) fails, naming itself, instead of waiting forever."""
        return self.start_to_close * self.max_attempts + QUEUE_WAIT

    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(
            initial_interval=timedelta(seconds=2),
            backoff_coefficient=2.0,
            maximum_interval=timedelta(seconds=60),
            maximum_attempts=self.max_attempts,
            non_retryable_error_types=list(NON_RETRYABLE),
        )


# Every worker heartbeats each activity from a ticker (workers/heartbeat_ticker.py), whatever the work is
# doing, so a dead or hung worker is noticed within HEARTBEAT and the activity is retried on another one.
# A hung engine can cost two attempts (one fails on it, one is failed by its restart): five, like most stages.
ROLLOUTS = Stage(ActivityName.ROLLOUTS, timedelta(hours=2), max_attempts=5)
# A run's inline scenario list is written once to the store (control queue), at the run's start.
STORE_SCENARIOS = Stage(ActivityName.STORE_SCENARIOS, timedelta(minutes=5), max_attempts=5)
# So are its chat template and judge rubric.
STORE_RUN_TEXTS = Stage(ActivityName.STORE_RUN_TEXTS, timedelta(minutes=5), max_attempts=5)
# A step's shards are merged into its one Parquet on the control queue.
MERGE_ROLLOUTS = Stage(ActivityName.MERGE_ROLLOUTS, timedelta(minutes=30), max_attempts=5)
JUDGE = Stage(ActivityName.JUDGE, timedelta(hours=1), max_attempts=5)
ADVANTAGES = Stage(ActivityName.ADVANTAGES, timedelta(minutes=10), max_attempts=5)
# OOM retries halve the micro-batch.
TRAIN = Stage(ActivityName.TRAIN, timedelta(hours=4), max_attempts=6)
# Fine-tuning a step on chat examples: a train stage, with the same OOM halving and bounds.
TRAIN_SFT = Stage(ActivityName.TRAIN_SFT, timedelta(hours=4), max_attempts=6)
# Pipelined mode: the next step, on the worker holding the step before it (in memory or staged, maybe still
# uploading); if it died, the task never starts and the step trains from that step's published checkpoint.
TRAIN_BESIDE = Stage(
    ActivityName.TRAIN, timedelta(hours=4), max_attempts=6, schedule_to_start=timedelta(minutes=1)
)
# Runs on the worker holding the staged adapter; if it died, the task never starts and we train again.
PUBLISH = Stage(
    ActivityName.PUBLISH, timedelta(minutes=30), max_attempts=5, schedule_to_start=timedelta(minutes=1)
)
# The adapter alone, first (servable); the same worker, the same bounds (workflows/servable.py).
PUBLISH_ADAPTER = Stage(
    ActivityName.PUBLISH_ADAPTER,
    timedelta(minutes=30),
    max_attempts=5,
    schedule_to_start=timedelta(minutes=1),
)
PUBLISH_INITIAL = Stage(ActivityName.PUBLISH_INITIAL, timedelta(minutes=30))
REPUBLISH = Stage(ActivityName.REPUBLISH, timedelta(minutes=30))
LATEST_CHECKPOINT = Stage(ActivityName.LATEST_CHECKPOINT, timedelta(minutes=2), max_attempts=10)
RELOAD = Stage(ActivityName.RELOAD, timedelta(minutes=15), max_attempts=10)
SERVING_CONTROL = Stage(ActivityName.SERVING_CONTROL, timedelta(minutes=10), max_attempts=5)
METRICS = Stage(ActivityName.METRICS, timedelta(minutes=2), max_attempts=3)
RETAIN_CHECKPOINTS = Stage(ActivityName.RETAIN_CHECKPOINTS, timedelta(minutes=10), max_attempts=3)

NO_LEARNING_SIGNAL = "NoLearningSignal"


class NoLearningSignal(ApplicationError):
    """Every group of the step had equal rewards: GRPO has nothing to learn from it."""


class StageFailed(ApplicationError):
    """A stage failed for good; the message names the step, the stage and the activity's error."""


def is_lost_worker(err: ActivityError) -> bool:
    """True when the activity was never picked up: the worker (queue) it was pinned to is gone."""
    cause = err.cause
    return isinstance(cause, TimeoutError) and cause.type == TimeoutType.SCHEDULE_TO_START


def is_staged_state_lost(err: ActivityError) -> bool:
    """True when the trainer the activity was pinned to no longer holds the step it staged (``StagedStateLost``:
    it was started again without it)."""
    cause = err.cause
    return isinstance(cause, ApplicationError) and cause.type == STAGED_STATE_LOST


def priority(scheduling: Scheduling) -> Priority:
    """The run's ``Scheduling`` as Temporal's ``Priority`` (None fields: Temporal's defaults)."""
    return Priority(
        priority_key=scheduling.priority,
        fairness_key=scheduling.fairness_key,
        fairness_weight=scheduling.fairness_weight,
    )


async def run_stage(
    stage: Stage,
    arg: Any,
    *,
    task_queue: str,
    step: int,
    scheduling: Scheduling,
    heartbeat_s: float | None = None,
    result_type: type[T] | None = None,
    reraise: bool = False,
    summary: str | None = None,
) -> T:
    """Execute ``stage`` on ``task_queue`` with the run's ``scheduling``; a final failure becomes a
    ``StageFailed`` with a clear message. ``heartbeat_s``: the run's heartbeat timeout
    (``RunSpec.heartbeat_timeout_s``; None: ``HEARTBEAT``). ``summary``: what the UI shows for the call
    (default ``step <step>``)."""
    try:
        return await workflow.execute_activity(
            stage.name,
            arg,
            task_queue=task_queue,
            start_to_close_timeout=stage.start_to_close,
            schedule_to_close_timeout=stage.schedule_to_close,  # commands match on id and type: replay-safe
            schedule_to_start_timeout=stage.schedule_to_start,
            heartbeat_timeout=stage.heartbeat_timeout(heartbeat_s),  # options are not replayed: replay-safe
            retry_policy=stage.retry_policy(),
            priority=priority(scheduling),  # replay matches commands on id and type, not priority
            result_type=result_type,
            summary=summary or f"step {step}",
        )
    except ActivityError as err:
        if reraise:
            raise
        raise stage_failure(stage, step, err) from err


def stage_failure(stage: Stage, step: int, err: ActivityError) -> StageFailed:
    cause = err.cause
    if isinstance(cause, ApplicationError):
        detail, kind = cause.message, cause.type or "ActivityError"
    elif cause is not None:
        detail, kind = f"{type(cause).__name__}: {cause}", type(cause).__name__
    else:
        detail, kind = str(err), "ActivityError"
    return StageFailed(f"step {step}: {stage.name} failed: {detail}", type=kind, non_retryable=True)
