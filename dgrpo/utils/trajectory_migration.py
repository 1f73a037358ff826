"""ART's ``art.utils.trajectory_migration``: ART's older JSONL trajectory logs (one group per line,
``{"trajectories": [...]}``) read, written, and converted to the Parquet log (``trajectory_logging``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openai.types.chat.chat_completion import Choice as OpenAIChoice

from dgrpo.utils.strip_logprobs import strip_logprobs
from dgrpo.utils.trajectory_logging import write_trajectory_groups_parquet
from schemas.trajectory import Trajectory, TrajectoryGroup

TRAJECTORY_KEYS = (
    "messages_and_choices",
    "tools",
    "additional_histories",
    "reward",
    "metrics",
    "metadata",
    "logs",
)
"""A trajectory's fields in the JSONL log (exceptions are not logged)."""


def trajectory_to_dict(trajectory: Trajectory) -> dict[str, Any]:
    """A trajectory as the JSONL log holds it: its logged fields, choices without their logprobs."""
    dumped: dict[str, Any] = strip_logprobs(trajectory.model_dump(mode="json", include=set(TRAJECTORY_KEYS)))
    return dumped


def serialize_trajectory_groups(trajectory_groups: list[TrajectoryGroup]) -> str:
    """The groups as JSONL: one ``{"trajectories": [...]}`` line per group, finished trajectories only."""
    return "\n".join(
        json.dumps({"trajectories": [trajectory_to_dict(t) for t in group.trajectories]})
        for group in trajectory_groups
    )


def deserialize_trajectory_groups(serialized: str) -> list[TrajectoryGroup]:
    """The groups of a JSONL log (``serialize_trajectory_groups``' format); a choice (an item with a
    ``message``) comes back as an openai ``Choice``."""
    return [_group(json.loads(line)) for line in serialized.splitlines() if line.strip()]


def _group(data: dict[str, Any]) -> TrajectoryGroup:
    return TrajectoryGroup([_trajectory(t) for t in data.get("trajectories", [])])


def _trajectory(data: dict[str, Any]) -> Trajectory:
    items = [
        OpenAIChoice.model_validate(m) if "message" in m else m for m in data.get("messages_and_choices", [])
    ]
    return Trajectory(
        messages_and_choices=items,
        tools=data.get("tools"),
        reward=data.get("reward", 0.0),
        metrics=data.get("metrics") or {},
        metadata=data.get("metadata") or {},
        logs=data.get("logs") or [],
    )


@dataclass
class MigrationResult:
    """What a migration did: files converted and skipped, bytes before and after, errors (one per file)."""

    files_migrated: int = 0
    files_skipped: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def compression_ratio(self) -> float:
        return self.bytes_before / self.bytes_after if self.bytes_after else 0.0

    @property
    def space_saved(self) -> int:
        return self.bytes_before - self.bytes_after

    def __add__(self, other: MigrationResult) -> MigrationResult:
        return MigrationResult(
            self.files_migrated + other.files_migrated,
            self.files_skipped + other.files_skipped,
            self.bytes_before + other.bytes_before,
            self.bytes_after + other.bytes_after,
            self.errors + other.errors,
        )


def migrate_jsonl_to_parquet(
    jsonl_path: Path | str, delete_original: bool = True, dry_run: bool = False
) -> MigrationResult:
    """Convert ``<name>.jsonl`` to ``<name>.parquet`` beside it (a file that is not ``.jsonl`` is skipped, a
    missing or unreadable one is an error in the result, never an exception). ``dry_run`` only counts it."""
    path = Path(jsonl_path)
    result = MigrationResult()
    if not path.is_file():
        result.errors.append(f"{path}: no such file")
        return result
    if path.suffix != ".jsonl":
        result.files_skipped = 1
        return result
    result.bytes_before = path.stat().st_size
    if dry_run:
        result.files_migrated = 1
        return result
    target = path.with_suffix(".parquet")
    try:
        groups = deserialize_trajectory_groups(path.read_text())
        write_trajectory_groups_parquet(groups, target)
    except (ValueError, KeyError, TypeError) as err:  # a bad log is reported; the others still migrate
        result.errors.append(f"{path}: {type(err).__name__}: {err}")
        return result
    result.files_migrated, result.bytes_after = 1, target.stat().st_size
    if delete_original:
        path.unlink()
    return result


def migrate_trajectories_dir(
    trajectories_dir: Path | str,
    delete_originals: bool = True,
    dry_run: bool = False,
    progress_callback: Callable[[str], None] | None = None,
) -> MigrationResult:
    """Migrate every ``*.jsonl`` under ``trajectories_dir`` (``train/0000.jsonl``, ``val/...``)."""
    total = MigrationResult()
    for path in sorted(Path(trajectories_dir).rglob("*.jsonl")):
        if progress_callback is not None:
            progress_callback(str(path))
        total = total + migrate_jsonl_to_parquet(path, delete_originals, dry_run)
    return total


def migrate_model_dir(
    model_dir: Path | str,
    delete_originals: bool = True,
    dry_run: bool = False,
    progress_callback: Callable[[str], None] | None = None,
) -> MigrationResult:
    """Migrate a model directory's ``trajectories/`` (nothing to do without one)."""
    trajectories = Path(model_dir) / "trajectories"
    if not trajectories.is_dir():
        return MigrationResult()
    return migrate_trajectories_dir(trajectories, delete_originals, dry_run, progress_callback)


__all__ = [
    "MigrationResult",
    "deserialize_trajectory_groups",
    "migrate_jsonl_to_parquet",
    "migrate_model_dir",
    "migrate_trajectories_dir",
    "serialize_trajectory_groups",
    "trajectory_to_dict",
]
