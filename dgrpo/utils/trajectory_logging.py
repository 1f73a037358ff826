"""ART's ``art.utils.trajectory_logging``: trajectory groups to and from ART's Parquet log format, one row per
trajectory (group fields repeated on each), each message flattened to ``role``, ``content``, ``tool_calls``
(JSON), ``tool_call_id`` and ``trainable`` (a sampled choice). Token ids and logprobs are not kept: this is
the readable log, not the training input (activities/trajectory_store.py writes that).

``format_version=2`` writes ART 0.5.23's version of the format (``model.log``'s 0.5.23 files): the same
columns plus ``format_version``, ``trajectory_index`` and the exact JSON of each group (without its
trajectories) and trajectory, the version also in the schema's metadata; a group without trajectories is one
row without trajectory columns, and ``messages`` is empty for a trajectory of captured exchanges. The reader
reads both versions (version 2 exactly, from its JSON) and refuses any other."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from dgrpo.capture.exchange_bodies import exchanges_from_json
from schemas.trajectory import Choice, Trajectory, TrajectoryGroup, as_entry

MESSAGE = pa.struct(
    [
        ("role", pa.string()),
        ("content", pa.string()),
        ("tool_calls", pa.string()),
        ("tool_call_id", pa.string()),
        ("trainable", pa.bool_()),
    ]
)
SCHEMA = pa.schema(
    [
        ("group_index", pa.int64()),
        ("group_metadata", pa.string()),
        ("group_metrics", pa.string()),
        ("group_logs", pa.list_(pa.string())),
        ("reward", pa.float64()),
        ("metrics", pa.string()),
        ("metadata", pa.string()),
        ("tools", pa.string()),
        ("logs", pa.list_(pa.string())),
        ("messages", pa.list_(MESSAGE)),
    ]
)
"""ART's columns, in ART's order: a file either writes is read by the other."""
VERSION_KEY = b"art.trajectory_parquet.version"
SCHEMA_V2 = pa.schema(
    [
        ("format_version", pa.int16()),
        ("group_index", pa.int64()),
        ("trajectory_index", pa.int64()),
        ("group_json", pa.large_string()),
        ("trajectory_json", pa.large_string()),
        *(SCHEMA.field(name) for name in SCHEMA.names if name != "group_index"),
    ],
    metadata={VERSION_KEY: b"2"},
)
"""ART 0.5.23's columns (format version 2)."""


def write_trajectory_groups_parquet(
    trajectory_groups: list[TrajectoryGroup], path: str | Path, *, format_version: int = 1
) -> None:
    """Write the groups' finished trajectories to ``path`` (ZSTD); exceptions are not part of version 1 (ART
    0.5.18's), and are kept in version 2's group JSON (ART 0.5.23's)."""
    if format_version == 2:
        pq.write_table(
            pa.Table.from_pylist(_rows_v2(trajectory_groups), schema=SCHEMA_V2), path, compression="zstd"
        )
        return
    if format_version != 1:
        raise ValueError(
            f"trajectory Parquet format_version={format_version}: give 1 (ART 0.5.18) or 2 (0.5.23)"
        )
    rows = [
        {
            "group_index": index,
            "group_metadata": _json_or_none(group.metadata),
            "group_metrics": _json_or_none(group.metrics),
            "group_logs": group.logs or None,
            "reward": trajectory.reward,
            "metrics": _json_or_none(trajectory.metrics),
            "metadata": _json_or_none(trajectory.metadata),
            "tools": _json_or_none(trajectory.tools),
            "logs": trajectory.logs or None,
            "messages": [_flat_message(item) for item in trajectory.messages_and_choices],
        }
        for index, group in enumerate(trajectory_groups)
        for trajectory in group.trajectories
    ]
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path, compression="zstd")


def _rows_v2(groups: list[TrajectoryGroup]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for index, group in enumerate(groups):
        common = {
            "format_version": 2,
            "group_index": index,
            "group_json": _compact(group.model_dump(mode="json", exclude={"trajectories"})),
            "group_metadata": _json_or_none(group.metadata),
            "group_metrics": _json_or_none(group.metrics),
            "group_logs": group.logs or None,
        }
        if not group.trajectories:
            rows.append(common)
        for t_index, trajectory in enumerate(group.trajectories):
            rows.append(
                {
                    **common,
                    "trajectory_index": t_index,
                    "trajectory_json": _compact(trajectory.model_dump(mode="json")),
                    "reward": trajectory.reward,
                    "metrics": _json_or_none(trajectory.metrics),
                    "metadata": _json_or_none(trajectory.metadata),
                    "tools": _json_or_none(trajectory.tools),
                    "logs": trajectory.logs or None,
                    "messages": None
                    if trajectory.exchanges
                    else [_flat_message(item) for item in trajectory.messages_and_choices],
                }
            )
    return rows


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), allow_nan=True)


