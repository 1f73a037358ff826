"""A time bound on Python work in this thread: caller-supplied Jinja (a chat template) cannot run forever.

``within(seconds, fn)`` runs ``fn()`` with a trace function on this thread that raises ``TimeBoundExceeded`` at
the first Python line after the deadline. A chat template is Python code once Jinja compiles it, so a slow or
endless one is stopped where it is and its thread is free again; a long call into C (a tokenizer's Rust) runs
to its end first, so its input is bounded before it is called. The tracing costs about 2x on the traced code:
used for renders (well under a millisecond each), never for tensor work.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")


class TimeBoundExceeded(BaseException):
    """``within``'s work ran past its bound. A BaseException, so no ``except Exception`` in the work (Jinja's,
    a template's caller) mistakes it for the work's own error and carries on."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"ran past its bound of {seconds:g} s")
        self.seconds = seconds


def within(seconds: float, fn: Callable[[], T]) -> T:
    """``fn()``, stopped with ``TimeBoundExceeded`` once it has run ``seconds``."""
    deadline = time.monotonic() + seconds
    previous = sys.gettrace()  # a debugger's or coverage's tracer comes back afterwards

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        if time.monotonic() > deadline:
            raise TimeBoundExceeded(seconds)
        return tracer

    sys.settrace(tracer)
    try:
        return fn()
    finally:
        sys.settrace(previous)
