"""``retry``: ART's decorator that re-runs a flaky function (a rollout, a judge call) with backoff.

    @dgrpo.retry(exceptions=(openai.APIError,), max_attempts=3)
    async def rollout(model, scenario) -> dgrpo.Trajectory: ...

Works on plain and ``async`` functions; the last failure is re-raised unchanged.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, cast

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

OnRetry = Callable[[Exception, int], None]
"""Called with the exception and the attempt (1-based) that raised it, before waiting to retry."""


def _check(max_attempts: int, delay: float, backoff_factor: float, exceptions: tuple[type, ...]) -> None:
    if max_attempts < 1:
        raise ValueError(f"retry(max_attempts={max_attempts}) must be at least 1")
    if delay < 0 or backoff_factor < 0:
        raise ValueError(f"retry(delay={delay}, backoff_factor={backoff_factor}) must not be negative")
    if not all(isinstance(e, type) and issubclass(e, BaseException) for e in exceptions):
        raise TypeError(f"retry(exceptions=...) takes a tuple of exception classes, got {exceptions!r}")


def _report(on_retry: OnRetry | None, name: str, err: Exception, attempt: int, max_attempts: int) -> None:
    if on_retry is not None:
        on_retry(err, attempt)
    else:
        log.warning("%s failed (attempt %d of %d), retrying: %s", name, attempt, max_attempts, err)


def retry(
    max_attempts: int = 3,
    delay: float = 0.25,
    backoff_factor: float = 2.0,
    exceptions: tuple[type[Exception], ...] = (Exception,),
    on_retry: OnRetry | None = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Retry the decorated function on ``exceptions``, at most ``max_attempts`` calls in all.

    The wait before retry n is ``delay * backoff_factor ** (n - 1)`` seconds (``asyncio.sleep`` for
    coroutine functions, so other rollouts keep running). Other exceptions propagate at once.
    """
    exceptions = tuple(exceptions)
    _check(max_attempts, delay, backoff_factor, exceptions)

    def decorate(func: Callable[P, R]) -> Callable[P, R]:
        name = getattr(func, "__qualname__", repr(func))
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def run_async(*args: P.args, **kwargs: P.kwargs) -> Any:
                wait = delay
                for attempt in range(1, max_attempts + 1):
                    try:
                        return await func(*args, **kwargs)
                    except exceptions as err:
                        if attempt == max_attempts:
                            raise
                        _report(on_retry, name, err, attempt, max_attempts)
                    await asyncio.sleep(wait)
                    wait *= backoff_factor
                raise AssertionError("unreachable: the last attempt returns or raises")

            return cast(Callable[P, R], run_async)

        @functools.wraps(func)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            wait = delay
            for attempt in range(1, max_attempts + 1):
                try:
                    return func(*args, **kwargs)
                except exceptions as err:
                    if attempt == max_attempts:
                        raise
                    _report(on_retry, name, err, attempt, max_attempts)
                time.sleep(wait)
                wait *= backoff_factor
            raise AssertionError("unreachable: the last attempt returns or raises")

        return run

    return decorate
