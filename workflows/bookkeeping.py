"""A ``TrainingRun``'s bookkeeping of each served step: its metrics, then checkpoint retention.

Each step's runs after the previous step's (retention may keep the best checkpoint by the metrics), beside what
follows (``bookkeeping-beside-next-step``). What retention keeps is worked out when the retention activity is
scheduled (``servable-before-resumable``, docs/pipelining.md#retention-decides-when-it-deletes), not when its step
was served: every step from the oldest the run serves, reloads or samples with, a value that only rises.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from schemas.activities import MetricsInput, RetentionInput
    from schemas.config import RunSpec
    from schemas.refs import TrajectoriesRef
    from schemas.run_state import RunState, StepSummary

from workflows.stages import METRICS, RETAIN_CHECKPOINTS, StageFailed, run_stage


class Bookkeeping:
    """The served steps' metrics and retention of one ``TrainingRun`` execution."""

    def __init__(self, spec: RunSpec, state: Callable[[], RunState], policies: dict[int, int]) -> None:
        self.spec = spec
        self.state = state
        self.policies = policies
        """Step -> the policy its rollouts were sampled by (the run's)."""
        self.keep_when_deleting = False
        """``servable-before-resumable``: what to keep is decided when retention is scheduled."""
        self.pending: asyncio.Task[None] | None = None
        """The served steps' metrics and retention, still running beside the next step."""

    def after(self, summary: StepSummary, scored: TrajectoriesRef) -> Coroutine[Any, Any, None]:
        """The served step's metrics and retention, after the previous step's (the state they read is now's)."""
        state = self.state()
        metrics = step_metrics(
            summary, scored.n_groups, state.dropped_stale_groups, state.dropped_lost_adapter_groups
        )
        protect = self.protected()
        previous = self.pending

        async def bookkeeping() -> None:
            if previous is not None:
                await previous
            await self.log_metrics(summary.step, metrics)
            if self.keep_when_deleting:  # decided now, when it deletes, not when the step was served
                await self.retain(summary.step, [], keep_from=self.keep_from())
            else:
                await self.retain(summary.step, protect)

        return bookkeeping()

    def beside(self, summary: StepSummary, scored: TrajectoriesRef) -> None:
        """The served step's bookkeeping, beside what follows."""
        self.pending = asyncio.create_task(self.after(summary, scored))

    async def settle(self) -> None:
        """Wait for the served steps' metrics and retention."""
        if self.pending is not None and not self.pending.done():
            await self.pending
        self.pending = None

    async def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """Best effort: a metrics sink that is down never fails the run."""
        spec = self.spec
        try:
            await run_stage(
                METRICS,
                MetricsInput(
                    run_id=spec.run_id,
                    project=spec.model.project,
                    model_name=spec.model.name,
                    step=step,
                    metrics=metrics,
                    wandb=spec.metrics.wandb,
                ),
                task_queue=spec.task_queues.control,
                step=step,
                scheduling=spec.scheduling(),
                heartbeat_s=spec.heartbeat_timeout_s,
            )
        except StageFailed as err:
            workflow.logger.warning("metrics for step %d not logged: %s", step, err.message)

    def protected(self) -> list[int]:
        """Checkpoints retention must keep now: the newest step, the one being served, and the policy that
        pipelined rollouts of a later step are sampling (a restarted server reloads it). (Runs whose history
        predates ``servable-before-resumable``.)"""
        state = self.state()
        served = [state.checkpoint.step] if state.checkpoint is not None else []
        sampling = [policy for step, policy in self.policies.items() if step > state.step]
        return sorted({state.step, *served, *sampling})

    def keep_from(self) -> int:
        """The oldest step whose checkpoint the run serves, reloads or samples with, or may yet: the served one,
        and the policies of rollouts not yet trained on (a restarted server loads theirs again). Reloads to come
        are of newer steps; the newest resumable checkpoint, which a step trained again needs, retention's
        ``keep_last`` keeps. The value only rises as the run goes on."""
        state = self.state()
        return min([state.step, *(policy for step, policy in self.policies.items() if step > state.step)])

    async def retain(self, step: int, protect: list[int], keep_from: int | None = None) -> None:
        """Delete checkpoints beyond ``spec.checkpoints`` but ``protect`` and those from ``keep_from`` on
        (``keep_last`` >= 1 keeps the newest resumable too). Best effort, like metrics."""
        spec = self.spec
        if spec.checkpoints.keep_last is None:
            return
        try:
            await run_stage(
                RETAIN_CHECKPOINTS,
                RetentionInput(
                    run_id=spec.run_id,
                    keep_last=spec.checkpoints.keep_last,
                    keep_best_metric=spec.checkpoints.keep_best_metric,
                    protect=protect,
                    keep_from=keep_from,
                ),
                task_queue=spec.task_queues.control,
                step=step,
                scheduling=spec.scheduling(),
                heartbeat_s=spec.heartbeat_timeout_s,
            )
        except StageFailed as err:
            workflow.logger.warning("checkpoint retention after step %d failed: %s", step, err.message)


def step_metrics(
    summary: StepSummary, n_groups: int, dropped_stale_groups: int, dropped_lost_adapter_groups: int = 0
) -> dict[str, float]:
    """A step's numbers under ART's metric names (``train/reward``, ``data/...``, ``loss/...``, ``time/...``).

    ``train/reward_std_dev`` is the std of all the step's rewards (ART averages each group's std; the
    workflow only sees the step's summary).
    """
    rollouts = summary.n_trajectories + summary.n_exceptions
    nan = float("nan")
    metrics: dict[str, float] = {
        "train/reward": summary.reward_mean if summary.reward_mean is not None else nan,
        "train/reward_std_dev": summary.reward_std if summary.reward_std is not None else nan,
        "train/exception_rate": summary.n_exceptions / rollouts if rollouts else nan,
        "data/step_num_scenarios": float(n_groups),
        "data/step_num_groups_submitted": float(n_groups),
        "data/step_num_groups_trainable": float(n_groups - summary.n_groups_zero_variance),
        "data/step_num_trajectories": float(rollouts),
        "data/step_num_resamples": float(summary.resampled),
        "discarded/step/zero_variance_groups": float(summary.n_groups_zero_variance),
        "discarded/cum/stale_groups": float(dropped_stale_groups),
        "discarded/cum/lost_adapter_groups": float(dropped_lost_adapter_groups),
        "offpolicy/policy_age_steps": float(summary.step - 1 - summary.policy_step),
    }
    if summary.loss is not None:
        metrics["loss/train"] = summary.loss
    metrics.update(summary.train_metrics)
    for phase, seconds in summary.seconds.items():
        metrics["time/step_wall_s" if phase == "step" else f"time/step_{phase}_s"] = seconds
    return metrics
