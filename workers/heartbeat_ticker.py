"""Heartbeats from a ticker independent of the work, for every activity that has a heartbeat timeout.

An activity heartbeats when it has news (a rollout done, a micro-batch trained); between two pieces of news
(a model loading, a long forward pass, an upload) this ticker repeats the newest details every third of the
heartbeat timeout. So timeouts can be short (``workflows/stages.py``: 20 s) and a dead or hung worker
is noticed in seconds, while a slow step on a live one is never mistaken for a dead worker. The ticker runs
on the worker's event loop: it stops with the process, and activities run their heavy compute off the loop.

A live process is not enough: a beat must mean the work advances. Every heartbeat (the ticker's and the
activity's own) stops while ``vouches()`` is false (the inference worker's engine leaves its probes
unanswered), or while the activity's current stage has not advanced within its bound (activities/progress.py:
a render, a micro-batch, a download that hangs), so Temporal's heartbeat timeout ends the attempt and retries
it even if nothing else does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from temporalio import activity
from temporalio.worker import (
    ActivityInboundInterceptor,
    ActivityOutboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from activities.progress import Progress, tracking
from schemas.settings import Stage

log = logging.getLogger(__name__)

BEATS_PER_TIMEOUT = 3

THROTTLE = timedelta(seconds=5)
"""Every ``Worker``'s ``max_heartbeat_throttle_interval``: the SDK sends a heartbeat at most this late."""


class HeartbeatTicker(Interceptor):
    """Register on every ``Worker`` (``interceptors=[HeartbeatTicker()]``); ``vouches``: whether what the
    worker's activities depend on still answers (default: always); ``bounds_s``: how long each stage may go
    without advancing (default ``DEFAULT_STAGE_BOUNDS_S``; the worker's ``WorkerLifecycle.stage_bounds_s``)."""

    def __init__(
        self, vouches: Callable[[], bool] | None = None, bounds_s: Mapping[Stage, float] | None = None
    ) -> None:
        self.vouches = vouches or _always
        self.bounds_s = dict(bounds_s or {})

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Ticking(next, self.vouches, Progress(self.bounds_s))


def _always() -> bool:
    return True


class _NewestDetails(ActivityOutboundInterceptor):
    """Passes the activity's own heartbeats on while ``vouches()`` and its work advances, remembering the
    newest details."""

    def __init__(
        self, next: ActivityOutboundInterceptor, vouches: Callable[[], bool], progress: Progress
    ) -> None:
        super().__init__(next)
        self.vouches = vouches
        self.progress = progress
        self.details: tuple[Any, ...] = ()
        self.stall: str | None = None

    def heartbeat(self, *details: Any) -> None:
        self.details = details
        self.beat()

    def beat(self) -> None:
        stall = self.progress.stalled()
        if stall is not None and self.stall is None:
            info = activity.info()
            log.warning(
                "%s (attempt %d of workflow %s): %s; its heartbeats stop so Temporal retries it",
                info.activity_type, info.attempt, info.workflow_id, stall,
            )  # fmt: skip
        self.stall = stall
        if stall is None and self.vouches():
            self.next.heartbeat(*self.details)


class _Ticking(ActivityInboundInterceptor):
    def __init__(
        self, next: ActivityInboundInterceptor, vouches: Callable[[], bool], progress: Progress
    ) -> None:
        super().__init__(next)
        self.vouches = vouches
        self.progress = progress

    def init(self, outbound: ActivityOutboundInterceptor) -> None:
        self.outbound = _NewestDetails(outbound, self.vouches, self.progress)
        super().init(self.outbound)

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        timeout = activity.info().heartbeat_timeout
        with tracking(self.progress):  # the attempt's stages report here (activities/progress.py)
            if not timeout:
                return await self.next.execute_activity(input)
            ticker = asyncio.create_task(self._tick(timeout.total_seconds() / BEATS_PER_TIMEOUT))
            try:
                return await self.next.execute_activity(input)
            finally:
                ticker.cancel()

    async def _tick(self, every_s: float) -> None:
        while True:
            await asyncio.sleep(every_s)
            self.outbound.beat()
