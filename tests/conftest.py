"""Shared fixtures: the REAL embedded stack (Temporal dev server + SeaweedFS S3) on free loopback ports.

Fixtures (names are stable; other test modules rely on them):

- ``stack`` (session) -> ``workers.stack.EmbeddedStack``: both servers, started once per session in a
  temp dir on free ports (never the developer's ``dgrpo up`` ports); the servers die with pytest. ``stack.temporal_address``,
  ``stack.s3_settings``, ``stack.env()``. For the whole session, ``os.environ`` also carries
  ``stack.env()`` (``DGRPO_TEMPORAL_ADDRESS``, ``DGRPO_S3_*``, ``TEMPORAL_ADDRESS``), so
  ``S3Settings.from_env()`` and worker subprocesses find the stack.
- ``s3_settings`` (session) -> ``schemas.settings.S3Settings`` of the stack (bucket ``dgrpo``).
- ``object_store`` (function) -> ``activities.object_store.ObjectStore`` on a fresh, empty bucket
  per test (``t-<random>``, removed afterwards), so tests never see each other's keys.
- ``temporal_client`` (session, async) -> a connected ``temporalio.client.Client``.
- ``task_queue`` (function) -> a unique task-queue name per test (``tq-<test name>-<random>``).
- ``model_roots`` (session, autouse) -> the session's temp directory, exported as ``DGRPO_MODEL_ROOTS``: the
  trainers of this session (in-process and worker subprocesses) read a local ``base_model`` from under it.
- ``tiny_qwen3`` (session) -> a Qwen3-architecture model with random weights (``QWEN3_TINY``, 3.2M parameters,
  SmolLM2's tokenizer with a tool-calling chat template), made once under the session's temp directory.
- ``shared_queues`` (session) -> ``TaskQueues`` of their own; ``shared_worker`` (session) -> ``workers.launcher.WorkerProcess``:
  one real ``dgrpo worker all`` (CPU server + trainer child) on the stack, polling ``shared_queues``, shared by the
  modules whose runs need real workers but not workers of their own (run identity, liveness, real runs). A test
  may break its children (the worker must replace them); its runs name themselves apart from the others'.
- ``tiny_gang_queues`` (session), ``tiny_gang_worker`` (session): ``dgrpo worker all --model <tiny_qwen3> --ranks 2``,
  its trainer child a gang of two ranks (activities/gang/): the tiny Qwen3 shape's whole loop trains on it
  (tests/workflows/test_production_shapes.py), and tests/workers/test_gang_faults.py breaks its ranks (the worker
  must replace them).
- ``vllm_queues`` (session), ``vllm_worker`` (session): ``dgrpo worker all --engine vllm`` (vLLM's CPU build, rank-8
  adapters at most, a request's own chat template taken, the API key ``vllm_api_key`` (session) wanted): the serving contract runs against its server, then
  tests/workflows/test_runs_on_vllm.py trains on it.
- ``held_backend`` (session) -> the directory of one ``LocalBackend`` (its own embedded stack and ``dgrpo worker
  all``), held open by a child process (tests/hold_backend.py) so every ART program and example that opens
  ``LocalBackend(path=held_backend)`` reuses it instead of starting a stack and loading the model again. Such a
  program must not stop it (no ``stop_all()``), and names its models apart from the others'.

With pytest-xdist (``-n 2 --dist loadgroup``) each test file is one group, so module fixtures start once, and the
modules sharing one of the ``SHARED_WORKERS`` fixtures are one group. It is not the README's
command: on this 2-core machine the whole suite passed with it (747) in 2774 s against 2797 s serial, because
the suite is CPU-bound (two CPU-heavy tests side by side each take about twice as long; the learning test
three times).

``DGRPO_CACHE`` is left as the user's (default ``~/.cache/dgrpo``) so converted models are reused
across runs; it is exported explicitly so subprocesses with another HOME still find it.
"""

from __future__ import annotations

import os
import re
import secrets
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from temporalio.client import Client

from activities.object_store import ObjectStore
from base_models.random_shapes import QWEN3_TINY, make_random_model
from base_models.resolve import ensure_smollm2
from host.processes import ChildProcess
from schemas.config import TaskQueues
from schemas.settings import ENV_CACHE, ENV_HOME, ENV_MODEL_ROOTS, ENV_SERVE_API_KEY, S3Settings, dgrpo_cache
from workers.launcher import WorkerProcess
from workers.stack import EmbeddedStack

