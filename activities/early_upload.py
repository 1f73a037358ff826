"""A trained step's adapter files uploaded as soon as they are serialized, before ``publish_adapter`` asks.

The trainer's ``publish_adapter`` reaches it a workflow round trip after its training returned; the adapter's files
go up meanwhile, on a thread of their own, under their checkpoint's keys but without a manifest (so nothing reads
them yet). ``publish_adapter`` then writes the adapter manifest once they are up, or uploads them itself when they
are not (this early upload skipped, failed or is slow). It skips a step whose checkpoint has a manifest already
(published before: trained again, or a retry), which ``publish_adapter`` replaces carefully.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from pathlib import Path

from activities.checkpoints import AdapterFiles
from activities.object_store import ObjectStore
from schemas import layout

log = logging.getLogger(__name__)

WAIT_S = 30.0
"""How long ``publish_adapter`` waits for an early upload before it uploads the files itself."""


class EarlyUploads:
    """A trainer's early adapter uploads, by staging directory."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="early-upload")
        self._uploads: dict[Path, concurrent.futures.Future[bool]] = {}
        self._lock = threading.Lock()

    def start(self, staged: Path, files: AdapterFiles, run_id: str, step: int) -> None:
        """Upload ``files`` (a step's adapter, staged in ``staged``) beside whatever follows."""
        upload = self._pool.submit(self._upload, files, layout.checkpoint_prefix(run_id, step))
        with self._lock:
            self._uploads[staged] = upload

    def _upload(self, files: AdapterFiles, prefix: str) -> bool:
        manifests = {prefix + layout.MANIFEST_NAME, prefix + layout.ADAPTER_MANIFEST_NAME}
        if manifests & set(self.store.list(prefix, recursive=False)):
            return False  # published before: publish_adapter replaces it, manifest first
        for name, (data, sha256) in files.items():
            self.store.put_bytes(prefix + name, data, sha256)
        return True

    def done(self, staged: Path) -> bool:
        """Whether ``staged``'s adapter files went up early (waiting for them at most ``WAIT_S``)."""
        with self._lock:
            upload = self._uploads.get(staged)
        if upload is None:
            return False
        try:
            return upload.result(timeout=WAIT_S)
        except Exception as err:  # publish_adapter uploads them itself
            log.warning("the early upload of %s's adapter did not go up (%s); uploading it now", staged, err)
            return False

    def settle(self, staged: Path) -> None:
        """Wait (at most ``WAIT_S``) until ``staged``'s early upload, if any, has ended, however it ended."""
        with self._lock:
            upload = self._uploads.get(staged)
        if upload is not None:
            concurrent.futures.wait([upload], timeout=WAIT_S)

    def forget(self, staged: Path) -> None:
        with self._lock:
            self._uploads.pop(staged, None)
