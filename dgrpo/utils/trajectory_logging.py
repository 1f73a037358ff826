"""ART's ``art.utils.trajectory_logging``: trajectory groups to and from ART's Parquet log format, one row per
trajectory (group fields repeated on each), each message flattened to ``role``, ``content``, ``tool_calls``
(JSON), ``tool_call_id`` and ``trainable`` (a sampled choice). Token ids and logprobs are not kept: this is
the readable log, not the training input (activities/trajectory_store.py writes that)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

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


def write_trajectory_groups_parquet(trajectory_groups: list[TrajectoryGroup], path: str | Path) -> None:
    """Write the groups' finished trajectories to ``path`` (ZSTD); exceptions are not part of the format."""
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
    """The groups written to ``path``, in group order; choices come back as plain assistant messages."""
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


__all__ = ["read_trajectory_groups_parquet", "read_trajectory_rows", "write_trajectory_groups_parquet"]
