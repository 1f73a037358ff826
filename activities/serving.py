"""Serving activities of the inference worker: load a published adapter on its servers; sleep and wake them.

``ServingActivities(servers, store=None, adapter_root=None, leases=None, engine=None)``:

- ``servers``: the server URLs this worker fronts (``http://host:port``, with or without ``/v1``), or
  ``ServingClient`` objects; our CPU server and vLLM alike.
- ``store``: the ``ObjectStore`` checkpoints are read from; default ``ObjectStore.from_env()`` on first use.
- ``adapter_root``: where checkpoints are downloaded (the servers read adapters from this machine's disk);
  default ``$DGRPO_HOME/adapters``. A checkpoint's adapter files land in ``layout.local_step_dir(root, run_id,
  step)``; a checkpoint is served as soon as it is servable (its adapter manifest written), whether or not its
  optimizer state is in yet, and what a server holds is known by its ``adapter_sha256``, never by its step.
- ``leases``: an ``AdapterLeases`` shared with the rollout activities, which hold their adapter while they run;
  nothing here evicts a held adapter.
- ``engine``: the ``EngineSettings`` the servers run with (the operator's); ``reload`` refuses a run they
  cannot serve before loading anything, and every load leaves at most ``engine.max_loras`` adapters on a server
  (``--max-loras``, for every run together): the least recently used that no rollout holds are unloaded first,
  whichever run they belong to. A rollout that needs one of them again loads it back (``ensure_adapter``).
- ``liveness``: the servers' ``EngineLiveness`` (the worker's watch reports to it); every activity here and
  the rollouts run under its ``guard``: failed as retryable when the server is restarted under them.

Register ``ServingActivities(...).all()``: ``reload`` (``ReloadInput`` -> ``ReloadResult``) and
``serving_control`` (``ServingControlInput`` -> None).
"""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import progress
from activities.checkpoints import download_adapter, read_adapter_manifest
from activities.engine_liveness import EngineLiveness
from activities.errors import application_error
from activities.fleet_metrics import fleet_metrics
from activities.object_store import WORKER_OUTAGE_S, ObjectStore
from host.files import inside
from schemas import layout
from schemas.activities import ActivityName, ReloadInput, ReloadResult, ServingControlInput
from schemas.errors import CONFIG_ERROR, CORRUPT_LOCAL_COPY, CorruptCheckpointError, DgrpoError
from schemas.layout import adapter_name
from schemas.refs import AdapterRef, CheckpointRef
from schemas.settings import EngineSettings, dgrpo_home
from serving.client import ServingClient, ServingError

log = logging.getLogger(__name__)

Listings = dict[str, dict[str, str]]
"""A server's base URL -> its adapters (name -> directory), as one reload last saw them."""


class AdapterLeases:
    """Adapters that work on this worker still needs (a rollout between two requests), and when each adapter
    was last loaded or used here: what the ``--max-loras`` cap unloads first."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._used: dict[str, float] = {}

    @contextmanager
    def hold(self, name: str) -> Iterator[None]:
        """Keep ``name`` loaded while the block runs."""
        self._counts[name] += 1
        self.touch(name)
        try:
            yield
        finally:
            self._counts[name] -= 1
            if self._counts[name] <= 0:
                del self._counts[name]
            self.touch(name)

    def held(self) -> set[str]:
        return set(self._counts)

    def touch(self, name: str) -> None:
        self._used[name] = time.monotonic()

    def forget(self, name: str) -> None:
        self._used.pop(name, None)

    def least_recently_used(self, names: Iterable[str]) -> list[str]:
        """``names`` oldest use first; one never loaded or used by this worker counts as oldest."""
        return sorted(names, key=lambda n: (self._used.get(n, float("-inf")), n))


def _heartbeat(*details: Any) -> None:
    if activity.in_activity():
        activity.heartbeat(*details)


def _adapter_step(run_id: str, name: str) -> int | None:
    match = re.fullmatch(re.escape(run_id) + r"@(\d+)", name)
    return int(match.group(1)) if match else None


def _run_and_step(name: str) -> tuple[str, int] | None:
    """``<run id>@<step>`` split; None for a name that is not a run's adapter."""
    match = re.fullmatch(r"(.+)@(\d+)", name)
    return (match.group(1), int(match.group(2))) if match else None


