"""Checkpoint retention (control queue): which of a run's checkpoints to delete, and deleting them.

One home for ART's ``delete_checkpoints`` rule, used by the ART-style client (``model.delete_checkpoints``)
and, after every served step, by ``TrainingRun`` when its spec sets ``checkpoints.keep_last``: keep the
newest ``keep_last`` resumable checkpoints (manifested, as listed when deleting), the best by a metric (the
metrics Parquet, then the manifests' metadata), any protected step and every step from ``keep_from`` on (the
oldest one the run serves, reloads or samples with, or may yet); delete the rest, each manifest first so a
half-deleted checkpoint never looks complete (nor servable). A checkpoint that is only servable (its optimizer
state still uploading) is never listed, so never deleted.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from temporalio import activity

from activities.metrics import STEP_COLUMN, read_metrics
from activities.object_store import ObjectStore
from schemas import layout
from schemas.activities import ActivityName, RetentionInput
from schemas.errors import CorruptCheckpointError

log = logging.getLogger(__name__)


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


def select_checkpoints_to_delete(
    store: ObjectStore,
    run_id: str,
    metric: str | None,
    keep_last: int,
    protect: Iterable[int] = (),
    keep_from: int | None = None,
) -> list[int]:
    """Steps to delete: all but the newest ``keep_last``, the one with the highest ``metric``, ``protect`` and
    every step from ``keep_from`` on."""
    steps = complete_checkpoint_steps(store, run_id)
    keep = set(steps[-keep_last:]) if keep_last > 0 else set()
    keep.update(protect)
    if keep_from is not None:
        keep.update(s for s in steps if s >= keep_from)
    if metric is not None:
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


def select_checkpoints_to_keep(
    store: ObjectStore, run_id: str, metric: str | None, keep_last: int
) -> list[int]:
    """The complete checkpoints ``select_checkpoints_to_delete`` spares (what ART's backends are told to keep)."""
    doomed = set(select_checkpoints_to_delete(store, run_id, metric, keep_last))
    return [s for s in complete_checkpoint_steps(store, run_id) if s not in doomed]


def delete_checkpoints(store: ObjectStore, run_id: str, steps: Iterable[int]) -> None:
    """Delete each checkpoint, its manifests first: a half-deleted checkpoint must never look complete, nor its
    adapter servable."""
    for step in steps:
        prefix = layout.checkpoint_prefix(run_id, step)
        store.delete_prefix(prefix + layout.MANIFEST_NAME)
        store.delete_prefix(prefix + layout.ADAPTER_MANIFEST_NAME)
        store.delete_prefix(prefix)


class RetentionActivities:
    """The control worker's checkpoint-retention activity."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def all(self) -> list[Callable[..., Any]]:
        return [self.retain_checkpoints]

    def _retain(self, input: RetentionInput) -> list[int]:
        doomed = select_checkpoints_to_delete(
            self.store, input.run_id, input.keep_best_metric, input.keep_last, input.protect, input.keep_from
        )
        delete_checkpoints(self.store, input.run_id, doomed)
        if doomed:
            log.info("%s: deleted checkpoints %s (keep_last=%d, keep_from=%s)", input.run_id, doomed,
                     input.keep_last, input.keep_from)  # fmt: skip
        return doomed

    @activity.defn(name=ActivityName.RETAIN_CHECKPOINTS)
    async def retain_checkpoints(self, input: RetentionInput) -> list[int]:
        """Delete the run's checkpoints beyond its retention setting; returns the deleted steps."""
        return await asyncio.to_thread(self._retain, input)
