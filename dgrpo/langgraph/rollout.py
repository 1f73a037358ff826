"""ART's ``art.langgraph.wrap_rollout(model, fn)``: ``fn`` run as a rollout of ``model``, its chat completions
recorded into the ``Trajectory`` it returns.

The wrapped ``fn`` runs under ``capture_auto_trajectory`` (dgrpo/capture/chat_completions.py): every chat
completion it sends, LangChain's ``ChatOpenAI`` included, is recorded from the wire, with the choice's logprobs
and token ids. The conversation goes into the returned trajectory's ``messages_and_choices`` and ``tools``, and
conversations that do not continue it into ``additional_histories``, as ART's wrapper puts them. Inside ``fn``,
``init_chat_model`` answers with ``model``'s served endpoint (``rollout_model``).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from dgrpo.capture.chat_completions import capture_auto_trajectory
from schemas.trajectory import Trajectory

if TYPE_CHECKING:
    from dgrpo.client.model_base import ModelBase

_ROLLOUT_MODEL: ContextVar[ModelBase[Any, Any] | None] = ContextVar("dgrpo_langgraph_model", default=None)


def rollout_model() -> ModelBase[Any, Any]:
    """The model of the ``wrap_rollout`` rollout running in this context; ``LookupError`` outside one."""
    model = _ROLLOUT_MODEL.get()
    if model is None:
        raise LookupError(
            "art.langgraph.init_chat_model() chooses the model of the rollout it runs in: call it inside a "
            "rollout wrapped by art.langgraph.wrap_rollout(model, rollout), or pass a LangChain chat model "
            "instance as init_chat_model(chat_model)"
        )
    return model


def wrap_rollout(
    model: ModelBase[Any, Any], fn: Callable[..., Awaitable[Trajectory]]
) -> Callable[..., Awaitable[Trajectory]]:
    """``fn`` (an async rollout returning its ``art.Trajectory``) as a rollout of ``model`` whose chat
    completions are recorded into the trajectory it returns (ART's)."""

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Trajectory:
        returned: list[object] = []

        async def run() -> None:
            returned.append(await fn(*args, **kwargs))

        token = _ROLLOUT_MODEL.set(model)
        try:
            captured = await capture_auto_trajectory(run())
        finally:
            _ROLLOUT_MODEL.reset(token)
        return recorded_into(returned[0], captured, getattr(fn, "__name__", repr(fn)))

    return wrapper


def recorded_into(result: object, captured: Trajectory, rollout_name: str) -> Trajectory:
    """``result`` (the rollout's trajectory) holding the conversations ``captured`` recorded, as ART's wrapper
    puts them: the first one replaces its messages and tools, the others are added to its histories."""
    if not isinstance(result, Trajectory):
        raise TypeError(
            f"a rollout wrapped by art.langgraph.wrap_rollout returns its art.Trajectory (its reward and metrics; "
            f"the wrapper fills in the messages), and {rollout_name} returned a {type(result).__name__}"
        )
    if not captured.messages_and_choices:
        return result  # no call was made: the trajectory stays as the rollout built it (ART's)
    if result.exchanges:
        raise ValueError(
            f"{rollout_name} returned a trajectory holding captured exchanges (art.trajectory(...)); a rollout "
            "wrapped by art.langgraph.wrap_rollout returns one without them, which the wrapper fills in"
        )
    result.messages_and_choices = captured.messages_and_choices
    result.tools = captured.tools
    result.additional_histories.extend(captured.additional_histories)
    return result
