"""A slow, healthy transfer is never taken for a stalled one: checkpoint uploads and downloads advance their stage
(activities/progress.py) as their bytes move, on the real publish and download paths, to the real store through a
real slow link (tests/slow_link.py), so the stage's bound covers each block moved, not the whole transfer."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from urllib3.connection import HTTPConnection

from activities import progress
from activities.checkpoints import TRAINER_STATE_FILE, download_checkpoint, publish_staged
from activities.object_store import ObjectStore
from schemas.settings import S3Settings, Stage
from tests.slow_link import SlowLink

RATE = 4 << 20
"""Bytes a second each way: a 16 MiB checkpoint takes 4 s, twice the bound below."""
BOUND_S = 2.0
"""The upload and download stages' bound here: far above the time one block takes (16 KiB up, 1 MiB down, a
quarter of a second at most), far below the whole transfer."""
ADAPTER_BYTES = 16 << 20
SENT_BLOCK = HTTPConnection(host="localhost").blocksize


@pytest.fixture
def slow_store(s3_settings: S3Settings, object_store: ObjectStore) -> Iterator[ObjectStore]:
    """The test's bucket, reached through a link of ``RATE`` bytes a second."""
    endpoint = urlsplit(
        s3_settings.endpoint if "//" in s3_settings.endpoint else f"http://{s3_settings.endpoint}"
    )
    with SlowLink((str(endpoint.hostname), int(endpoint.port or 80)), RATE) as link:
        yield ObjectStore(
            s3_settings.model_copy(update={"endpoint": link.address, "bucket": object_store.bucket})
        )


class Counted(progress.Progress):
    """An attempt's stages that count how often they advance."""

    advances = 0

    def advance(self) -> None:
        self.advances += 1
        super().advance()


def as_stage(stage: Stage, work: Callable[[], object]) -> tuple[float, list[str], int]:
    """``work()`` as stage ``stage`` of an attempt whose bound for it is ``BOUND_S``, watched as the heartbeat
    ticker watches it (``stalled()``, every 50 ms); how long it took, every stall seen and how often it advanced."""
    attempt = Counted({stage: BOUND_S})
    stalls: list[str] = []
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.05):
            if (stall := attempt.stalled()) is not None:
                stalls.append(stall)

    watcher = threading.Thread(target=watch)
    watcher.start()
    started = time.monotonic()
    try:
        with progress.tracking(attempt), progress.stage(stage):
            work()
    finally:
        done.set()
        watcher.join()
    return time.monotonic() - started, stalls, attempt.advances


def staged_checkpoint(directory: Path) -> Path:
    directory.mkdir()
    (directory / "adapter_model.safetensors").write_bytes(os.urandom(ADAPTER_BYTES))
    (directory / "adapter_config.json").write_text('{"r": 8}')
    (directory / TRAINER_STATE_FILE).write_text('{"run_id": "slow", "step": 1, "base_model": "m"}')
    return directory


def test_a_slow_publish_and_download_advance_as_their_bytes_move(
    slow_store: ObjectStore, tmp_path: Path
) -> None:
    staged = staged_checkpoint(tmp_path / "staged")
    published: list[object] = []
    took, stalls, advances = as_stage(
        "upload", lambda: published.append(publish_staged(slow_store, staged, "slow", 1))
    )
    assert took > BOUND_S, f"the upload took {took:.1f} s: no longer than its bound, it shows nothing"
    assert stalls == [], f"a healthy upload of {took:.1f} s was seen as stalled: {stalls[:1]}"
    assert advances >= ADAPTER_BYTES // SENT_BLOCK, advances  # each block sent (docs/isolation.md)

    took, stalls, advances = as_stage(
        "download", lambda: download_checkpoint(slow_store, published[0], tmp_path / "got")
    )
    assert took > BOUND_S, f"the download took {took:.1f} s: no longer than its bound, it shows nothing"
    assert stalls == [], f"a healthy download of {took:.1f} s was seen as stalled: {stalls[:1]}"
    assert advances >= ADAPTER_BYTES >> 20, advances  # each MiB received
    assert (tmp_path / "got" / "adapter_model.safetensors").read_bytes() == (
        staged / "adapter_model.safetensors"
    ).read_bytes()
