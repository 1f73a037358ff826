"""Whether the inference worker's engine answers, as its activities and heartbeats see it.

The worker's watch (``workers/keep_serving.py``) probes the engine and reports here: a missed probe makes
``vouches()`` false, so the heartbeat ticker stops beating for the activities that use the engine (Temporal's
heartbeat timeout then ends them even if nothing else does); a restart fails every activity that was using
the old engine at once, as retryable, and holds new ones until the new engine answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from temporalio.exceptions import ApplicationError

from schemas.errors import ENGINE_RESTARTED

T = TypeVar("T")

RESTART_WAIT_S = 600.0
"""How long an activity waits for a restarting engine before it fails (retryable) instead."""
WAIT_STEP_S = 0.2


class EngineLiveness:
    """The answering state of one worker's engine(s); read and changed on the worker's event loop. It holds
    no asyncio primitive, so one instance serves any event loop (a test's as well as the worker's)."""

    def __init__(self) -> None:
        self.missed = 0
        """Probes missed in a row."""
        self.restarts = 0
        self.up = True
        """False from the moment the engine is being replaced until the new one answers."""
        self._users: set[asyncio.Future[Any]] = set()
        self._lost: set[asyncio.Future[Any]] = set()
        self._why = ""

    def vouches(self) -> bool:
        """False while the engine leaves probes unanswered: heartbeats of the work that uses it stop."""
        return self.missed == 0

    def ready(self) -> bool:
        """Up and answering: only then does new work start on it."""
        return self.up and self.missed == 0

    def answered(self) -> None:
        self.missed = 0

    def missed_probe(self) -> int:
        """Count one more missed probe; how many in a row now."""
        self.missed += 1
        return self.missed

    def restarting(self, why: str) -> None:
        """The engine is being replaced: fail the work that used it, hold new work until ``restarted``."""
        self.restarts += 1
        self.missed = 0  # our own restart, bounded by its start timeout: the waiting activities are alive
        self.up = False
        self._why = why
        for user in self._users:
            self._lost.add(user)
            user.cancel()

    def restarted(self) -> None:
        self.up = True

    async def guard(self, work: Awaitable[T]) -> T:
        """``work``'s result, started once the engine is up and answering; an ``EngineRestarted`` failure
        (retryable) when the engine is restarted while ``work`` runs (``work`` is then cancelled)."""
        waited = 0.0
        while not self.ready():
            if waited >= RESTART_WAIT_S:
                raise ApplicationError(
                    f"the inference server did not answer within {RESTART_WAIT_S:.0f}s "
                    f"({self._why or 'probes missed'})",
                    type=ENGINE_RESTARTED,
                )
            await asyncio.sleep(WAIT_STEP_S)
            waited += WAIT_STEP_S
        task: asyncio.Future[T] = asyncio.ensure_future(work)
        self._users.add(task)
        try:
            return await task
        except asyncio.CancelledError:
            if task not in self._lost:
                raise  # the activity itself was cancelled
            raise ApplicationError(
                f"the inference server {self._why} and was restarted; this attempt used it and is retried",
                type=ENGINE_RESTARTED,
            ) from None
        finally:
            self._users.discard(task)
            self._lost.discard(task)
