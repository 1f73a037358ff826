"""Serving activities of the inference worker: load a published adapter on its servers; sleep and wake them.

``ServingActivities(servers, store=None, adapter_root=None, leases=None)``:

- ``servers``: the server URLs this worker fronts (``http://host:port``, with or without ``/v1``), or
  ``ServingClient`` objects; our CPU server and vLLM alike.
- ``store``: the ``ObjectStore`` checkpoints are read from; default ``ObjectStore.from_env()`` on first use.
- ``adapter_root``: where checkpoints are downloaded (the servers read adapters from this machine's disk);
  default ``$DGRPO_HOME/adapters``. A checkpoint lands in ``<root>/<run_id>/<step:06d>/``.
- ``leases``: an ``AdapterLeases`` shared with the rollout activities; reload never evicts a held adapter.

Register ``ServingActivities(...).all()``: ``reload`` (``ReloadInput`` -> ``ReloadResult``) and
``serving_control`` (``ServingControlInput`` -> None).
"""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.checkpoints import download_checkpoint
from activities.object_store import ObjectStore
from schemas.activities import ReloadInput, ReloadResult, ServingControlInput
from schemas.errors import CONFIG_ERROR, CORRUPT_CHECKPOINT, CorruptCheckpointError, StoreError
from schemas.layout import adapter_name
from schemas.settings import dgrpo_home
from serving.client import ServingClient, ServingError

log = logging.getLogger(__name__)

ADAPTER_FILE_PREFIX = "adapter_"
"""Checkpoint files the server reads (``adapter_config.json``, ``adapter_model.safetensors``)."""


class AdapterLeases:
    """Adapters that work on this worker still needs (a multi-turn rollout between two requests)."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()

    @contextmanager
    def hold(self, name: str) -> Iterator[None]:
        """Keep ``name`` loaded while the block runs."""
        self._counts[name] += 1
        try:
            yield
        finally:
            self._counts[name] -= 1
            if self._counts[name] <= 0:
                del self._counts[name]

    def held(self) -> set[str]:
        return set(self._counts)


def _heartbeat(*details: Any) -> None:
    if activity.in_activity():
        activity.heartbeat(*details)


def _adapter_step(model_name: str, name: str) -> int | None:
    match = re.fullmatch(re.escape(model_name) + r"@(\d+)", name)
    return int(match.group(1)) if match else None


class ServingActivities:
    """The inference worker's serving activities over a fixed list of servers (see the module doc)."""

    def __init__(
        self,
        servers: Sequence[str | ServingClient],
        store: ObjectStore | None = None,
        adapter_root: str | Path | None = None,
        leases: AdapterLeases | None = None,
    ) -> None:
        if not servers:
            raise ValueError("ServingActivities needs at least one server URL")
        self.clients = [s if isinstance(s, ServingClient) else ServingClient(s) for s in servers]
        self._store = store
        self.adapter_root = Path(adapter_root or Path(dgrpo_home()) / "adapters")
        self.leases = leases or AdapterLeases()

    @property
    def store(self) -> ObjectStore:
        if self._store is None:
            self._store = ObjectStore.from_env()
        return self._store

    def all(self) -> list[Callable[..., Any]]:
        return [self.reload, self.serving_control]

    def local_dir(self, run_id: str, step: int) -> Path:
        return self.adapter_root / run_id / f"{step:06d}"

    @activity.defn(name="reload")
    async def reload(self, input: ReloadInput) -> ReloadResult:
        """Download checkpoint ``input.checkpoint`` (sha256-verified), load it as ``<model>@<step>`` on every
        server (replacing one of that name loaded from another run's checkpoint), then evict this model's adapters beyond the newest ``keep_adapters`` that no lease holds."""
        ref = input.checkpoint
        name = adapter_name(input.model_name, ref.step)
        local = self.local_dir(ref.run_id, ref.step)
        _heartbeat("download", name)
        try:
            await asyncio.to_thread(download_checkpoint, self.store, ref, local)
            manifest, _ = await asyncio.to_thread(self.store.read_manifest, self.store.key(ref.uri))
        except CorruptCheckpointError as err:
            raise ApplicationError(str(err), type=CORRUPT_CHECKPOINT, non_retryable=True) from err
        except StoreError as err:
            raise ApplicationError(
                str(err), type=err.failure_type, non_retryable=err.failure_type != "StoreUnavailable"
            ) from err
        sha256 = {e.path: e.sha256 for e in manifest.files if e.path.startswith(ADAPTER_FILE_PREFIX)}
        for client in self.clients:
            _heartbeat("load", name, client.base_url)
            # The same name loaded from another directory is another run's adapter (two runs that share a
            # model name and a server): this step's checkpoint replaces it. A retry finds its own path.
            loaded_from = (await client.adapters()).get(name)
            replace = loaded_from is not None and Path(loaded_from) != local
            if replace:
                log.warning("%s on %s was loaded from %s; replacing it with %s", name, client.base_url,
                            loaded_from, local)  # fmt: skip
            try:
                loaded = await client.load_adapter(name, str(local), sha256, replace=replace)
            except ServingError as err:
                if err.status >= 500:
                    raise  # the server is in trouble: retried
                if "sha256" in err.message:
                    shutil.rmtree(
                        local, ignore_errors=True
                    )  # a damaged local copy: the retry downloads again
                    raise ApplicationError(f"{name}: {err}", type=CORRUPT_CHECKPOINT) from err
                raise ApplicationError(
                    f"{client.base_url} refused adapter {name} from {ref.uri}: {err.message}",
                    type=CONFIG_ERROR,
                    non_retryable=True,
                ) from err
            log.info("%s %s on %s", "loaded" if loaded else "already had", name, client.base_url)
        unloaded = await self._evict(input.model_name, keep=input.serving.keep_adapters, current=name)
        for evicted in unloaded:
            step = _adapter_step(input.model_name, evicted)
            if step is not None:
                shutil.rmtree(self.local_dir(ref.run_id, step), ignore_errors=True)
        return ReloadResult(
            adapter=name, servers=[c.base_url for c in self.clients], unloaded=sorted(unloaded)
        )

    async def _evict(self, model_name: str, keep: int, current: str) -> list[str]:
        """Unload this model's adapters older than the newest ``keep``; never ``current`` or a held one."""
        unloaded: set[str] = set()
        held = self.leases.held() | {current}
        for client in self.clients:
            loaded = await client.adapters()
            steps = sorted(
                ((step, n) for n in loaded if (step := _adapter_step(model_name, n)) is not None),
                reverse=True,
            )
            for _, evict in steps[keep:]:
                if evict in held:
                    continue
                _heartbeat("unload", evict, client.base_url)
                if await client.unload_adapter(evict):
                    unloaded.add(evict)
        return sorted(unloaded)

    @activity.defn(name="serving_control")
    async def serving_control(self, input: ServingControlInput) -> None:
        """Put every server to sleep (shared mode, before training) or wake them up."""
        for client in self.clients:
            if input.action == "sleep":
                await client.sleep()
            else:
                await client.wake_up()
            log.info("%s: %s", client.base_url, input.action)
