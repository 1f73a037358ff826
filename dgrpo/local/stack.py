"""``LocalBackend``: the embedded stack (Temporal dev server + SeaweedFS) and ``dgrpo worker all`` here.

Whatever already runs from ``path`` is reused. ``<path>/local-backend.json`` records which client owns
the workers (and whether it started the stack): another live client reuses them; a client that finds
the owner dead (killed mid-``train``) adopts them and stops them when it ends.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
from pathlib import Path

import psutil
from pydantic import BaseModel, ConfigDict
from temporalio.client import Client

from activities.object_store import ObjectStore
from dgrpo.client.backends import connect, wait_for_server, wait_for_workers
from dgrpo.errors import BackendError
from host.files import write_atomic
from host.processes import ChildExited, ProcessInfo, alive, free_port, terminate
from schemas import settings as env_names
from schemas.config import TaskQueues
from workers.launcher import WorkerProcess
from workers.stack import EmbeddedStack

log = logging.getLogger(__name__)

OWNER_FILE = "local-backend.json"
"""Under a LocalBackend's path: who owns the workers (and the stack), so another client reuses them."""


class _Owner(BaseModel):
    """``<path>/local-backend.json``: the client that owns the workers, and what it started."""

    model_config = ConfigDict(extra="forbid")

    owner: ProcessInfo
    workers: ProcessInfo
    inference_url: str
    started_stack: bool


def _me() -> ProcessInfo:
    return ProcessInfo(pid=os.getpid(), create_time=psutil.Process().create_time(), log="")


