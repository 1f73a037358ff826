"""ART's checkpoint-retention strategies (``art.pipeline_trainer.checkpoint_retention``).

A strategy looks at the checkpoints a trainer may delete and names the steps to keep. ``keep_recent_and_top``
keeps the newest few and the best few by a metric. ``PipelineTrainer`` runs it as the ``TrainingRun``'s own
retention (``checkpoints.keep_last`` and ``keep_best_metric``, applied by the ``retain_checkpoints``
activity after every step), so only the settings that retention can express are accepted there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime

from pydantic import BaseModel, Field

from schemas.config import CheckpointsSpec


class CheckpointInfo(BaseModel):
    """One saved checkpoint as a strategy sees it."""

    step: int
    path: str
    created_at: datetime
    is_eval_step: bool = False
    """Whether an eval ran on this checkpoint."""
    metrics: dict[str, float] = Field(default_factory=dict)
    """The numbers recorded at this step (e.g. ``val/reward``)."""


class CheckpointRetentionContext(BaseModel):
    """What a strategy decides on: the current step and the checkpoints it may delete."""

    current_step: int
    checkpoints: list[CheckpointInfo] = Field(default_factory=list)


CheckpointRetentionStrategy = Callable[[CheckpointRetentionContext], Iterable[int]]
"""Given the deletable checkpoints, the steps among them to keep (the rest are deleted)."""


@dataclass(frozen=True)
class KeepRecentAndTop:
    """``keep_recent_and_top``'s strategy: the newest ``recent`` and the ``top`` best by ``metric``."""

    recent: int
    top: int
    metric: str

    def __call__(self, context: CheckpointRetentionContext) -> set[int]:
        by_step = sorted(context.checkpoints, key=lambda c: c.step)
        keep = {c.step for c in by_step[max(len(by_step) - self.recent, 0) :]}
        # A checkpoint counts in the ranking when it has the metric, whether or not it is marked an eval step.
        scored = [c for c in by_step if self.metric in c.metrics]
        scored.sort(key=lambda c: (c.metrics[self.metric], c.step), reverse=True)
        keep.update(c.step for c in scored[: self.top])
        return keep

    def as_checkpoints_spec(self) -> CheckpointsSpec:
        """The run's retention setting that keeps the same checkpoints; refused where there is none.

        The step just published is never deletable here (as in ART), so ``recent`` more make ``keep_last``.
        """
        if self.top > 1:
            raise ValueError(
                f"keep_recent_and_top(top={self.top}): a durable run keeps the single best checkpoint by its "
                "metric (checkpoints.keep_best_metric); use top=0 or top=1"
            )
        return CheckpointsSpec(keep_last=self.recent + 1, keep_best_metric=self.metric if self.top else None)


def keep_recent_and_top(*, recent: int = 5, top: int = 2, metric: str = "val/reward") -> KeepRecentAndTop:
    """A strategy keeping the newest ``recent`` deletable checkpoints and the ``top`` best by ``metric``."""
    if recent < 0:
        raise ValueError(f"recent must be >= 0, got {recent}")
    if top < 0:
        raise ValueError(f"top must be >= 0, got {top}")
    return KeepRecentAndTop(recent, top, metric)


__all__ = [
    "CheckpointInfo",
    "CheckpointRetentionContext",
    "CheckpointRetentionStrategy",
    "KeepRecentAndTop",
    "keep_recent_and_top",
]
