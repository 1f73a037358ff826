"""A run's large fixed texts (its own chat template, its judge rubric), stored once and read by reference.

Copied into every rollouts shard's input, every training attempt's and every judge call's, a 64 KiB template
multiplied into a run's history: 128 shards of one step, scheduled in one workflow task, passed gRPC's 4 MiB
message limit. ``TrainingRun`` stores each text once, at the start, with the control queue's ``store_run_texts``
activity (at ``layout.run_text_key``, named by its sha256, so a retry or a later run with the same text writes the
same bytes to the same key), and the activities get its ``ObjectRef``; a worker reads a text only at the run's own
key for its kind, checked against the sha256, and keeps the newest few in memory.
"""

from __future__ import annotations

import asyncio
import hashlib

from temporalio import activity

from activities.object_store import ObjectStore
from activities.recent import Recent
from schemas.activities import ActivityName, RunTextKind, RunTexts, StoreRunTextsInput
from schemas.errors import StoredRunTextError, StoreError
from schemas.layout import run_text_key
from schemas.refs import ObjectRef

CACHED_TEXTS = 16
"""Stored texts a worker keeps in memory (the newest read); each is at most 64 Ki characters."""


def store_run_texts(store: ObjectStore, run_id: str, texts: dict[RunTextKind, str]) -> RunTexts:
    """Write each text to the run's content-addressed key for its kind (again, if there: the same bytes)."""
    refs: dict[str, ObjectRef] = {}
    for kind, text in texts.items():
        data = text.encode()
        refs[kind] = store.put_bytes(run_text_key(run_id, kind, hashlib.sha256(data).hexdigest()), data)
    return RunTexts.model_validate(refs)


def read_run_text(store: ObjectStore, run_id: str, kind: RunTextKind, ref: ObjectRef) -> str:
    """The text behind ``ref``, refused (``StoredRunTextError``) unless it is at ``run_id``'s key for ``kind``
    and its sha256, and holds the bytes ``ref`` records."""
    key = run_text_key(run_id, kind, ref.sha256)
    what = kind.replace("_", " ")
    if store.key(ref.uri) != key:
        raise StoredRunTextError(
            f"{ref.uri[:200]} is not a {what} run {run_id!r} stored (that is at {store.uri(key)})"
        )
    try:
        data = store.get_bytes(key)
    except StoreError:
        if store.exists(key):
            raise  # the store failed to answer: retried
        raise StoredRunTextError(
            f"run {run_id!r}'s {what} {ref.uri} is missing from the object store (deleted after the run stored "
            "it); start the run again from its spec, which stores it again"
        ) from None
    if hashlib.sha256(data).hexdigest() != ref.sha256 or len(data) != ref.size:
        raise StoredRunTextError(
            f"run {run_id!r}'s {what} {ref.uri} is not the one the run stored: it was changed in the store; "
            "start the run again from its spec, which stores it again"
        )
    return data.decode()


class RunTextCache:
    """The stored texts one worker read, by URI (the key names the content, so a kept text is never stale)."""

    def __init__(self, store: ObjectStore, keep: int = CACHED_TEXTS) -> None:
        self.store = store
        self._texts: Recent[str] = Recent(keep)

    def get(self, run_id: str, kind: RunTextKind, ref: ObjectRef) -> str:
        cached = self._texts.get(ref.uri)
        if cached is not None and self.store.key(ref.uri) == run_text_key(run_id, kind, ref.sha256):
            return cached
        text = read_run_text(self.store, run_id, kind, ref)
        self._texts.put(ref.uri, text)
        return text


class RunTextActivities:
    """The control queue's ``store_run_texts`` activity. ``RunTextActivities(store)``: the worker's store."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    @activity.defn(name=ActivityName.STORE_RUN_TEXTS)
    async def store_run_texts(self, input: StoreRunTextsInput) -> RunTexts:
        return await asyncio.to_thread(store_run_texts, self.store, input.run_id, input.texts)