class LocalBackend:
    """The embedded stack (Temporal dev server + SeaweedFS) and ``dgrpo worker all``, on this machine.

    Whatever already runs from ``path`` is reused: a stack from ``dgrpo up``, or the workers another
    client started. What this backend starts is stopped by ``close()``, ``async with``, or at exit; if
    the client that started the workers died, the next one adopts them (and stops them when it ends).
    ``in_process=True`` runs the workers in this process's event loop instead of a subprocess.
    """

    def __init__(
        self,
        path: str | Path = "./.dgrpo",
        in_process: bool = False,
        *,
        task_queues: TaskQueues | None = None,
        start_timeout: float = 600.0,
    ) -> None:
        self.path = Path(path).absolute()
        self.in_process = in_process
        self.task_queues = task_queues or TaskQueues()
        self.start_timeout = start_timeout
        self.stack = EmbeddedStack(self.path)
        self._owner: _Owner | None = None
        self._workers: WorkerProcess | None = None
        self._in_process_task: asyncio.Task[None] | None = None
        self._in_process_url: str | None = None
        self._client: Client | None = None
        self._store: ObjectStore | None = None
        self._started = False
        self._started_stack = False
        self._atexit = False
        self._saved_env: dict[str, str | None] = {}
        self._lock = asyncio.Lock()

    @property
    def owner_path(self) -> Path:
        return self.path / OWNER_FILE

    @property
    def log_path(self) -> Path:
        return self.path / "logs" / "workers.log"

    @property
    def ready_path(self) -> Path:
        """Written by ``dgrpo worker all --ready-file`` once every worker polls."""
        return self.log_path.with_suffix(".ready")

    async def start(self) -> None:
        async with self._lock:
            if self._started:
                return
            if not self._atexit:
                atexit.register(self.close_sync)
                self._atexit = True
            try:
                await self._start()
            except BaseException:
                await self.close()  # what started before the failure does not outlive it
                raise
            self._started = True

    async def _start(self) -> None:
        stack_was_running = self.stack.load_state() is not None
        await asyncio.to_thread(self.stack.start)
        self._started_stack = not stack_was_running
        for name, value in self.stack.env().items():
            self._saved_env.setdefault(name, os.environ.get(name))
            os.environ[name] = value  # the user's rollout code and any child process find the stack
        client = await self.temporal_client()
        if self.in_process:
            await self._start_in_process(client)
        else:
            self._adopt_or_spawn(started_stack=not stack_was_running)
            if self._workers is not None:
                try:
                    await asyncio.to_thread(self._workers.wait_ready, self.start_timeout)
                except (ChildExited, TimeoutError) as err:
                    raise BackendError(str(err)) from None
        await wait_for_workers(client, self.task_queues, self.start_timeout)
        await wait_for_server(self.inference_url(), self.start_timeout)

    def _adopt_or_spawn(self, started_stack: bool) -> None:
        current = self._read_owner()
        if current is not None and alive(current.workers):
            if alive(current.owner) and current.owner.pid != os.getpid():
                log.info("reusing the workers of client pid %d", current.owner.pid)
                return
            log.info("adopting the workers (pid %d) of a client that exited", current.workers.pid)
            self._owner = current.model_copy(update={"owner": _me()})
        else:
            self._owner = self._spawn_workers(started_stack)
        write_atomic(self.owner_path, self._owner.model_dump_json(indent=2))

    def _spawn_workers(self, started_stack: bool) -> _Owner:
        port = free_port()
        url = f"http://127.0.0.1:{port}/v1"
        env = {
            **self.stack.env(),
            env_names.ENV_HOME: str(self.path),
            env_names.ENV_INFERENCE_URL: url,
            env_names.ENV_SERVE_PORT: str(port),
        }
        # Its own session: a client killed with SIGKILL leaves the workers finishing the step it started.
        # Their server listens on loopback for this machine's programs, whose operator is the program's user:
        # a model's own chat template (TrainableModel(_internal_config={"chat_template": ...})) is taken.
        workers = WorkerProcess(
            "all",
            self.log_path,
            task_queues=self.task_queues,
            env=env,
            new_session=True,
            extra_args=["--trust-request-chat-template"],
        )
        workers.spawn()
        self._workers = workers
        return _Owner(owner=_me(), workers=workers.info, inference_url=url, started_stack=started_stack)

    async def _start_in_process(self, client: Client) -> None:
        from workers.worker import run_all_workers

        if env_names.ENV_HOME not in os.environ:
            self._saved_env.setdefault(env_names.ENV_HOME, None)
            os.environ[env_names.ENV_HOME] = str(self.path)  # where the trainer stages its steps
        port = free_port()
        self._in_process_url = f"http://127.0.0.1:{port}/v1"
        self._in_process_task = asyncio.create_task(
            run_all_workers(client, self.task_queues, serve_port=port), name="dgrpo-workers"
        )

    async def temporal_client(self) -> Client:
        if self._client is None:
            self._client = await connect(self.stack.temporal_address, "default", False, None)
        return self._client

    def object_store(self) -> ObjectStore:
        if self._store is None:
            self._store = ObjectStore(self.stack.s3_settings)
        return self._store

    def inference_url(self) -> str:
        if self._in_process_url is not None:
            return self._in_process_url
        if self._owner is not None:
            return self._owner.inference_url
        current = self._read_owner()
        if current is None:
            raise BackendError(f"no workers run from {self.path}: start the backend first")
        return current.inference_url

    async def close(self) -> None:
        if self._in_process_task is not None:
            self._in_process_task.cancel()
            await asyncio.gather(self._in_process_task, return_exceptions=True)
            self._in_process_task = None
        await asyncio.to_thread(self.close_sync)

    def close_sync(self) -> None:
        """Stop the workers and the stack if this backend started (or adopted) them."""
        owner, self._owner = self._owner, None
        started_stack, self._started_stack = self._started_stack, False
        self._client = None
        self._store = None
        self._started = False
        if owner is not None:
            self._stop_workers(owner)
            started_stack = started_stack or owner.started_stack
        if started_stack:
            log.info("stopping the embedded stack under %s", self.path)
            self.stack.stop()
        self._restore_env()

    def _restore_env(self) -> None:
        """Give back the environment ``start()`` changed, so nothing later finds a stopped stack."""
        saved, self._saved_env = self._saved_env, {}
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    def stop_all(self) -> None:
        """Stop the workers and the stack running from ``path``, whoever started them (after a crash)."""
        current = self._read_owner()
        if current is not None:
            self._stop_workers(current)
        self.stack.stop()

    def _read_owner(self) -> _Owner | None:
        if not self.owner_path.exists():
            return None
        try:
            return _Owner.model_validate_json(self.owner_path.read_text())
        except ValueError:
            log.warning("ignoring unreadable %s", self.owner_path)
            return None

    def _stop_workers(self, owner: _Owner) -> None:
        if alive(owner.workers):
            log.info("stopping the workers (pid %d)", owner.workers.pid)
            terminate([owner.workers], timeout=30)
        if self._workers is not None:
            self._workers.stop()  # reaps the child this backend spawned
            self._workers = None
        self.owner_path.unlink(missing_ok=True)
        self.ready_path.unlink(missing_ok=True)

    async def __aenter__(self) -> LocalBackend:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
