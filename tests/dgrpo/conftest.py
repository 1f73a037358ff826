"""One ``LocalBackend`` (real workers, real SmolLM2) on the session's stack, shared by the client tests.

The test process owns the workers, so example scripts started by the tests reuse them (and a script
killed with SIGKILL leaves them finishing its step).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

import dgrpo
from workers.stack import EmbeddedStack


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def local_backend(stack: EmbeddedStack) -> AsyncIterator[dgrpo.LocalBackend]:
    backend = dgrpo.LocalBackend(path=stack.home, start_timeout=300)
    await backend.start()
    try:
        yield backend
    finally:
        await backend.close()
