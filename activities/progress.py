"""Whether a long activity's work advances: the one progress API its stages call, read by the heartbeat ticker.

An activity's long work is a series of stages (a checkpoint download, a chat render, a micro-batch, ...). The
work says when a stage starts (``with progress.stage("micro_batch"):``) and each time it advances
(``progress.advance()``: a MiB downloaded, a chat rendered, a micro-batch done). Each kind of stage has a bound,
the longest it may go without advancing (``schemas.settings.DEFAULT_STAGE_BOUNDS_S``, an operator's
``$DGRPO_STAGE_BOUNDS``). While the innermost stage is past its bound the heartbeat ticker
(workers/heartbeat_ticker.py) stops every heartbeat of the activity, so Temporal's heartbeat timeout ends the
attempt and retries it, elsewhere if this worker is stuck: a heartbeat that beats whether or not the work
advances would hide a hang from Temporal. Work outside any stage (a short call, waiting for a lock) is not
bounded here.

The ticker puts each attempt's ``Progress`` in a context variable: the activity's coroutine and the threads it
starts with ``asyncio.to_thread`` (or ``contextvars.copy_context().run``) find it; outside an activity these
functions do nothing. Updates are single attribute writes, safe from any thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from schemas.settings import DEFAULT_STAGE_BOUNDS_S, Stage


@dataclass
class _Open:
    name: Stage
    bound_s: float
    advanced_at: float


class Progress:
    """One activity attempt's stages; ``stalled()`` says whether the innermost is past its bound."""

    def __init__(
        self, bounds_s: Mapping[Stage, float] | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.bounds_s: dict[Stage, float] = {**DEFAULT_STAGE_BOUNDS_S, **(bounds_s or {})}
        self.clock = clock
        self._open: list[_Open] = []

    def bound(self, name: Stage) -> float:
        return self.bounds_s[name]

    @contextmanager
    def stage(self, name: Stage) -> Iterator[None]:
        opened = _Open(name, self.bound(name), self.clock())
        self._open = [*self._open, opened]
        try:
            yield
        finally:
            self._open = [s for s in self._open if s is not opened]
            self.advance()  # a stage that ended moved the one around it on

    def advance(self) -> None:
        if self._open:
            self._open[-1].advanced_at = self.clock()

    def stalled(self) -> str | None:
        """What stalled and for how long (None while the innermost stage is within its bound)."""
        if not self._open:
            return None
        current = self._open[-1]
        idle = self.clock() - current.advanced_at
        if idle <= current.bound_s:
            return None
        return (
            f"stage {current.name!r} has not advanced for {idle:.0f} s (its bound is {current.bound_s:g} s)"
        )


_current: ContextVar[Progress | None] = ContextVar("dgrpo_progress", default=None)


@contextmanager
def tracking(progress: Progress) -> Iterator[Progress]:
    """Make ``progress`` the one this context's stages report to (the heartbeat ticker, per attempt)."""
    token = _current.set(progress)
    try:
        yield progress
    finally:
        _current.reset(token)


@contextmanager
def stage(name: Stage) -> Iterator[None]:
    """The work in the block is stage ``name``: bounded from now until it ends, by its advances."""
    progress = _current.get()
    if progress is None:
        yield
        return
    with progress.stage(name):
        yield


def current() -> Progress | None:
    """The stages this context reports to (the attempt's, in an activity and the threads it starts), or None."""
    return _current.get()


def advance() -> None:
    """The current stage moved on (a chunk transferred, a chat rendered, a micro-batch trained)."""
    progress = _current.get()
    if progress is not None:
        progress.advance()


def bound(name: Stage) -> float:
    """How long stage ``name`` may go without advancing here (a render stops itself at this bound)."""
    progress = _current.get()
    return DEFAULT_STAGE_BOUNDS_S[name] if progress is None else progress.bound(name)