os.environ.setdefault(ENV_CACHE, dgrpo_cache())
# litellm (a dev dependency, read by dgrpo.costs) fetches its price table at import unless told to use its own.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)


SHARED_WORKERS = ("held_backend", "shared_worker", "vllm_worker", "tiny_gang_worker")
"""Session fixtures that hold real workers (a CPU server and a trainer: several GB each). The modules that use one
run one after another, where the last of them stands, and it is stopped once they are done, not at the session's
end: so no more of them are held at a time than when each module started its own."""
_release: dict[str, Callable[[], object]] = {}
"""Stops a shared fixture's workers; a fixture registers it on start, its last user's teardown calls it."""
_LAST_USER = pytest.StashKey[set[str]]()


@pytest.hookimpl(trylast=True)  # after ``-m`` deselected: only the tests that run count
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each ``SHARED_WORKERS`` fixture's modules moved together, and its last user noted; an xdist group per test
    file, or per shared fixture for the modules that use one (ignored without xdist)."""
    group = {item.path: "/".join(os.path.relpath(str(item.path), TESTS).split(os.sep)) for item in items}
    for name in SHARED_WORKERS:
        users = {item.path for item in items if name in getattr(item, "fixturenames", ())}
        if not users:
            continue
        group.update(dict.fromkeys(users, name))
        moved = [item for item in items if item.path in users]
        anchor = next(k for k, item in enumerate(items) if item.path == moved[-1].path)
        rest = [item for item in items if item.path not in users]
        at = sum(1 for item in items[:anchor] if item.path not in users)
        items[:] = rest[:at] + moved + rest[at:]
    for name in SHARED_WORKERS:
        last = [item for item in items if name in getattr(item, "fixturenames", ())][-1:]
        for item in last:
            item.stash[_LAST_USER] = item.stash.get(_LAST_USER, set()) | {name}
    for item in items:
        item.add_marker(pytest.mark.xdist_group(group[item.path]))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield
    for name in item.stash.get(_LAST_USER, set()):
        _release.pop(name, lambda: None)()


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedStack]:
    home = tmp_path_factory.mktemp("dgrpo-home")
    embedded = EmbeddedStack(home, free_ports=True, ui=False, tied_to_parent=True)
    embedded.start()
    with pytest.MonkeyPatch.context() as mp:
        for name, value in embedded.env().items():
            mp.setenv(name, value)
        try:
            yield embedded
        finally:
            embedded.stop()


@pytest.fixture(scope="session")
def s3_settings(stack: EmbeddedStack) -> S3Settings:
    return stack.s3_settings


@pytest.fixture
def object_store(s3_settings: S3Settings) -> Iterator[ObjectStore]:
    bucket = f"t-{uuid.uuid4().hex[:16]}"
    store = ObjectStore(s3_settings.model_copy(update={"bucket": bucket}))
    store.ensure_bucket()
    yield store
    store.remove_bucket()  # each bucket holds a SeaweedFS volume; removing it frees the volume


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def temporal_client(stack: EmbeddedStack) -> AsyncIterator[Client]:
    yield await Client.connect(stack.temporal_address)


@pytest.fixture
def task_queue(request: pytest.FixtureRequest) -> str:
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", request.node.name)[:60]
    return f"tq-{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session", autouse=True)
def model_roots(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Local models and adapters the tests make live under the session's temp directory: the operator (this
    session) allows it, as ``DGRPO_MODEL_ROOTS``, to every trainer, in this process and in worker processes."""
    root = str(tmp_path_factory.getbasetemp())
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ENV_MODEL_ROOTS, root)
        yield root


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Qwen3-architecture model with random weights (``QWEN3_TINY``) and SmolLM2's tokenizer (~16 MB)."""
    return make_random_model(QWEN3_TINY, tmp_path_factory.mktemp("models") / "qwen3-tiny", ensure_smollm2())


@pytest.fixture(scope="session")
def shared_queues() -> TaskQueues:
    suffix = uuid.uuid4().hex[:8]
    return TaskQueues(control=f"fl-c-{suffix}", inference=f"fl-i-{suffix}", trainer=f"fl-t-{suffix}")


