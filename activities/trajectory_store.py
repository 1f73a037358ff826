"""Trajectory groups as zstd Parquet: one exact JSON column plus columns to analyse with polars/duckdb.

One row per finished trajectory (``kind = 'trajectory'``) and one per recorded exception
(``kind = 'exception'``), in group order. ``trajectory_json`` / ``exception_json`` are authoritative
(``model_dump_json``, NaN kept as NaN), so the round trip is exact; the other columns are derived for analysis:

    SELECT group_index, avg(reward) FROM read_parquet('trajectories.parquet')
    WHERE kind = 'trajectory' GROUP BY 1

Group metadata and per-group counts (empty groups included) live in the file's key-value metadata
under ``dgrpo.groups``, next to ``dgrpo.schema_version`` and ``dgrpo.producer``.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections.abc import Sequence
from importlib import metadata as pkg_metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel
from pydantic_core import to_json

from activities.object_store import ObjectStore
from host.files import write_atomic
from schemas import layout
from schemas.errors import CorruptTrajectoriesError
from schemas.refs import ObjectRef, TrajectoriesRef
from schemas.trajectory import SCHEMA_VERSION, ExceptionRecord, Trajectory, TrajectoryGroup

META_SCHEMA_VERSION = b"dgrpo.schema_version"
META_PRODUCER = b"dgrpo.producer"
META_GROUPS = b"dgrpo.groups"
KIND_TRAJECTORY = "trajectory"
KIND_EXCEPTION = "exception"

MESSAGE_TYPE = pa.struct([("role", pa.string()), ("content", pa.string())])
ARROW_SCHEMA = pa.schema(
    [
        ("kind", pa.string()),
        ("run_id", pa.string()),
        ("step", pa.int64()),
        ("group_index", pa.int32()),
        ("trajectory_index", pa.int32()),
        ("reward", pa.float64()),
        ("advantage", pa.float64()),
        ("n_choices", pa.int32()),
        ("prompt_tokens", pa.int64()),
        ("completion_tokens", pa.int64()),
        ("policy_step", pa.int64()),
        ("policy_sha256", pa.string()),
        ("exception_type", pa.string()),
        ("messages", pa.list_(MESSAGE_TYPE)),
        ("trajectory_json", pa.large_string()),  # may pass 2 GiB in one step
        ("exception_json", pa.string()),
    ]
)
"""The file's columns. Token counts sum over choices and are null unless every choice has its ids."""

GROUP_COLUMNS = ("kind", "group_index", "trajectory_json", "exception_json")
"""The columns the groups are rebuilt from; the rest are derived."""

Advantages = Sequence[Sequence[float | None]]


def record_json(record: BaseModel) -> str:
    """``model_dump_json``, except NaN and ±Infinity stay numbers (pydantic would write null)."""
    return to_json(record.model_dump(), inf_nan_mode="constants").decode()


def producer() -> str:
    try:
        return f"durable-grpo {pkg_metadata.version('durable-grpo')}"
    except pkg_metadata.PackageNotFoundError:
        return "durable-grpo"


