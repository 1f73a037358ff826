"""Files on this machine written so a reader never sees half of one (temp file in the same folder, then rename),
and only where they belong: a name from elsewhere (an object key, a manifest path) lands inside its folder or
nowhere."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any


def inside(root: str | Path, relative: str) -> Path | None:
    """Where file ``relative`` (an object key's tail, a manifest path: ``/``-separated) lands under ``root``, once
    ``..`` and the links already on disk are resolved; None when that is not strictly inside ``root``: a leading
    ``/`` (a key with ``//`` after its prefix), ``..`` past the top, a link out, or ``root`` itself."""
    base = Path(root).resolve()
    name = PurePosixPath(relative)
    if not relative or relative.endswith("/") or name.is_absolute() or "\0" in relative:
        return None
    try:
        target = base.joinpath(*name.parts).resolve()
    except (OSError, RuntimeError):  # a link loop
        return None
    return target if target != base and target.is_relative_to(base) else None


def write_atomic(path: str | Path, data: bytes | str, mode: int = 0o644) -> Path:
    """Write ``data`` to ``path`` via a uniquely named temp file and a rename (two writers never share one).

    The file is fsynced before the rename, and ``mode`` is set before anyone can open it by its name.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def write_json_atomic(path: str | Path, data: Any, mode: int = 0o644) -> Path:
    """``write_atomic`` of ``data`` as indented JSON with sorted keys."""
    return write_atomic(path, json.dumps(data, indent=2, sort_keys=True), mode)


def write_dir_atomic(path: str | Path, fill: Callable[[Path], None]) -> Path:
    """Make directory ``path`` by ``fill(staging)`` on a uniquely named temp directory beside it, then a rename
    over it: a reader sees no directory, the old one or the whole new one (never half of one)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        fill(staging)
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def merge_dir(source: str | Path, target: str | Path) -> list[str]:
    """Move every file of ``source`` into ``target`` at the same relative path, replacing a file of that name
    and keeping every other file of ``target`` (a merge, as ``cp -r`` or ``aws s3 sync`` into a folder); the
    relative paths that would leave ``target`` (through its links) are left behind and returned."""
    root, left = Path(source), []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        dest = inside(target, rel)
        if dest is None:
            left.append(rel)
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, dest)
    return left
