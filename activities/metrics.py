"""The metrics activity (control queue): one row per step in the run's metrics Parquet, W&B, a reward curve.

- ``runs/<run>/metrics/<step>/<ns>-<id>.json``: one object per write, never overwritten (``record_step``,
  which the ART-style client's ``model.log`` writes through too), so writers that log at once (the metrics
  activity and a client's ``model.log``) lose nothing; read back in order, a later write's values replace
  an earlier one's for its step and the step's other columns are kept.
- ``runs/<run>/metrics.parquet``: one row per step, a column per metric, rebuilt from those after each write
  (a view for pandas and users; ``read_metrics`` reads the writes themselves).
- W&B with ART's ``training_step`` as the x-axis (so a retried step may log again): offline unless
  ``WANDB_API_KEY`` is set in the worker's environment. W&B failing never fails the step.
- ``runs/<run>/reward_curve.png``: ``train/reward`` (with a ±``train/reward_std_dev`` band) per step,
  redrawn every step; also
  written to ``<local_dir>/<run>/reward_curve.png`` when the activity has a local dir
  (default ``$DGRPO_HOME/runs`` when ``DGRPO_HOME`` is set).
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import math
import os
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from temporalio import activity

from activities.object_store import ObjectStore
from host.files import write_atomic
from schemas import layout
from schemas.activities import ActivityName, MetricsInput
from schemas.errors import StoreError
from schemas.settings import ENV_HOME

log = logging.getLogger(__name__)

STEP_COLUMN = "step"
WANDB_STEP = "training_step"
"""ART's W&B x-axis."""
WANDB_CLOCK = "time/wall_clock_sec"
"""Seconds since the client's model was made (ART's), logged with each row of its W&B run."""
REWARD = "train/reward"
REWARD_STD = "train/reward_std_dev"
WANDB_TIMEOUT_S = 60.0


def rows_to_table(rows: list[dict[str, Any]]) -> pa.Table:
    """One column per metric seen in any row (null where a step lacks it); fixed columns first."""
    fixed = [STEP_COLUMN, "run_id", "model_name", "logged_at"]
    names = fixed + sorted({k for r in rows for k in r} - set(fixed))
    types = {
        STEP_COLUMN: pa.int64(),
        "run_id": pa.string(),
        "model_name": pa.string(),
        "logged_at": pa.float64(),
    }
    schema = pa.schema([(n, types.get(n, pa.float64())) for n in names])
    return pa.Table.from_pylist([{n: r.get(n) for n in names} for r in rows], schema=schema)


_EVENTS: dict[tuple[str, str], dict[str, Any]] = {}
"""Metrics writes already read, by (bucket, key): written once and never changed, so always valid."""
_EVENTS_CACHED = 200_000


def _event(store: ObjectStore, key: str) -> dict[str, Any]:
    cached = _EVENTS.get((store.bucket, key))
    if cached is None:
        cached = json.loads(store.get_bytes(key))
        if len(_EVENTS) >= _EVENTS_CACHED:
            _EVENTS.clear()
        _EVENTS[(store.bucket, key)] = cached
    return cached


def read_metrics(store: ObjectStore, run_id: str) -> list[dict[str, Any]]:
    """The run's metric rows, one per step, each with every column (empty when none were logged yet): every
    write in the order written, over the rows of a ``metrics.parquet`` from before writes were kept one by one."""
    rows: dict[int, dict[str, Any]] = {}
    key = layout.metrics_key(run_id)
    if store.exists(key):
        for old in pq.read_table(pa.BufferReader(store.get_bytes(key))).to_pylist():
            rows[int(old[STEP_COLUMN])] = {k: v for k, v in old.items() if v is not None}
    for event_key in store.list(layout.metrics_events_prefix(run_id)):  # by step, then time written
        if event_key.endswith(".json"):
            event = _event(store, event_key)
            rows.setdefault(int(event[STEP_COLUMN]), {}).update(event)
    columns = {name for row in rows.values() for name in row}
    return [{name: rows[step].get(name) for name in columns} for step in sorted(rows)]  # None: not logged


