"""A run's inline scenario list, stored once in the object store and read back by reference.

An inline ``task.scenarios`` list would otherwise be copied into every rollouts activity's input, and so into
the run's history once per shard per step. ``TrainingRun`` stores it once, at the start, with the control
queue's ``store_scenarios`` activity: the list's JSON at ``layout.scenarios_key`` (named by its sha256, so a
retry, a late attempt or a later run with the same list writes the same bytes to the same key). The rollouts
activities get its ``ObjectRef`` and read it through a worker's ``ScenarioCache``: only at the run's own key,
checked against the sha256, and kept in memory (the key names its content, so a kept list is never stale).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any

from temporalio import activity

from activities.object_store import ObjectStore
from activities.recent import Recent
from schemas.activities import ActivityName, StoreScenariosInput
from schemas.errors import StoredScenariosError, StoreError
from schemas.layout import scenarios_key
from schemas.refs import ObjectRef

CACHED_LISTS = 8
"""Stored scenario lists a worker keeps in memory (the newest read); each is at most the inline cap."""


def scenarios_json(scenarios: list[dict[str, Any]]) -> bytes:
    """The bytes a list is stored as: compact JSON, its dicts' keys in the order given."""
    return json.dumps(scenarios, separators=(",", ":"), ensure_ascii=False).encode()


def store_scenarios(store: ObjectStore, run_id: str, scenarios: list[dict[str, Any]]) -> ObjectRef:
    """Write ``scenarios`` to the run's content-addressed key (again, if there: the same bytes) and return
    its ref."""
    data = scenarios_json(scenarios)
    return store.put_bytes(scenarios_key(run_id, hashlib.sha256(data).hexdigest()), data)


def run_scenarios_key(store: ObjectStore, run_id: str, ref: ObjectRef) -> str:
    """The key ``ref`` names, refused (``StoredScenariosError``) unless it is ``run_id``'s key for its sha256:
    a run reads only the list it stored. Another bucket or scheme raises ``ForeignObjectError``."""
    key = scenarios_key(run_id, ref.sha256)
    if store.key(ref.uri) != key:
        raise StoredScenariosError(
            f"task.scenarios {ref.uri[:200]} is not a scenario list run {run_id!r} stored (that is at "
            f"{store.uri(key)}): give the list inline, or name a file or a 'module:function'"
        )
    return key


def read_scenarios(store: ObjectStore, run_id: str, ref: ObjectRef) -> list[dict[str, Any]]:
    """The list behind ``ref``, refused (``StoredScenariosError``) unless it is at ``run_id``'s key (see
    ``run_scenarios_key``) and holds the bytes ``ref`` records."""
    key = run_scenarios_key(store, run_id, ref)
    try:
        data = store.get_bytes(key)
    except StoreError:
        if store.exists(key):
            raise  # the store failed to answer: retried
        raise StoredScenariosError(
            f"run {run_id!r}'s scenario list {ref.uri} is missing from the object store (deleted after the run "
            "stored it); start the run again from its spec, which stores the list again"
        ) from None
    sha256 = hashlib.sha256(data).hexdigest()
    if sha256 != ref.sha256 or len(data) != ref.size:
        raise StoredScenariosError(
            f"run {run_id!r}'s scenario list {ref.uri} is not the one the run stored (sha256 {sha256[:12]}… vs "
            f"{ref.sha256[:12]}…, {len(data)} vs {ref.size} bytes): it was changed in the store; start the run "
            "again from its spec, which stores the list again"
        )
    try:
        items = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise StoredScenariosError(f"run {run_id!r}'s scenario list {ref.uri} is not JSON ({err})") from None
    if not isinstance(items, list) or not items or not all(isinstance(item, dict) for item in items):
        raise StoredScenariosError(
            f"run {run_id!r}'s scenario list {ref.uri} is not a non-empty list of dicts"
        )
    return items


class ScenarioCache:
    """The stored scenario lists one worker read, by URI (a run's key for the list's sha256): the newest
    ``CACHED_LISTS`` are kept, so a run's shards and steps read the store once."""

    def __init__(self, store: ObjectStore, keep: int = CACHED_LISTS) -> None:
        self.store = store
        self._lists: Recent[list[dict[str, Any]]] = Recent(keep)

    def get(self, run_id: str, ref: ObjectRef) -> list[dict[str, Any]]:
        """The list behind ``ref`` (read as ``read_scenarios`` does, the first time)."""
        run_scenarios_key(self.store, run_id, ref)  # kept or not, a run gets only its own list
        cached = self._lists.get(ref.uri)
        if cached is not None:
            return cached
        items = read_scenarios(self.store, run_id, ref)
        self._lists.put(ref.uri, items)
        return items


class ScenarioActivities:
    """The control queue's ``store_scenarios`` activity. ``ScenarioActivities(store)``: the worker's store."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    @activity.defn(name=ActivityName.STORE_SCENARIOS)
    async def store_scenarios(self, input: StoreScenariosInput) -> ObjectRef:
        return await asyncio.to_thread(store_scenarios, self.store, input.run_id, input.scenarios)
