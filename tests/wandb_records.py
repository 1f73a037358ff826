"""Read an offline W&B run's history back from its ``.wandb`` file (no W&B server, no network).

The file is W&B's transaction log: a 7-byte header, then LevelDB-log framed records (32 KiB blocks;
each chunk has a 7-byte header: crc32, length, type) whose payloads are ``wandb_internal_pb2.Record``.
wandb >= 0.19 ships no Python reader for it, so the tests carry this small one.
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _payloads(data: bytes) -> list[bytes]:
    if data[:4] != b":W&B":
        raise ValueError("not a W&B transaction log")
    out: list[bytes] = []
    pending = b""
    pos = HEADER
    while pos + HEADER <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < HEADER:  # the rest of the block is padding
            pos += left_in_block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        chunk = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind == 0 and length == 0:  # zero padding at the end of a block or of the file
            pos += BLOCK - pos % BLOCK if pos % BLOCK else 0
            continue
        if kind == FULL:
            out.append(chunk)
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            out.append(pending + chunk)
            pending = b""
    return out


def records(run_dir: Path) -> list[wandb_internal_pb2.Record]:
    """Every record of the offline run in ``run_dir`` (``offline-run-*``) as written so far."""
    (wandb_file,) = run_dir.glob("*.wandb")
    out = []
    for payload in _payloads(wandb_file.read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        out.append(record)
    return out


def history(run_dir: Path, wait_s: float = 60.0) -> list[dict[str, Any]]:
    """Every ``run.log`` row of the finished offline run in ``run_dir``, in order.

    W&B's service writes the file after ``run.finish()`` returns, so this waits (up to ``wait_s``) for the
    run's ``exit`` record: then every row before it is in the file.
    """
    deadline = time.monotonic() + wait_s
    written = records(run_dir)
    while not any(r.WhichOneof("record_type") == "exit" for r in written):
        if time.monotonic() > deadline:
            raise AssertionError(f"{run_dir} has no exit record after {wait_s} s: the run never finished")
        time.sleep(0.2)
        written = records(run_dir)
    return [
        {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
        for r in written
        if r.WhichOneof("record_type") == "history"
    ]