def record_step(
    store: ObjectStore, run_id: str, model_name: str, step: int, metrics: dict[str, float]
) -> list[dict[str, Any]]:
    """Record ``metrics`` for ``step`` as one new object (the step's other columns are kept), rebuild the
    run's ``metrics.parquet`` from every write, and return every row."""
    written_ns = time.time_ns()
    event: dict[str, Any] = {STEP_COLUMN: step, "run_id": run_id, "model_name": model_name}
    event.update({"logged_at": written_ns / 1e9, **{k: float(v) for k, v in metrics.items()}})
    key = layout.metrics_event_key(run_id, step, written_ns, uuid.uuid4().hex[:12])
    store.put_bytes(key, json.dumps(event, allow_nan=True).encode())
    rows = read_metrics(store, run_id)
    sink = pa.BufferOutputStream()
    pq.write_table(rows_to_table(rows), sink, compression="zstd")
    store.put_bytes(layout.metrics_key(run_id), sink.getvalue().to_pybytes())
    return rows


def reward_curve_png(rows: list[dict[str, Any]], title: str) -> bytes:
    """A PNG of ``train/reward`` (±``train/reward_std_dev``) per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [
        (int(r[STEP_COLUMN]), float(r[REWARD]), float(r.get(REWARD_STD) or 0.0))
        for r in rows
        if r.get(REWARD) is not None and math.isfinite(float(r[REWARD]))
    ]
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    if points:
        steps, means, stds = zip(*points, strict=True)
        ax.plot(steps, means, marker="o", label="reward mean")
        ax.fill_between(
            steps,
            [m - s for m, s in zip(means, stds, strict=True)],
            [m + s for m, s in zip(means, stds, strict=True)],
            alpha=0.2,
            label="± std",
        )
        ax.legend(loc="lower right")
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


WANDB_SECTIONS = (
    "reward",
    "loss",
    "throughput",
    "costs",
    "time",
    "data",
    "train",
    "val",
    "test",
    "discarded",
)
"""The sections ART plots against ``training_step`` (``<section>/*``), in the order ART defines them."""


class WandbSink:
    """One W&B run per training run, kept open across steps by the worker process (or the client's model),
    laid out as ART lays out a model's run: ART's ``wandb.init`` arguments and ``define_metric`` calls."""

    def __init__(self, root: Path, *, sections: tuple[str, ...] = WANDB_SECTIONS, clock: bool = True) -> None:
        """``sections`` plotted against ``training_step``, and whether rows carry ``time/wall_clock_sec``
        (``clock``): ART 0.5.18's by default; a client writing ART 0.5.23's files gives that release's."""
        self.root = root
        self.sections = sections
        self.fixed = {WANDB_STEP, WANDB_CLOCK} if clock else {WANDB_STEP}
        self.runs: dict[str, Any] = {}
        self.configs: dict[str, dict[str, Any]] = {}
        """Run id -> the W&B run config (given to ``wandb.init``, or to the open run when it changes)."""
        self.defined: dict[str, set[str]] = {}
        """Run id -> the metrics given ``training_step`` as their x-axis one by one."""

    def update_config(self, run_id: str, config: dict[str, Any]) -> None:
        """The run's W&B config: set on the open run now, or given to ``wandb.init`` when it opens."""
        if not config:
            return
        self.configs[run_id] = config
        run = self.runs.get(run_id)
        if run is not None and not run._is_finished:  # ART's check too: W&B has no public "finished"
            run.config.update(config)

    def run(self, run_id: str, project: str, name: str) -> Any:
        """The open W&B run of ``run_id``, opened (again, once finished) as ART opens a model's: its sections
        (``WANDB_SECTIONS``) plotted against ``training_step``; offline unless ``WANDB_API_KEY`` is set."""
        import wandb

        run = self.runs.get(run_id)
        if run is not None and not run._is_finished:
            return run
        wandb_dir = self.root / run_id
        wandb_dir.mkdir(parents=True, exist_ok=True)
        config = self.configs.get(run_id)
        run = wandb.init(
            project=project,
            name=name,
            id=run_id,
            config=config,
            resume="allow",
            reinit="create_new",
            dir=str(wandb_dir),
            mode="online" if os.environ.get("WANDB_API_KEY") else "offline",
            settings=wandb.Settings(silent=True, console="off"),
        )
        for fixed in sorted(self.fixed, key=lambda key: key != WANDB_STEP):
            run.define_metric(fixed)
        for section in self.sections:
            run.define_metric(f"{section}/*", step_metric=WANDB_STEP)
        if config:
            run.config.update(config)  # a resumed run keeps its old config over init's
        self.runs[run_id] = run
        self.defined[run_id] = set(self.fixed)
        return run

    def log_row(self, run_id: str, run: Any, row: dict[str, Any]) -> None:
        """``run.log(row)``, ``row`` holding its ``training_step``; a ``costs/`` key (nested, as ART defines them)
        or one outside ART's sections (``offpolicy/...``, a split of the program's) is first given
        ``training_step`` as its x-axis."""
        defined = self.defined.setdefault(run_id, set(self.fixed))
        for key in row:
            if key not in defined and (key.startswith("costs/") or key.split("/", 1)[0] not in self.sections):
                run.define_metric(key, step_metric=WANDB_STEP)
                defined.add(key)
        run.log(row)

    def log(self, input: MetricsInput) -> None:
        run = self.run(input.run_id, input.project, input.model_name)
        self.log_row(input.run_id, run, {WANDB_STEP: input.step, **input.metrics})

    def close(self) -> None:
        for run in self.runs.values():
            run.finish()
        self.runs.clear()


class MetricsActivities:
    """The control worker's metrics activity."""

    def __init__(
        self, store: ObjectStore, *, local_dir: Path | None = None, wandb_dir: Path | None = None
    ) -> None:
        self.store = store
        home = os.environ.get(ENV_HOME)
        self.local_dir = local_dir or (Path(home) / "runs" if home else None)
        root = wandb_dir or (self.local_dir or Path(tempfile.gettempdir()) / "dgrpo") / "wandb"
        self.wandb = WandbSink(root)

    def all(self) -> list[Callable[..., Any]]:
        return [self.log_metrics]

    def _write(self, input: MetricsInput) -> list[dict[str, Any]]:
        return record_step(self.store, input.run_id, input.model_name, input.step, input.metrics)

    def _curve(self, input: MetricsInput, rows: list[dict[str, Any]]) -> None:
        png = reward_curve_png(rows, f"{input.project}/{input.model_name} ({input.run_id})")
        self.store.put_bytes(layout.reward_curve_key(input.run_id), png)
        if self.local_dir is not None:
            path = self.local_dir / input.run_id / "reward_curve.png"
            write_atomic(path, png)

    @activity.defn(name=ActivityName.METRICS)
    async def log_metrics(self, input: MetricsInput) -> None:
        rows = await asyncio.to_thread(self._write, input)
        try:
            await asyncio.to_thread(self._curve, input, rows)
        except (StoreError, OSError, ValueError) as err:
            log.warning("reward curve for %s step %d not drawn: %s", input.run_id, input.step, err)
        if input.wandb:
            try:
                await asyncio.wait_for(asyncio.to_thread(self.wandb.log, input), WANDB_TIMEOUT_S)
            except Exception as err:  # W&B is a convenience: never fail the step for it
                log.warning(
                    "W&B logging for %s step %d failed: %s: %s",
                    input.run_id,
                    input.step,
                    type(err).__name__,
                    err,
                )
