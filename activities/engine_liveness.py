"""Whether the inference worker's engine answers, as its activities and heartbeats see it.

The worker's watch (``workers/keep_serving.py``) probes the engine and reports here: a missed probe makes
``vouches()`` false, so the heartbeat ticker stops beating for the activities that use the engine (Temporal's
heartbeat timeout then ends them even if nothing else does); a restart fails every activity that was using
the old engine at once, as retryable, and holds new ones until the new engine answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from temporalio.exceptions import ApplicationError

from schemas.errors import ENGINE_RESTARTED

T = TypeVar("T")

RESTART_WAIT_S = 600.0
"""How long an activity waits for a restarting engine before it fails (retryable) instead."""


class EngineLiveness:
    """The answering state of one worker's engine(s); created and read on the worker's event loop."""

    def __init__(self) -> None:
        self.missed = 0
        """Probes missed in a row."""
        self.restarts = 0
        self._up = True
        self._ready = asyncio.Event()
        """Set while the engine is up and answers its probes: only then does new work start on it."""
        self._ready.set()
        self._lost = asyncio.Event()
        self._why = ""

    def vouches(self) -> bool:
        """False while the engine leaves probes unanswered: heartbeats of the work that uses it stop."""
        return self.missed == 0

    def answered(self) -> None:
        self.missed = 0
        if self._up:
            self._ready.set()

    def missed_probe(self) -> int:
        """Count one more missed probe; how many in a row now."""
        self.missed += 1
        self._ready.clear()
        return self.missed

    def restarting(self, why: str) -> None:
        """The engine is being replaced: fail the activities that used it, hold new ones until ``restarted``."""
        self.restarts += 1
        self.missed = 0  # our own restart, bounded by its start timeout: the waiting activities are alive
        self._why = why
        self._up = False
        self._ready.clear()
        self._lost.set()
        self._lost = asyncio.Event()

    def restarted(self) -> None:
        self._up = True
        self._ready.set()

    async def guard(self, work: Awaitable[T]) -> T:
        """``work``'s result, started once the engine is up and answering; an ``EngineRestarted`` failure
        (retryable) when the engine is restarted while ``work`` runs (``work`` is then cancelled)."""
        try:
            await asyncio.wait_for(self._ready.wait(), RESTART_WAIT_S)
        except TimeoutError:
            raise ApplicationError(
                f"the inference server did not answer within {RESTART_WAIT_S:.0f}s ({self._why or 'probes missed'})",
                type=ENGINE_RESTARTED,
            ) from None
        lost = self._lost
        task = asyncio.ensure_future(work)
        watch = asyncio.ensure_future(lost.wait())
        try:
            await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not task.done():
                task.cancel()
        if task.done() and not task.cancelled():
            return task.result()
        await asyncio.gather(task, return_exceptions=True)
        raise ApplicationError(
            f"the inference server {self._why} and was restarted; this attempt used it and is retried",
            type=ENGINE_RESTARTED,
        )
