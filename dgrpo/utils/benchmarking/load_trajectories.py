"""``load_trajectories``: every trajectory Parquet that ``model.log`` wrote under a project, one row each.

The files are ART's local layout, ``<art_path>/<project>/models/<model>/trajectories/<split>/<step>.parquet``
(schemas/layout.py), read with dgrpo's reader of that format (``dgrpo.utils.trajectory_logging``).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

try:
    import polars as pl
except ImportError as err:  # a dev dependency: the client itself never needs a DataFrame
    raise ImportError("load_trajectories returns a polars DataFrame: pip install polars") from err

from dgrpo.utils.trajectory_logging import read_trajectory_rows
from schemas import layout

log = logging.getLogger(__name__)

TOOL_CALL = pl.Struct({"function": pl.Struct({"name": pl.Utf8, "arguments": pl.Utf8})})
FIXED_COLUMNS: dict[str, Any] = {
    "model": pl.Utf8,
    "split": pl.Utf8,
    "step": pl.Int64,
    "reward": pl.Float64,
    "group_number": pl.Int64,
    "messages": pl.List(
        pl.Struct(
            {"role": pl.Utf8, "content": pl.Utf8, "tool_calls": pl.List(TOOL_CALL), "trainable": pl.Boolean}
        )
    ),
    "logs": pl.List(pl.Utf8),
}
"""The columns every table has; ``metric_*``, ``metadata_*``, ``group_metric_*``, ``group_metadata_*`` follow."""


async def load_trajectories(
    project_name: str, models: list[str] | None = None, debug: bool = False, art_path: str | None = None
) -> pl.DataFrame:
    """One row per logged trajectory of ``models`` (all when None) of ``project_name`` under ``art_path``
    (default: ``.art``, the models' own default ``base_path``); an empty DataFrame when there are none.

    Each row: ``model``, ``split``, ``step``, ``reward``, ``group_number`` (counting each file's groups from 1
    across the table), ``messages`` (``role``, ``content``, ``tool_calls``, ``trainable``), ``logs``, and a
    column per metric (``metric_<key>``, ``group_metric_<key>``: floats) and metadata key
    (``metadata_<key>``, ``group_metadata_<key>``: strings). ``debug`` logs each file read.
    """
    return await asyncio.to_thread(_load, project_name, models, debug, art_path or layout.ART_BASE_PATH)


def _load(project: str, models: list[str] | None, debug: bool, art_path: str) -> pl.DataFrame:
    rows: list[dict[str, Any]] = []
    dynamic: dict[str, Any] = {}
    groups: dict[tuple[str, str, int, int], int] = {}
    for model, split, step, path in _files(Path(art_path) / project / "models", models):
        if debug:
            log.info("load_trajectories: reading %s", path)
        for row in read_trajectory_rows(path):
            number = groups.setdefault((model, split, step, row["group_index"]), len(groups) + 1)
            columns: dict[str, Any] = {}
            for prefix, source in (("metric_", row["metrics"]), ("group_metric_", row["group_metrics"])):
                columns |= {f"{prefix}{k}": float(v) for k, v in source.items() if _is_number(v)}
            for prefix, source in (
                ("metadata_", row["metadata"]),
                ("group_metadata_", row["group_metadata"]),
            ):
                columns |= {f"{prefix}{k}": str(v) for k, v in source.items()}
            dynamic |= {name: pl.Float64 if "metric_" in name else pl.Utf8 for name in columns}
            messages = [
                {
                    "role": m["role"],
                    "content": m["content"],
                    "tool_calls": m.get("tool_calls"),
                    "trainable": m["trainable"],
                }
                for m in row["messages"]
            ]
            rows.append(
                {
                    "model": model,
                    "split": split,
                    "step": step,
                    "reward": row["reward"],
                    "group_number": number,
                }
                | {"messages": messages, "logs": row.get("logs")}
                | columns
            )
    if not rows:
        return pl.DataFrame()
    return pl.DataFrame(rows, schema=FIXED_COLUMNS | dict(sorted(dynamic.items())))


def _files(models_dir: Path, models: list[str] | None) -> list[tuple[str, str, int, Path]]:
    """``(model, split, step, path)`` of each ``<step>.parquet``, in model, split and step order."""
    if not models_dir.is_dir():
        return []
    wanted = None if models is None else set(models)
    found = []
    for model_dir in sorted(models_dir.iterdir()):
        if not model_dir.is_dir() or (wanted is not None and model_dir.name not in wanted):
            continue
        for path in (model_dir / "trajectories").glob("*/*.parquet"):
            if path.stem.isdigit():
                found.append((model_dir.name, path.parent.name, int(path.stem), path))
    return sorted(found, key=lambda f: (f[0], f[1], f[2]))


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


__all__ = ["load_trajectories"]