@pytest.fixture(scope="session")
def shared_worker(
    stack: EmbeddedStack, shared_queues: TaskQueues, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    home = tmp_path_factory.mktemp("shared-worker-home")
    proc = WorkerProcess(
        "all", home / "worker.log", task_queues=shared_queues, env={ENV_HOME: str(home)}, cwd=REPO
    )
    _release["shared_worker"] = proc.stop
    try:
        proc.start()
        yield proc
    finally:
        _release.pop("shared_worker", lambda: None)()


@pytest.fixture(scope="session")
def tiny_gang_queues() -> TaskQueues:
    suffix = uuid.uuid4().hex[:8]
    return TaskQueues(control=f"tg-c-{suffix}", inference=f"tg-i-{suffix}", trainer=f"tg-t-{suffix}")


@pytest.fixture(scope="session")
def tiny_gang_worker(
    stack: EmbeddedStack,
    tiny_gang_queues: TaskQueues,
    tiny_qwen3: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[WorkerProcess]:
    home = tmp_path_factory.mktemp("tiny-gang-worker")
    proc = WorkerProcess(
        "all", home / "worker.log", task_queues=tiny_gang_queues, env={ENV_HOME: str(home)}, cwd=REPO,
        extra_args=["--model", str(tiny_qwen3), "--ranks", "2"],
    )  # fmt: skip
    _release["tiny_gang_worker"] = proc.stop
    try:
        proc.start()
        yield proc
    finally:
        _release.pop("tiny_gang_worker", lambda: None)()


@pytest.fixture(scope="session")
def vllm_queues() -> TaskQueues:
    suffix = uuid.uuid4().hex[:8]
    return TaskQueues(control=f"vl-c-{suffix}", inference=f"vl-i-{suffix}", trainer=f"vl-t-{suffix}")


@pytest.fixture(scope="session")
def vllm_api_key() -> str:
    """The key ``vllm_worker``'s vLLM server wants on every path but /health (``DGRPO_SERVE_API_KEY``)."""
    return secrets.token_hex(16)


@pytest.fixture(scope="session")
def vllm_worker(
    stack: EmbeddedStack, vllm_queues: TaskQueues, vllm_api_key: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """Nothing names vLLM's environment: the worker finds it (``.venv-vllm``, or ``$DGRPO_VLLM_PYTHON``)."""
    home = tmp_path_factory.mktemp("vllm-worker")
    env = {ENV_HOME: str(home), ENV_SERVE_API_KEY: vllm_api_key}
    proc = WorkerProcess(
        "all", home / "worker.log", task_queues=vllm_queues, env=env, cwd=REPO,
        extra_args=["--engine", "vllm", "--max-lora-rank", "8", "--trust-request-chat-template"],
    )  # fmt: skip
    _release["vllm_worker"] = proc.stop
    try:
        proc.start()
        yield proc
    finally:
        _release.pop("vllm_worker", lambda: None)()


@pytest.fixture(autouse=True)
def environment_kept_from_held_backend(request: pytest.FixtureRequest) -> Iterator[None]:
    """A program that opens ``LocalBackend(path=held_backend)`` in this process points ``os.environ`` at that
    backend's stack (as ART's does, for the user's rollout code) and never closes it; the environment is given
    back after the test, so later tests' workers find the session's stack, not one stopped meanwhile."""
    if "held_backend" not in request.fixturenames:
        yield
        return
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="session")
def held_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    base = tmp_path_factory.mktemp("held-backend")
    home, ready = base / "home", base / "backend.ready"
    holder = ChildProcess(
        [sys.executable, "-m", "tests.hold_backend", str(home), str(ready)],
        base / "backend.log",
        name="the tests' shared LocalBackend",
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        cwd=REPO,
        tied_to_parent=True,
    )

    def stop() -> None:
        from dgrpo.local import LocalBackend  # the facade loads slowly: only for the sessions that need it

        holder.stop(timeout_s=60)
        LocalBackend(path=home).stop_all()  # whatever the holder left running

    _release["held_backend"] = stop
    try:
        holder.spawn()
        holder.wait_until(ready.exists, timeout_s=900)
        yield home
    finally:
        _release.pop("held_backend", lambda: None)()
