"""ART's ``limit_concurrency``: at most ``n`` calls of an async function run at once, per key.

    @limit_concurrency(4, derive_key=lambda model, scenario: model.name)
    async def rollout(model, scenario) -> Trajectory: ...

Calls with the same key (``derive_key`` of the call's arguments; one key for all calls without it) share a
semaphore of ``n``; the others wait their turn. Each decorated function has its own semaphores.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


def limit_concurrency(
    n: int, derive_key: Callable[..., str] | None = None
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """Decorate an async function so at most ``n`` of its calls with one key run at a time."""

    def decorator(func: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        semaphores: dict[Any, asyncio.Semaphore] = {}

        @functools.wraps(func)
        async def limited(*args: P.args, **kwargs: P.kwargs) -> R:
            key = derive_key(*args, **kwargs) if derive_key is not None else None
            semaphore = semaphores.setdefault(key, asyncio.Semaphore(n))
            async with semaphore:
                return await func(*args, **kwargs)

        return limited

    return decorator
