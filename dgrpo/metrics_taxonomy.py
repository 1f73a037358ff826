"""ART's ``art.metrics_taxonomy``: the ``data/step_*`` counts of a batch of groups, and the average of a step's
metric samples. ``dgrpo.model_log.run_metrics.group_metrics`` logs these counts for ``model.log`` and ``model.train``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from schemas.trajectory import TrajectoryGroup

TRAIN_GRADIENT_STEPS_KEY = "data/step_num_gradient_steps"
"""The optimizer steps a training step took: the same in every sample of the step, never averaged."""
INVARIANT_KEYS = frozenset({TRAIN_GRADIENT_STEPS_KEY})


def average_metric_samples(samples: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Each key's mean over the samples that have it; an invariant key must agree in all of them."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for sample in samples:
        for key, raw in sample.items():
            value = float(raw)
            if key in INVARIANT_KEYS and key in sums and sums[key] / counts[key] != value:
                raise ValueError(
                    f"metric {key!r} must be invariant across samples, got {sums[key] / counts[key]} and {value}"
                )
            sums[key] = sums.get(key, 0.0) + value
            counts[key] = counts.get(key, 0) + 1
    return {key: sums[key] / counts[key] for key in sums}


def trainable(group: TrajectoryGroup) -> bool:
    """A group GRPO can learn from: two or more trajectories whose rewards differ."""
    return len({t.reward for t in group.trajectories}) > 1


@dataclass(frozen=True)
class TrajectoryBatchSummary:
    """The counts of one batch of groups."""

    num_scenarios: int
    num_trajectories: int
    """Finished trajectories and rollouts that raised."""
    num_groups_submitted: int
    num_groups_trainable: int
    scenario_ids: list[str]
    """Each group's ``metadata["scenario_id"]`` (or its first trajectory's that has one), once each, in order."""


def summarize_trajectory_groups(groups: Iterable[TrajectoryGroup]) -> TrajectoryBatchSummary:
    listed = list(groups)
    ids: list[str] = []
    for group in listed:
        found = next(
            (
                m["scenario_id"]
                for m in (group.metadata, *(t.metadata for t in group.trajectories))
                if m.get("scenario_id") is not None
            ),
            None,
        )
        if found is not None and str(found) not in ids:
            ids.append(str(found))
    return TrajectoryBatchSummary(
        num_scenarios=len(listed),
        num_trajectories=sum(len(g.trajectories) + len(g.exceptions) for g in listed),
        num_groups_submitted=len(listed),
        num_groups_trainable=sum(trainable(g) for g in listed),
        scenario_ids=ids,
    )


def build_data_metrics_from_summary(
    summary: TrajectoryBatchSummary, *, include_trainable_groups: bool
) -> dict[str, float]:
    """ART's ``data/step_num_*`` counts (trainable groups only where training counts them)."""
    metrics = {
        "data/step_num_scenarios": float(summary.num_scenarios),
        "data/step_num_trajectories": float(summary.num_trajectories),
        "data/step_num_groups_submitted": float(summary.num_groups_submitted),
    }
    if include_trainable_groups:
        metrics["data/step_num_groups_trainable"] = float(summary.num_groups_trainable)
    return metrics


build_training_summary_metrics = build_data_metrics_from_summary
"""ART's name for the same counts in a training step's summary."""

__all__ = [
    "TRAIN_GRADIENT_STEPS_KEY",
    "TrajectoryBatchSummary",
    "average_metric_samples",
    "build_data_metrics_from_summary",
    "build_training_summary_metrics",
    "summarize_trajectory_groups",
    "trainable",
]