class ServingActivities:
    """The inference worker's serving activities over a fixed list of servers (see the module doc)."""

    def __init__(
        self,
        servers: Sequence[str | ServingClient],
        store: ObjectStore | None = None,
        adapter_root: str | Path | None = None,
        leases: AdapterLeases | None = None,
        engine: EngineSettings | None = None,
        liveness: EngineLiveness | None = None,
    ) -> None:
        if not servers:
            raise ValueError("ServingActivities needs at least one server URL")
        self.clients = [s if isinstance(s, ServingClient) else ServingClient(s) for s in servers]
        self._store = store
        self.adapter_root = Path(adapter_root or Path(dgrpo_home()) / "adapters")
        self.leases = leases or AdapterLeases()
        self.engine = engine or EngineSettings()
        self.liveness = liveness or EngineLiveness()
        self.served: dict[str, Path] = {}
        """Adapters this worker loaded and has not evicted: name -> verified local copy (for ``restore``)."""
        self.contents: dict[str, str] = {}
        """Adapter name -> ``adapter_sha256`` of the adapter loaded under it on this worker's servers."""
        self._ensuring = asyncio.Lock()  # shards of one step on this worker: one downloads, the others wait

    @property
    def store(self) -> ObjectStore:
        if self._store is None:
            self._store = ObjectStore.from_env(WORKER_OUTAGE_S)
        return self._store

    def all(self) -> list[Callable[..., Any]]:
        return [self.reload, self.serving_control]

    def local_dir(self, run_id: str, step: int) -> Path:
        return layout.local_step_dir(self.adapter_root, run_id, step)

    def refusal(self, input: ReloadInput) -> str | None:
        """Why these servers cannot serve the run (each setting to change named), or None when they can."""
        engine, problems = self.engine, []
        if input.serving.engine is not None and input.serving.engine != engine.engine:
            problems.append(
                f"the run needs engine {input.serving.engine!r} (serving.engine), but this inference worker "
                f"runs {engine.engine!r}: start one with `dgrpo worker inference --engine {input.serving.engine}`"
                " or leave serving.engine out"
            )
        if input.lora_rank is not None and input.lora_rank > engine.max_lora_rank:
            problems.append(
                f"model.lora.rank {input.lora_rank} is above this worker's --max-lora-rank "
                f"{engine.max_lora_rank}: lower the rank or restart the worker with a larger --max-lora-rank"
            )
        if input.serving.keep_adapters > engine.max_loras - 1:
            problems.append(
                f"serving.keep_adapters {input.serving.keep_adapters} needs --max-loras of at least "
                f"{input.serving.keep_adapters + 1} (one more for the adapter being loaded), but this worker "
                f"has {engine.max_loras}: lower keep_adapters or raise --max-loras"
            )
        if input.chat_template and not engine.trust_request_chat_template:
            problems.append(
                "the run renders its chats with a template of its own (model.chat_template), which this worker's "
                "engine takes from requests only when started with --trust-request-chat-template (the operator "
                "then trusts run specs' Jinja): restart it so, or leave model.chat_template out"
            )
        if input.shared and not engine.can_sleep:
            problems.append(
                "mode 'shared' puts the engine to sleep while the trainer runs, but this vLLM worker was "
                "started without --sleep-mode: restart it with --sleep-mode, or use mode 'sync'/'pipelined'"
            )
        if input.bucket is not None and input.bucket != self.store.bucket:
            problems.append(
                f"storage.bucket is {input.bucket!r}, but this worker's bucket is {self.store.bucket!r} "
                "(DGRPO_S3_BUCKET); storage.bucket is deprecated: leave it out of the run spec"
            )
        return "; ".join(problems) or None

    @activity.defn(name=ActivityName.RELOAD)
    async def reload(self, input: ReloadInput) -> ReloadResult:
        """Download the adapter of checkpoint ``input.checkpoint`` (servable or resumable; sha256-verified), load it
        as ``<run id>@<step>`` on every server (replacing one of that name with other content: another run's, or
        the step's before it was trained again), then evict this model's adapters beyond the newest
        ``keep_adapters`` that no lease holds."""
        return await self.liveness.guard(self._reload(input))

    async def _reload(self, input: ReloadInput) -> ReloadResult:
        refusal = self.refusal(input)
        if refusal is not None:
            raise ApplicationError(f"this inference worker cannot serve the run: {refusal}", type=CONFIG_ERROR,
                                   non_retryable=True)  # fmt: skip
        ref = input.checkpoint
        name = adapter_name(ref.run_id, ref.step)
        listed: Listings = {}
        local = await self._download_and_load(self.clients, name, ref, listed)
        self.served[name] = local
        unloaded = await self._evict(
            ref.run_id, keep=input.serving.keep_adapters, current=name, listed=listed
        )
        unloaded += await self._cap(current=name, listed=listed)
        self._forget(unloaded)
        fleet_metrics().steps_served.add(1)
        return ReloadResult(
            adapter=name,
            servers=[c.base_url for c in self.clients],
            unloaded=sorted(set(unloaded)),
            adapter_sha256=self.contents[name],
        )

    def _forget(self, unloaded: Iterable[str]) -> None:
        """Drop what this worker kept for adapters no server holds any more, their local copies too."""
        for evicted in set(unloaded):
            self.served.pop(evicted, None)
            self.contents.pop(evicted, None)
            self.leases.forget(evicted)
            parsed = _run_and_step(evicted)
            # Another client of the server may have named an adapter anything: only our own copies go.
            local = (
                inside(self.adapter_root, f"{parsed[0]}/{layout.step_name(parsed[1])}") if parsed else None
            )
            if local is not None:
                shutil.rmtree(local, ignore_errors=True)

    async def ensure_adapter(self, run_id: str, step: int) -> str:
        """Serve the run's published checkpoint of ``step`` as ``<run id>@<step>`` on every server: loaded where
        it is missing (the step's reload ran on another inference worker, or this one's server was restarted)
        and loaded again where the name holds other content than the published manifest (a run id reused with
        new weights, reloaded on another worker): the decision is by content, never by name."""
        name = adapter_name(run_id, step)
        async with self._ensuring:
            prefix = layout.checkpoint_prefix(run_id, step)
            try:
                _, sha = await asyncio.to_thread(read_adapter_manifest, self.store, prefix)
            except DgrpoError as err:
                raise application_error(err) from err
            stale = self.contents.get(name) != sha
            missing = [c for c in self.clients if stale or name not in await c.adapters()]
            if missing:
                ref = AdapterRef(run_id=run_id, step=step, uri=self.store.uri(prefix), adapter_sha256=sha)
                self.served[name] = await self._download_and_load(missing, name, ref, republished_ok=True)
                self._forget(await self._cap(current=name))
        return name

    async def _download_and_load(
        self,
        clients: Sequence[ServingClient],
        name: str,
        ref: CheckpointRef | AdapterRef,
        listed: Listings | None = None,
        republished_ok: bool = False,
    ) -> Path:
        """Download ``ref``'s adapter (sha256-verified) and load it as ``name`` on ``clients``; its local copy.
        ``listed`` gets each client's adapters as they are after the load. ``republished_ok``: ``ref`` is the
        step's adapter as just read, so one published again meanwhile (its step trained again) is retried."""
        listed = {} if listed is None else listed
        local = self.local_dir(ref.run_id, ref.step)
        _heartbeat("download", name)
        try:
            with progress.stage("download"):  # a download that hangs stops the heartbeats
                servable, manifest, fresh = await asyncio.to_thread(download_adapter, self.store, ref, local)
                # A copy downloaded now was verified as it arrived; one downloaded before is verified by the server.
                sha256 = None if fresh else {e.path: e.sha256 for e in manifest.files}
        except CorruptCheckpointError as err:
            if republished_ok:
                raise ApplicationError(f"{name}: {err}; the step was published again: retried",
                                       type=CORRUPT_LOCAL_COPY) from err  # fmt: skip
            raise application_error(err) from err
        except DgrpoError as err:  # a corrupt or overwritten checkpoint, an unreachable or refusing store
            raise application_error(err) from err
        for client in clients:
            _heartbeat("load", name, client.base_url)
            # The same name loaded from another directory is another run's adapter (two runs that share a
            # model name and a server), and the same directory with other content is an earlier checkpoint of
            # this step (a run id reused after its checkpoints were deleted): this checkpoint replaces either.
            # A retry finds its own path and content.
            adapters = listed[client.base_url] = await client.adapters()
            loaded_from = adapters.get(name)
            replace = loaded_from is not None and (
                Path(loaded_from) != local or self.contents.get(name) != servable.adapter_sha256
            )
            if replace:
                log.warning("%s on %s was loaded from %s (adapter %s); replacing it with %s (adapter %s)", name,
                            client.base_url, loaded_from, str(self.contents.get(name))[:12], local,
                            servable.adapter_sha256[:12])  # fmt: skip
            try:
                with progress.stage("load"):
                    loaded = await client.load_adapter(name, str(local), sha256, replace=replace)
            except ServingError as err:
                if err.status >= 500:
                    raise  # the server is in trouble: retried
                if "sha256" in err.message:
                    shutil.rmtree(
                        local, ignore_errors=True
                    )  # a damaged local copy: the retry downloads again
                    raise ApplicationError(f"{name}: {err}", type=CORRUPT_LOCAL_COPY) from err
                raise ApplicationError(
                    f"{client.base_url} refused adapter {name} from {ref.uri}: {err.message}",
                    type=CONFIG_ERROR,
                    non_retryable=True,
                ) from err
            log.info("%s %s on %s", "loaded" if loaded else "already had", name, client.base_url)
            if loaded:
                fleet_metrics().adapter_loads.add(1)
            adapters[name] = str(local)
        self.contents[name] = servable.adapter_sha256
        self.leases.touch(name)
        return local

    async def restore(self) -> list[str]:
        """Load every adapter this worker was serving again (a restarted server starts with none)."""
        for name, local in list(self.served.items()):
            if not local.is_dir():
                del self.served[name]
                continue
            for client in self.clients:
                if await client.load_adapter(name, str(local)):
                    fleet_metrics().adapter_loads.add(1)
        return sorted(self.served)

    async def _listing(self, client: ServingClient, listed: Listings) -> dict[str, str]:
        """``client``'s adapters: as ``listed`` keeps them (this reload's own changes applied), else asked."""
        if client.base_url not in listed:
            listed[client.base_url] = await client.adapters()
        return listed[client.base_url]

    async def _evict(self, run_id: str, keep: int, current: str, listed: Listings | None = None) -> list[str]:
        """Unload this run's adapters older than the newest ``keep``; never ``current`` or a held one."""
        unloaded: set[str] = set()
        held = self.leases.held() | {current}
        listed = {} if listed is None else listed
        for client in self.clients:
            loaded = await self._listing(client, listed)
            steps = sorted(
                ((step, n) for n in loaded if (step := _adapter_step(run_id, n)) is not None),
                reverse=True,
            )
            for _, evict in steps[keep:]:
                if evict in held:
                    continue
                _heartbeat("unload", evict, client.base_url)
                if await client.unload_adapter(evict):
                    unloaded.add(evict)
                    fleet_metrics().adapter_unloads.add(1)
                loaded.pop(evict, None)
        return sorted(unloaded)

    async def _cap(self, current: str, listed: Listings | None = None) -> list[str]:
        """Unload, from each server holding more than ``--max-loras`` adapters, the least recently used that
        no rollout holds (never ``current``), until it holds ``--max-loras``; what was unloaded."""
        unloaded: list[str] = []
        listed = {} if listed is None else listed
        for client in self.clients:
            listing = await self._listing(client, listed)
            loaded = [n for n in listing if _run_and_step(n) is not None]
            excess = len(loaded) - self.engine.max_loras
            if excess <= 0:
                continue
            held = self.leases.held() | {current}
            for evict in self.leases.least_recently_used(n for n in loaded if n not in held)[:excess]:
                _heartbeat("unload", evict, client.base_url)
                listing.pop(evict, None)
                if await client.unload_adapter(evict):
                    unloaded.append(evict)
                    fleet_metrics().adapter_unloads.add(1)
                    excess -= 1
                    log.info(
                        "unloaded %s from %s (--max-loras %d)", evict, client.base_url, self.engine.max_loras
                    )
            if excess > 0:
                log.warning("%s holds %d adapters over --max-loras %d: rollouts hold them", client.base_url,
                            excess, self.engine.max_loras)  # fmt: skip
        return unloaded

    @activity.defn(name=ActivityName.SERVING_CONTROL)
    async def serving_control(self, input: ServingControlInput) -> None:
        """Put every server to sleep (shared mode, before training) or wake them up."""
        await self.liveness.guard(self._serving_control(input))

    async def _serving_control(self, input: ServingControlInput) -> None:
        for client in self.clients:
            if input.action == "sleep":
                await client.sleep()
            else:
                await client.wake_up()
            log.info("%s: %s", client.base_url, input.action)