def flatten_content(content: Any) -> str | None:
    """A message's content as plain text: strings as is, text parts joined, anything else as JSON."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
        if len(texts) == len(content):
            return "".join(texts)
    return json.dumps(content, ensure_ascii=False)


def _token_count(per_choice: list[list[int] | None]) -> int | None:
    if not per_choice or any(ids is None for ids in per_choice):
        return None
    return sum(len(ids) for ids in per_choice if ids is not None)


def _trajectory_row(traj: Trajectory, advantage: float | None) -> dict[str, Any]:
    choices = traj.choices()
    return {
        "kind": KIND_TRAJECTORY,
        "reward": traj.reward,
        "advantage": advantage,
        "n_choices": len(choices),
        "prompt_tokens": _token_count([c.prompt_token_ids for c in choices]),
        "completion_tokens": _token_count([c.token_ids for c in choices]),
        "policy_step": traj.policy_step,
        "policy_sha256": traj.policy_sha256,
        "messages": [
            {"role": str(m.get("role")), "content": flatten_content(m.get("content"))}
            for m in traj.messages()
        ],
        "trajectory_json": record_json(traj),
    }


def groups_to_table(
    groups: Sequence[TrajectoryGroup],
    *,
    run_id: str | None = None,
    step: int | None = None,
    advantages: Advantages | None = None,
) -> pa.Table:
    """The Arrow table (with our metadata) for ``groups``; ``advantages[g][i]`` goes with trajectory i of group g."""
    if advantages is not None:
        shape = [len(a) for a in advantages]
        expected = [len(g.trajectories) for g in groups]
        if shape != expected:
            raise ValueError(f"advantages have shape {shape}, but the groups have {expected} trajectories")
    rows: list[dict[str, Any]] = []
    for g, group in enumerate(groups):
        for i, traj in enumerate(group.trajectories):
            adv = None if advantages is None else advantages[g][i]
            rows.append({**_trajectory_row(traj, adv), "group_index": g, "trajectory_index": i})
        for i, exc in enumerate(group.exceptions):
            rows.append(
                {
                    "kind": KIND_EXCEPTION,
                    "group_index": g,
                    "trajectory_index": i,
                    "exception_type": exc.type,
                    "exception_json": record_json(exc),
                }
            )
    for row in rows:
        row["run_id"], row["step"] = run_id, step
    table = pa.Table.from_pylist(rows, schema=ARROW_SCHEMA)
    group_info = [
        {"metadata": g.metadata, "n_trajectories": len(g.trajectories), "n_exceptions": len(g.exceptions)}
        for g in groups
    ]
    return table.replace_schema_metadata(
        {
            META_SCHEMA_VERSION: str(SCHEMA_VERSION).encode(),
            META_PRODUCER: producer().encode(),
            META_GROUPS: json.dumps(group_info, ensure_ascii=False).encode(),
        }
    )


def table_to_groups(table: pa.Table, source: str) -> list[TrajectoryGroup]:
    """Rebuild the groups from a table written by ``groups_to_table``; ``source`` names it in errors."""
    meta = table.schema.metadata or {}
    if META_SCHEMA_VERSION not in meta or META_GROUPS not in meta:
        raise CorruptTrajectoriesError(
            f"{source}: a Parquet file, but not written by durable-grpo (no {META_SCHEMA_VERSION.decode()} "
            "metadata)"
        )
    try:
        version = int(meta[META_SCHEMA_VERSION])
        group_info = json.loads(meta[META_GROUPS])
    except ValueError as err:
        raise CorruptTrajectoriesError(f"{source}: unreadable durable-grpo metadata: {err}") from None
    if version > SCHEMA_VERSION:
        raise CorruptTrajectoriesError(
            f"{source}: written with trajectory schema version {version} by "
            f"{meta.get(META_PRODUCER, b'?').decode()}, newer than this version's {SCHEMA_VERSION}; "
            "upgrade durable-grpo to read it"
        )
    missing = [
        n for n in ("kind", "group_index", "trajectory_json", "exception_json") if n not in table.schema.names
    ]
    if missing:
        raise CorruptTrajectoriesError(f"{source}: missing column(s) {missing}")
    kinds = table.column("kind").to_pylist()
    group_index = table.column("group_index").to_pylist()
    traj_json = table.column("trajectory_json").to_pylist()
    exc_json = table.column("exception_json").to_pylist()
    buckets: list[tuple[list[Trajectory], list[ExceptionRecord]]] = [([], []) for _ in group_info]
    try:
        for kind, g, tj, ej in zip(kinds, group_index, traj_json, exc_json, strict=True):
            if kind == KIND_TRAJECTORY:
                buckets[g][0].append(Trajectory.model_validate_json(tj))
            elif kind == KIND_EXCEPTION:
                buckets[g][1].append(ExceptionRecord.model_validate_json(ej))
            else:
                raise ValueError(f"unknown row kind {kind!r}")
        groups = []
        for info, (trajs, excs) in zip(group_info, buckets, strict=True):
            if (len(trajs), len(excs)) != (info["n_trajectories"], info["n_exceptions"]):
                raise ValueError("row counts disagree with the dgrpo.groups metadata")
            groups.append(TrajectoryGroup(trajs, exceptions=excs, metadata=info["metadata"]))
    except (ValueError, TypeError, IndexError, KeyError) as err:
        raise CorruptTrajectoriesError(
            f"{source}: rows do not rebuild into trajectory groups: {err}"
        ) from None
    return groups


def _parquet_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    return bytes(sink.getvalue().to_pybytes())


def _read_table(
    source: str | Path | pa.BufferReader, name: str, columns: Sequence[str] | None = None
) -> pa.Table:
    """Read (only ``columns`` that exist, when given); any failure is a CorruptTrajectoriesError naming ``name``."""
    try:
        parquet = pq.ParquetFile(source)
        wanted = None if columns is None else [c for c in columns if c in parquet.schema_arrow.names]
        return parquet.read(columns=wanted)
    except (pa.ArrowException, OSError) as err:
        raise CorruptTrajectoriesError(f"{name}: not a readable Parquet file ({err})") from None


def summarize(
    groups: Sequence[TrajectoryGroup], ref: ObjectRef, run_id: str | None, step: int | None
) -> TrajectoriesRef:
    """The small summary a workflow carries instead of the trajectories."""
    rewards = [t.reward for g in groups for t in g.trajectories if math.isfinite(t.reward)]
    try:
        mean, std = (statistics.fmean(rewards), statistics.pstdev(rewards)) if rewards else (None, None)
    except (
        OverflowError
    ):  # rewards near float's limit (the rollouts activity refuses them; a file may hold them)
        mean, std = None, None
    return TrajectoriesRef(
        ref=ref,
        run_id=run_id or "",
        step=step or 0,
        n_groups=len(groups),
        n_trajectories=sum(len(g.trajectories) for g in groups),
        n_exceptions=sum(len(g.exceptions) for g in groups),
        reward_mean=mean,
        reward_std=std,
        policy_adapters=sorted({t.policy_sha256 for g in groups for t in g.trajectories if t.policy_sha256}),
    )


# ---- local files ----------------------------------------------------------------------------------
def write_groups(
    groups: Sequence[TrajectoryGroup],
    path: str | Path,
    *,
    run_id: str | None = None,
    step: int | None = None,
    advantages: Advantages | None = None,
) -> TrajectoriesRef:
    """Write ``groups`` to a local Parquet file (atomically: temp file, then rename)."""
    target = Path(path).absolute()
    data = _parquet_bytes(groups_to_table(groups, run_id=run_id, step=step, advantages=advantages))
    write_atomic(target, data)
    ref = ObjectRef(uri=target.as_uri(), size=len(data), sha256=hashlib.sha256(data).hexdigest())
    return summarize(groups, ref, run_id, step)


def read_table(path: str | Path, columns: Sequence[str] | None = None) -> pa.Table:
    """The raw Arrow table of a trajectories file (analytic columns included, unless ``columns`` is given)."""
    return _read_table(str(path), str(path), columns)


def read_groups(path: str | Path) -> list[TrajectoryGroup]:
    """Read the groups back from a local file written by ``write_groups``."""
    return table_to_groups(read_table(path, GROUP_COLUMNS), str(path))


def read_advantages(path: str | Path) -> list[list[float | None]]:
    """The advantage column, shaped like the groups' trajectories."""
    return advantages_of(read_table(path), str(path))


