"""ART's local files of a model's ``model.log`` calls, under ``<base_path>/<project>/models/<name>/``
(schemas/layout.py): ``history.jsonl`` (a row of ``<split>/...`` numbers per call, ART's keys and rules),
``trajectories/<split>/<step:04d>.parquet`` (the call's groups, ART's Parquet log format) and ``state.json``
(the running ``<section>/cum/...`` totals, so a model made again continues them).

Written for every model, registered or not, as ART writes them. A registered model's numbers also go to its
run's metrics Parquet in the object store (dgrpo/model_log/run_metrics.py); those rows are dgrpo's and are
built apart from these, with their own running totals, so nothing here changes them.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

from activities.metrics import WANDB_CLOCK, WANDB_STEP
from dgrpo.metrics import MetricsBuilder
from dgrpo.metrics_taxonomy import build_data_metrics_from_summary, summarize_trajectory_groups
from dgrpo.model_log.dialect import ART_0_5_18, LogDialect
from dgrpo.model_log.run_metrics import reward_std_dev
from dgrpo.utils.trajectory_logging import write_trajectory_groups_parquet
from host.files import write_json_atomic
from schemas import layout
from schemas.trajectory import TrajectoryGroup

SECTIONS = ART_0_5_18.sections
"""ART 0.5.18's metric sections: under a split of ``SPLITS``, a ``<section>/...`` key is kept as it is."""
SPLITS = frozenset({"train", "val", "test"})
BUILDER_PREFIXES = ("costs/", "time/step_", "data/step_", "throughput/step_")
"""Numbers ART sums in the metrics builder (so they get roll-ups and ``/cum/`` totals) rather than averages."""
BUILDER_STATE_KEY = "_metrics_builder_state"
"""The key of ``state.json`` that holds the running totals (ART's)."""


def history_key(name: str, split: str, sections: frozenset[str] = SECTIONS) -> str:
    """``name`` as ART writes it in history.jsonl under ``split``: kept when it starts with a section or a split
    (``loss/train``, ``val/reward``) and the split is ``train``/``val``/``test``, else ``<split>/<name>``."""
    first, has_section = name.split("/", 1)[0], "/" in name
    if split in SPLITS and has_section and (first in sections or first in SPLITS):
        return name
    return f"{split}/{name}"


