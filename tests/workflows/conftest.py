"""Workflow tests: a pydantic-converter client on the session's real Temporal dev server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio
from temporalio.client import Client

from workers.stack import EmbeddedStack
from workers.temporal import connect_client


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def client(stack: EmbeddedStack) -> AsyncIterator[Client]:
    yield await connect_client(address=stack.temporal_address)