def advantages_of(table: pa.Table, source: str) -> list[list[float | None]]:
    groups = json.loads((table.schema.metadata or {}).get(META_GROUPS, b"[]"))
    out: list[list[float | None]] = [[] for _ in groups]
    for kind, g, adv in zip(
        table.column("kind").to_pylist(),
        table.column("group_index").to_pylist(),
        table.column("advantage").to_pylist(),
        strict=True,
    ):
        if kind == KIND_TRAJECTORY:
            if g >= len(out):
                raise CorruptTrajectoriesError(f"{source}: row of group {g}, but only {len(out)} groups")
            out[g].append(adv)
    return out


# ---- the object store -----------------------------------------------------------------------------
def upload_groups(
    store: ObjectStore,
    groups: Sequence[TrajectoryGroup],
    run_id: str,
    step: int,
    *,
    key: str | None = None,
    advantages: Advantages | None = None,
) -> TrajectoriesRef:
    """Upload to ``key`` (default: the step's ``trajectories.parquet``); a retry overwrites the same key."""
    table = groups_to_table(groups, run_id=run_id, step=step, advantages=advantages)
    ref = store.put_bytes(key or layout.trajectories_key(run_id, step), _parquet_bytes(table))
    return summarize(groups, ref, run_id, step)


def download_table(store: ObjectStore, key_or_uri: str, columns: Sequence[str] | None = None) -> pa.Table:
    data = store.get_bytes(key_or_uri)
    return _read_table(pa.BufferReader(data), store.uri(store.key(key_or_uri)), columns)


def read_ref(store: ObjectStore, ref: ObjectRef, columns: Sequence[str] | None = None) -> pa.Table:
    """The table behind ``ref``, an object of ``store`` (any other URI, ``file://`` included, raises
    ``ForeignObjectError``), refused unless its bytes are the ones recorded when it was written: a late
    attempt that overwrote the file is caught here."""
    return _read_table(pa.BufferReader(verified_bytes(store, ref)), ref.uri, columns)


def verified_bytes(store: ObjectStore, ref: ObjectRef) -> bytes:
    """The bytes behind ``ref``, refused (``CorruptTrajectoriesError``) unless they are the ones recorded."""
    data = store.get_bytes(ref.uri)
    sha256 = hashlib.sha256(data).hexdigest()
    if sha256 != ref.sha256 or len(data) != ref.size:
        raise CorruptTrajectoriesError(
            f"{ref.uri} is not the file that was recorded (sha256 {sha256[:12]}… vs {ref.sha256[:12]}…, "
            f"{len(data)} vs {ref.size} bytes): it was overwritten after it was written; roll the step out again"
        )
    return data


def read_ref_groups(store: ObjectStore, ref: ObjectRef) -> list[TrajectoryGroup]:
    """The groups behind ``ref``, verified as ``read_ref`` does."""
    return table_to_groups(read_ref(store, ref, GROUP_COLUMNS), ref.uri)


def download_groups(store: ObjectStore, key_or_uri: str) -> list[TrajectoryGroup]:
    """Read groups from ``key_or_uri`` (a key of the store's bucket or its ``s3://`` URI)."""
    table = download_table(store, key_or_uri, GROUP_COLUMNS)
    return table_to_groups(table, store.uri(store.key(key_or_uri)))


def load_groups(location: str | Path, store: ObjectStore | None = None) -> list[TrajectoryGroup]:
    """Groups from an ``s3://`` URI (needs ``store``), a ``file://`` URI, or a local path."""
    text = str(location)
    if text.startswith("s3://"):
        if store is None:
            raise ValueError(f"{text} is in S3; pass the ObjectStore to read it")
        return download_groups(store, text)
    return read_groups(url2pathname(urlparse(text).path) if text.startswith("file://") else text)
