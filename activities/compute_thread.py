"""The trainer's one compute thread, and whether the work on it is stuck.

Training runs on one thread: torch's OpenMP team and oneDNN's per-thread state stay warm (a step landing on a new
pool thread each time trained ~2x slower on the CPU). Work that hangs there (a kernel, a load or a read that never
returns) cannot be stopped from outside: while the stage it reports to (activities/progress.py) is past its bound,
the thread is ``stuck()``. An attempt waiting on it then fails at once (``StalledError``, retryable) instead of
waiting behind it while heartbeating, and a worker process leaves so its supervisor starts a fresh one
(workers/worker.py): the retry is bounded as the first attempt was.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
from collections.abc import Callable
from typing import TypeVar

from activities import progress
from schemas.errors import StalledError

T = TypeVar("T")


class ComputeThread:
    """One thread that runs the trainer's work, noting the stages of the work it runs now."""

    def __init__(self) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="trainer")
        self._stages: progress.Progress | None = None
        """The stages the work on the thread reports to (its attempt's, which outlive the attempt)."""

    def run(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        """``fn()`` on the thread, in the caller's context (so the attempt's stages go along), after the work
        queued before it."""
        context = contextvars.copy_context()

        def tracked() -> T:
            self._stages = progress.current()
            try:
                return fn()
            finally:
                self._stages = None

        return asyncio.get_running_loop().run_in_executor(self._pool, context.run, tracked)

    def stuck(self) -> str | None:
        """What the thread is stuck in (the stage past its bound), or None."""
        stages = self._stages
        return stages.stalled() if stages is not None else None

    def refuse_if_stuck(self, owner: str) -> None:
        """Raise ``StalledError`` while the thread is stuck: work queued behind it would wait for ever."""
        stall = self.stuck()
        if stall is not None:
            raise StalledError(
                f"{owner}'s compute thread is stuck ({stall}); an attempt here would wait behind it, so it fails "
                "now and is retried on a trainer started afresh (a worker process leaves for its supervisor to "
                "start it again)"
            )
