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

With pytest-xdist (``-n 2 --dist loadgroup``) each test file is one group, so module fixtures start once, and a
directory whose session fixture is costly (the examples' ``LocalBackend``) is one group. It is not the README's
command: on this 2-core machine the whole suite passed with it (747) in 2774 s against 2797 s serial, because
the suite is CPU-bound (two CPU-heavy tests side by side each take about twice as long; the learning test
three times).

``DGRPO_CACHE`` is left as the user's (default ``~/.cache/dgrpo``) so converted models are reused
across runs; it is exported explicitly so subprocesses with another HOME still find it.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from temporalio.client import Client

from activities.object_store import ObjectStore
from base_models.random_shapes import QWEN3_TINY, make_random_model
from base_models.resolve import ensure_smollm2
from schemas.settings import ENV_CACHE, ENV_MODEL_ROOTS, S3Settings, dgrpo_cache
from workers.stack import EmbeddedStack

os.environ.setdefault(ENV_CACHE, dgrpo_cache())
# litellm (a dev dependency, read by dgrpo.costs) fetches its price table at import unless told to use its own.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

TESTS = os.path.dirname(os.path.abspath(__file__))
ONE_GROUP_DIRECTORIES = {"examples"}
"""Directories whose tests share one costly session fixture: kept on one xdist worker."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """An xdist group per test file (per directory for ``ONE_GROUP_DIRECTORIES``); ignored without xdist."""
    for item in items:
        parts = os.path.relpath(str(item.path), TESTS).split(os.sep)
        group = parts[0] if parts[0] in ONE_GROUP_DIRECTORIES else "/".join(parts)
        item.add_marker(pytest.mark.xdist_group(group))


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
