"""ART's trajectory capture: a rollout's chat completions recorded into a ``Trajectory`` for it.

``await capture_auto_trajectory(rollout(...))`` runs the rollout with a fresh ``Trajectory`` in a context
variable; every chat completion a client answers meanwhile (``model.openai_client()``, ``AsyncOpenAI``,
``OpenAI``, litellm: over httpx, httpx2, aiohttp or requests, dgrpo/capture/transports.py) is appended to it: the request's messages not yet recorded, then the
returned choice (its logprobs and token ids kept; a streamed one put together from its chunks once the client
has read them, ``dgrpo.capture.chat_stream``). A call whose messages do not continue the trajectory's
conversation with the same tools goes to the ``additional_histories`` entry it continues, or a new one, as
in ART. ``auto_trajectory()`` is that trajectory inside the rollout (so it can set ``reward``), ``None``
outside. ``yield_trajectory(t)`` inside ``capture_yielded_trajectory(rollout(...))`` hands a trajectory
the rollout built itself to the caller. Each capture lives in its own context, so concurrent and nested
rollouts record only their own calls.
"""

from __future__ import annotations

from collections.abc import Coroutine
from contextvars import ContextVar
from typing import Any, Literal, overload

from dgrpo.capture.transports import install
from schemas.trajectory import CAPTURE_SCOPES, CaptureScope, Trajectory

_AUTO: ContextVar[Trajectory | None] = ContextVar("dgrpo_auto_trajectory", default=None)
_YIELDED: ContextVar[list[Trajectory] | None] = ContextVar("dgrpo_yielded_trajectory", default=None)


@overload
def auto_trajectory(*, required: Literal[True]) -> Trajectory: ...


@overload
def auto_trajectory(*, required: bool = False) -> Trajectory | None: ...


def auto_trajectory(*, required: bool = False) -> Trajectory | None:
    """The trajectory ``capture_auto_trajectory`` is recording for this rollout; None outside one (or an
    error, with ``required=True``)."""
    trajectory = _AUTO.get()
    if trajectory is None and required:
        raise RuntimeError(
            "auto_trajectory(required=True) was called outside a capture: run the rollout as "
            "`await art.capture_auto_trajectory(rollout(...))`"
        )
    return trajectory


async def capture_auto_trajectory(coroutine: Coroutine[Any, Any, Any]) -> Trajectory:
    """Run ``coroutine`` and return the trajectory of its chat completions (finished: its duration set)."""
    install()
    trajectory = Trajectory()
    token = _AUTO.set(trajectory)
    scopes = CAPTURE_SCOPES.set((*CAPTURE_SCOPES.get(), CaptureScope(trajectory, legacy=True)))
    try:
        await coroutine
    finally:
        CAPTURE_SCOPES.reset(scopes)
        _AUTO.reset(token)
        trajectory.finish()
    return trajectory


def yield_trajectory(trajectory: Trajectory) -> None:
    """Hand ``trajectory`` to the enclosing ``capture_yielded_trajectory``; outside one, nothing happens
    (so a rollout that yields still runs unchanged on its own)."""
    yielded = _YIELDED.get()
    if yielded is not None:
        yielded.append(trajectory)


async def capture_yielded_trajectory(coroutine: Coroutine[Any, Any, Any]) -> Trajectory:
    """Run ``coroutine`` and return the trajectory it last passed to ``yield_trajectory``."""
    yielded: list[Trajectory] = []
    token = _YIELDED.set(yielded)
    try:
        await coroutine
    finally:
        _YIELDED.reset(token)
    if not yielded:
        raise RuntimeError("the rollout finished without calling art.yield_trajectory(trajectory)")
    return yielded[-1]
