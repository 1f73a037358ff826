"""What a finished example left in its LocalBackend's store, read back from the stack alone: the metrics
Parquet by step, and the steps whose checkpoint manifest reads."""

from __future__ import annotations

from pathlib import Path

from activities.object_store import ObjectStore
from activities.retention import metrics_by_step
from schemas import layout
from workers.stack import EmbeddedStack


def stored_run(home: Path, run_id: str) -> tuple[dict[int, dict[str, float]], list[int]]:
    """``(metrics by step, manifested checkpoint steps)`` of ``run_id`` under the backend at ``home``; its
    stack is started (and stopped again) only when it is not running."""
    stack = EmbeddedStack(home)
    started = stack.load_state() is None
    if started:
        stack.start()
    try:
        store = ObjectStore(stack.s3_settings)
        records = metrics_by_step(store, run_id)
        manifested = []
        for step in store.checkpoint_steps(run_id):
            store.read_manifest(layout.checkpoint_prefix(run_id, step))  # raises unless complete
            manifested.append(step)
    finally:
        if started:
            stack.stop()
    return records, manifested