class LocalModelLog:
    """One model's ART-style local files and the running totals behind their ``/cum/`` numbers."""

    def __init__(
        self, base_path: str | Path, project: str, name: str, dialect: LogDialect = ART_0_5_18
    ) -> None:
        self.dir = layout.art_model_dir(base_path, project, name)
        self.dialect = dialect
        """Which ART release's files these are (dgrpo/model_log/dialect.py)."""
        self._started = time.time()
        self._builder = MetricsBuilder(
            "train",
            throughputs={key: (tokens, seconds) for key, tokens, seconds in dialect.throughputs},
            idle_totals=dialect.idle_totals,
        )
        self._loaded = False

    def _scoped(self, split: str) -> MetricsBuilder:
        context = "eval" if split in ("val", "test") else split
        if not self._loaded:  # a model made again continues the totals its files hold
            totals = self._read_state().get(BUILDER_STATE_KEY)
            if isinstance(totals, dict):
                self._builder.load_state_dict(totals)
            self._loaded = True
        return self._builder.for_cost_context(context, buffer_scope=context)

    def _route(self, builder: MetricsBuilder, metrics: dict[str, Any]) -> dict[str, float]:
        """Add ``metrics``' summed numbers to ``builder``; return the others."""
        rest: dict[str, float] = {}
        for name, value in metrics.items():
            if name.startswith("costs_"):
                raise ValueError(
                    f"{name!r}: legacy cost keys are not supported; log 'costs/<context>/<source>' keys instead"
                )
            if name.startswith(BUILDER_PREFIXES):
                builder.add_metric(name, float(value))
            else:
                rest[name] = float(value)
        return rest

    async def log(
        self,
        groups: list[TrajectoryGroup] | None,
        split: str,
        step: int,
        metrics: dict[str, float],
        builder_numbers: tuple[dict[str, float], frozenset[str]],
    ) -> dict[str, float]:
        """One ``model.log`` call: write its groups' Parquet (when given) and return the numbers of its history
        row (empty when none, as ART then writes none; ``append`` writes it). ``builder_numbers`` are what the
        model's own ``MetricsBuilder`` held for the split (``track_api_cost`` costs, ``add_data``), summed in here
        too."""
        builder = self._scoped(split)
        values, scenario_ids = builder_numbers
        for name, value in values.items():
            builder.add_metric(name, value)
        if scenario_ids:
            builder.add_data(scenario_ids=sorted(scenario_ids))
        averages: dict[str, float] = {}
        if groups is not None:
            averages = self._group_numbers(builder, groups, split, set(metrics))
            path = layout.art_trajectories_path(self.dir, split, step)
            path.parent.mkdir(parents=True, exist_ok=True)
            write_trajectory_groups_parquet(groups, path, format_version=self.dialect.parquet_version)
        averages.update(self._route(builder, metrics))
        row = {**averages, **await builder.flush()}
        self._write_state()
        return row

    def _group_numbers(
        self, builder: MetricsBuilder, groups: list[TrajectoryGroup], split: str, given: set[str]
    ) -> dict[str, float]:
        """ART's averages of a batch: reward, exception rate, each trajectory metric, ``group_<metric>`` of each
        group metric, ``reward_std_dev``; the ``data/step_*`` counts go to the builder (a split of ``SPLITS``)."""
        if split in SPLITS:
            summary = summarize_trajectory_groups(groups)
            data = build_data_metrics_from_summary(summary, include_trainable_groups=split == "train")
            for name, value in data.items():
                if name not in given:
                    builder.add_metric(name, value)
            if summary.scenario_ids:
                builder.add_data(scenario_ids=summary.scenario_ids)
        values: dict[str, list[float]] = defaultdict(list)
        per_group: dict[str, list[float]] = defaultdict(list)
        for group in groups:
            group_rest = self._route(builder, dict(group.metrics))
            if group.trajectories:
                for name, value in group_rest.items():
                    per_group[name].append(value)
            values["exception_rate"] += [0.0] * len(group.trajectories) + [1.0] * len(group.exceptions)
            for trajectory in group.trajectories:
                values["reward"].append(trajectory.reward)
                for name, value in self._route(builder, dict(trajectory.metrics)).items():
                    values[name].append(value)
        out = {name: statistics.fmean(vs) for name, vs in values.items() if vs}
        prefix = self.dialect.group_prefix
        out.update({f"{prefix}{name}": statistics.fmean(vs) for name, vs in per_group.items()})
        out["reward_std_dev"] = reward_std_dev(groups)
        return out

    def append(self, row: dict[str, float], split: str, step: int) -> dict[str, Any]:
        """Append ``row`` to ``history.jsonl`` under ART's keys (``history_key``), with ``training_step`` (and
        0.5.18's ``time/wall_clock_sec``); NaNs are left out of the file. Returns the keyed row (what ART sends
        W&B)."""
        keyed: dict[str, Any] = {
            history_key(name, split, self.dialect.sections): value for name, value in row.items()
        }
        keyed[WANDB_STEP] = step
        if self.dialect.wall_clock:
            keyed[WANDB_CLOCK] = time.time() - self._started
        line = {k: v for k, v in keyed.items() if not (isinstance(v, float) and math.isnan(v))}
        line |= {"step": step, "recorded_at": datetime.now().isoformat()}
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / layout.ART_HISTORY_FILE, "a") as f:
            f.write(json.dumps(line) + "\n")
        return keyed

    def best_step(self, metric: str) -> int | None:
        """The step whose ``history.jsonl`` rows give ``metric`` (as keyed there) the highest mean, the later on a
        tie (ART's ``delete_checkpoints`` rule); None without the file or the metric."""
        path = self.dir / layout.ART_HISTORY_FILE
        if not path.exists():
            return None
        values: dict[int, list[float]] = {}
        for line in path.read_text().splitlines():
            row = json.loads(line) if line.strip() else {}
            if isinstance(row.get(metric), int | float) and isinstance(row.get("step"), int):
                values.setdefault(row["step"], []).append(float(row[metric]))
        means = {step: sum(v) / len(v) for step, v in values.items()}
        return max(means, key=lambda step: (means[step], step)) if means else None

    def _read_state(self) -> dict[str, Any]:
        path = self.dir / layout.ART_STATE_FILE
        if not path.exists():
            return {}
        state = json.loads(path.read_text())
        return state if isinstance(state, dict) else {}

    def _write_state(self) -> None:
        """Merge the running totals into ``state.json``, keeping whatever else the program stored there."""
        state = self._read_state() | {BUILDER_STATE_KEY: self._builder.state_dict()}
        write_json_atomic(self.dir / layout.ART_STATE_FILE, state)
