"""The client's metrics, in the run's metrics Parquet (the one the metrics activity keeps for ``TrainingRun``):
one row per step, so ``model.train``'s and ``model.log``'s numbers sit next to each other; and the choice of
which checkpoints ``delete_checkpoints`` removes."""

from __future__ import annotations

import logging
import math
import statistics
from collections import defaultdict

from activities.metrics import STEP_COLUMN, read_metrics, record_step, reward_curve_png
from activities.object_store import ObjectStore
from schemas import layout
from schemas.errors import CorruptCheckpointError
from schemas.trajectory import TrajectoryGroup

log = logging.getLogger(__name__)


def group_metrics(groups: list[TrajectoryGroup], split: str) -> dict[str, float]:
    """``<split>/reward`` (mean), ``reward_std``, counts, and the mean of every per-trajectory metric."""
    trajectories = [t for g in groups for t in g.trajectories]
    rewards = [t.reward for t in trajectories if math.isfinite(t.reward)]
    out: dict[str, float] = {
        "n_groups": float(len(groups)),
        "n_trajectories": float(len(trajectories)),
        "n_exceptions": float(sum(len(g.exceptions) for g in groups)),
    }
    if rewards:
        out["reward"] = statistics.fmean(rewards)
        out["reward_std"] = statistics.pstdev(rewards)
    values: dict[str, list[float]] = defaultdict(list)
    for t in trajectories:
        for name, value in t.metrics.items():
            values[name].append(float(value))
    for name, vs in values.items():
        out.setdefault(name, statistics.fmean(vs))
    return {f"{split}/{name}": value for name, value in out.items()}


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


def metrics_by_step(store: ObjectStore, run_id: str) -> dict[int, dict[str, float]]:
    """Every number recorded per step: the metrics Parquet, then the checkpoints' manifest metadata."""
    by_step: dict[int, dict[str, float]] = defaultdict(dict)
    for row in read_metrics(store, run_id):
        for name, value in row.items():
            if isinstance(value, float) and math.isfinite(value):
                by_step[int(row[STEP_COLUMN])][name] = value
    for step in store.checkpoint_steps(run_id):
        try:
            manifest, _ = store.read_manifest(layout.checkpoint_prefix(run_id, step))
        except CorruptCheckpointError:
            continue
        for name, meta in manifest.metadata.items():
            if isinstance(meta, int | float) and not isinstance(meta, bool):
                by_step[step].setdefault(name, float(meta))
    return dict(by_step)


def complete_checkpoint_steps(store: ObjectStore, run_id: str) -> list[int]:
    """Steps with a manifested checkpoint (a deleted one may leave an empty prefix behind on some stores)."""
    return [
        s for s in store.checkpoint_steps(run_id) if store.is_complete(layout.checkpoint_prefix(run_id, s))
    ]


def select_checkpoints_to_delete(store: ObjectStore, run_id: str, metric: str, keep_last: int) -> list[int]:
    """Steps to delete: all but the newest ``keep_last`` and the one with the highest ``metric``."""
    steps = complete_checkpoint_steps(store, run_id)
    keep = set(steps[-keep_last:]) if keep_last > 0 else set()
    recorded = metrics_by_step(store, run_id)
    scored = {s: m[metric] for s, m in recorded.items() if metric in m and s in steps}
    if scored:
        keep.add(max(scored, key=lambda s: (scored[s], s)))
    else:
        known = sorted({name for m in recorded.values() for name in m})
        log.warning(
            "no checkpoint has metric %r (recorded: %s); keeping the newest %d", metric, known, keep_last
        )
    return [s for s in steps if s not in keep]
