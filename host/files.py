"""Files on this machine written so a reader never sees half of one: temp file in the same folder, then rename."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


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
