"""The client's metrics under ART's names, in the run's metrics Parquet (the one the metrics activity keeps
for ``TrainingRun``): one row per step, so ``model.train``'s and ``model.log``'s numbers sit next to each
other. Which checkpoints ``delete_checkpoints`` removes is activities/retention.py's (TrainingRun's too)."""

from __future__ import annotations

import logging
import math
import statistics
from collections import defaultdict

from activities.metrics import record_step, reward_curve_png
from activities.object_store import ObjectStore
from dgrpo.metrics_taxonomy import build_data_metrics_from_summary, summarize_trajectory_groups, trainable
from schemas import layout
from schemas.run_state import TrainStepResult
from schemas.trajectory import TrajectoryGroup

log = logging.getLogger(__name__)


SECTIONS = frozenset(
    {"loss", "time", "data", "discarded", "offpolicy", "throughput", "costs", "train", "val", "test"}
)
"""First name components ART leaves unprefixed (its metric sections and splits); others get ``<split>/``."""


def qualified(name: str, split: str) -> str:
    """``name`` as ART logs it under ``split``: kept when it starts with a section (``loss/train``), else
    prefixed (``turns`` -> ``val/turns``)."""
    return name if "/" in name and name.split("/", 1)[0] in SECTIONS else f"{split}/{name}"


def reward_std_dev(groups: list[TrajectoryGroup]) -> float:
    """ART's ``reward_std_dev``: the mean over groups of two or more trajectories of their rewards' population
    std (0 when there are none)."""
    stds = [statistics.pstdev(t.reward for t in g.trajectories) for g in groups if len(g.trajectories) > 1]
    return statistics.fmean(stds) if stds else 0.0


def group_metrics(groups: list[TrajectoryGroup], split: str) -> dict[str, float]:
    """ART's numbers for a batch of groups: ``<split>/reward`` (mean), ``<split>/reward_std_dev`` (the mean
    of each group's reward std), ``<split>/exception_rate``, the ``data/step_num_*`` counts (``train``;
    ``<split>/data/...`` for other splits), and the mean of every trajectory and group metric."""
    trajectories = [t for g in groups for t in g.trajectories]
    rewards = [t.reward for t in trajectories if math.isfinite(t.reward)]
    exceptions = sum(len(g.exceptions) for g in groups)
    out: dict[str, float] = {}
    if rewards:
        out[f"{split}/reward"] = statistics.fmean(rewards)
    out[f"{split}/reward_std_dev"] = reward_std_dev(groups)
    if trajectories or exceptions:
        out[f"{split}/exception_rate"] = exceptions / (len(trajectories) + exceptions)
    data = build_data_metrics_from_summary(
        summarize_trajectory_groups(groups), include_trainable_groups=split == "train"
    )
    out.update(data if split == "train" else {f"{split}/{k}": v for k, v in data.items()})
    values: dict[str, list[float]] = defaultdict(list)
    for t in trajectories:
        for name, value in t.metrics.items():
            values[qualified(name, split)].append(float(value))
    for g in groups:
        if g.trajectories:
            for name, value in g.metrics.items():
                values[f"{split}/group/{name}"].append(float(value))
    for name, vs in values.items():
        out.setdefault(name, statistics.fmean(vs))
    return out


def zero_variance_groups(groups: list[TrajectoryGroup]) -> int:
    """Groups of two or more trajectories whose rewards are all equal (ART discards and counts them)."""
    return sum(len(g.trajectories) > 1 and not trainable(g) for g in groups)


def train_result_metrics(result: TrainStepResult) -> dict[str, float]:
    """A trained step's numbers under ART's names (``backend.train``'s result metrics)."""
    # (Not result.n_trajectories, the trajectories kept: ART's data/step_num_trajectories counts all
    # submitted, which group_metrics records.)
    metrics = {
        "discarded/step/zero_variance_groups": float(result.n_groups_zero_variance),
        # ART >= 0.4.4 advances a step that trains nothing; this flag says which steps those were.
        "data/step_skipped": 0.0 if result.trained else 1.0,
    }
    if result.loss is not None:
        metrics["loss/train"] = result.loss
    metrics.update(result.metrics)
    metrics.update({f"time/step_{phase}_s": seconds for phase, seconds in result.seconds.items()})
    if result.seconds:
        metrics["time/step_wall_s"] = sum(result.seconds.values())
    return metrics


def record_metrics(
    store: ObjectStore,
    run_id: str,
    model_name: str,
    step: int,
    metrics: dict[str, float],
    curve_title: str | None = None,
) -> None:
    """Merge ``metrics`` into the step's row (other columns of that row are kept); redraw the curve if asked."""
    rows = record_step(store, run_id, model_name, step, metrics)
    if curve_title is not None:
        store.put_bytes(layout.reward_curve_key(run_id), reward_curve_png(rows, curve_title))
    log.info("step %d: %s", step, ", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items())))