def file_version(path: str | Path) -> int:
    """The file's format version: 2 when its schema says so, 1 (ART 0.5.18's, unversioned) otherwise."""
    raw = (pq.read_schema(path).metadata or {}).get(VERSION_KEY)
    if raw is None:
        return 1
    if raw not in (b"1", b"2"):
        raise ValueError(f"{path}: trajectory Parquet version {raw.decode(errors='replace')!r} is not 1 or 2")
    return int(raw)


def read_trajectory_rows(path: str | Path) -> list[dict[str, Any]]:
    """The file's trajectories, one dict per row: its JSON columns decoded (unreadable ones as ``{}``),
    each message's ``tool_calls`` decoded and its ``trainable`` kept; rows with neither reward nor
    messages (ART's empty rows) left out."""
    rows = []
    for row in pq.read_table(path).to_pylist():
        if row.get("reward") is None and row.get("messages") is None:
            continue
        for column in ("group_metadata", "group_metrics", "metrics", "metadata"):
            row[column] = _json_dict(row.get(column))
        row["group_index"] = int(row.get("group_index") or 0)
        row["tools"] = json.loads(row["tools"]) if row.get("tools") else None
        row["messages"] = [_message(m) for m in row.get("messages") or []]
        rows.append(row)
    return rows


def read_trajectory_groups_parquet(path: str | Path) -> list[TrajectoryGroup]:
    """The groups written to ``path``, in group order: from version 2's JSON exactly (captured exchanges with
    their SDK responses), from version 1's columns with choices as plain assistant messages."""
    if file_version(path) == 2:
        return _read_v2(path)
    groups: dict[int, TrajectoryGroup] = {}
    for row in read_trajectory_rows(path):
        index = row["group_index"]
        if index not in groups:
            groups[index] = TrajectoryGroup(
                metadata=row["group_metadata"],
                metrics=row["group_metrics"],
                logs=list(row.get("group_logs") or []),
            )
        groups[index].trajectories.append(
            Trajectory(
                messages_and_choices=[
                    {k: v for k, v in m.items() if k != "trainable"} for m in row["messages"]
                ],
                tools=row["tools"],
                reward=row["reward"],
                metrics=row["metrics"],
                metadata=row["metadata"],
                logs=list(row.get("logs") or []),
            )
        )
    return [groups[i] for i in sorted(groups)]


def _read_v2(path: str | Path) -> list[TrajectoryGroup]:
    groups: dict[int, tuple[dict[str, Any], dict[int, Trajectory]]] = {}
    for row in pq.read_table(path).to_pylist():
        _, trajectories = groups.setdefault(row["group_index"], (json.loads(row["group_json"]), {}))
        if row.get("trajectory_json") is not None:
            data = json.loads(row["trajectory_json"])
            if data.get("exchanges"):
                data["exchanges"] = exchanges_from_json(data["exchanges"])
            trajectories[row["trajectory_index"]] = Trajectory.model_validate(data)
    return [
        TrajectoryGroup([trajectories[i] for i in sorted(trajectories)], **groups[g][0])
        for g, (_, trajectories) in sorted(groups.items())
    ]


def _flat_message(item: Any) -> dict[str, Any]:
    entry = as_entry(item)
    message = entry.message if isinstance(entry, Choice) else entry
    tool_calls = message.get("tool_calls")
    return {
        "role": message.get("role"),
        "content": message.get("content"),
        "tool_calls": json.dumps(tool_calls) if tool_calls else None,
        "tool_call_id": None if isinstance(entry, Choice) else message.get("tool_call_id"),
        "trainable": isinstance(entry, Choice),
    }


def _message(flat: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": flat["role"], "content": flat["content"]}
    if flat.get("tool_calls"):
        message["tool_calls"] = json.loads(flat["tool_calls"])
    if flat.get("tool_call_id"):
        message["tool_call_id"] = flat["tool_call_id"]
    message["trainable"] = bool(flat.get("trainable"))
    return message


def _json_or_none(value: Any) -> str | None:
    return json.dumps(value) if value else None


def _json_dict(payload: str | None) -> dict[str, Any]:
    """A JSON object column; an empty or unreadable payload is an empty dict, as ART reads it."""
    if not payload:
        return {}
    try:
        loaded = json.loads(payload)
    except json.JSONDecodeError:
        return {}
    return loaded if isinstance(loaded, dict) else {}


__all__ = [
    "file_version",
    "read_trajectory_groups_parquet",
    "read_trajectory_rows",
    "write_trajectory_groups_parquet",
]
