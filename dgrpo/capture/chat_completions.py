"""ART's trajectory capture: a rollout's chat completions recorded into a ``Trajectory`` for it.

``await capture_auto_trajectory(rollout(...))`` runs the rollout with a fresh ``Trajectory`` in a context
variable; every chat completion an httpx- or httpx2-based client (``model.openai_client()``, ``AsyncOpenAI``,
``OpenAI``) answers meanwhile is appended to it: the request's messages not yet recorded, then the
returned choice (its logprobs and token ids kept; a streamed one put together from its chunks once the client
has read them, ``dgrpo.capture.chat_stream``). A call whose messages do not continue the trajectory's
conversation with the same tools goes to the ``additional_histories`` entry it continues, or a new one, as
in ART. ``auto_trajectory()`` is that trajectory inside the rollout (so it can set ``reward``), ``None``
outside. ``yield_trajectory(t)`` inside ``capture_yielded_trajectory(rollout(...))`` hands a trajectory
the rollout built itself to the caller. Each capture lives in its own context, so concurrent and nested
rollouts record only their own calls.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from contextvars import ContextVar
from functools import partial
from types import ModuleType
from typing import Any, Literal, overload

from openai.types.chat.chat_completion import Choice as OpenAIChoice

from dgrpo.capture.chat_stream import streamed_choice
from schemas.trajectory import History, Trajectory

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
    _install_hooks()
    trajectory = Trajectory()
    token = _AUTO.set(trajectory)
    try:
        await coroutine
    finally:
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


# ---- recording ---------------------------------------------------------------------------------------
def _chat_request(request: Any, not_read: type[Exception]) -> dict[str, Any] | None:
    """The JSON body of a chat completion request, or None for any other request."""
    if request.method != "POST" or not request.url.path.endswith("/chat/completions"):
        return None
    try:
        body = json.loads(request.content)
    except (not_read, ValueError):
        return None
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        return None
    return body


def _returned_choice(body: dict[str, Any], content: bytes) -> OpenAIChoice | None:
    """``choices[0]`` of a chat completion response's body (streamed or not), or None if it has none."""
    try:
        if body.get("stream"):
            return streamed_choice(content)
        return OpenAIChoice.model_validate(json.loads(content)["choices"][0])
    except (ValueError, KeyError, IndexError, TypeError):
        return None  # not a chat completion the client can read either; it raises its own error


def _comparable(message: Any) -> Any:
    # The same message as the trajectory lists it and as a client sends it back (None fields dropped).
    if isinstance(message, dict):
        return {k: _comparable(v) for k, v in message.items() if v is not None and v != []}
    if isinstance(message, list):
        return [_comparable(v) for v in message]
    return message


def _continues(conversation: Trajectory | History, messages: list[Any], tools: Any) -> bool:
    seen = conversation.messages()
    if not seen:
        return conversation.tools is None or conversation.tools == tools
    return conversation.tools == tools and [_comparable(m) for m in messages[: len(seen)]] == [
        _comparable(m) for m in seen
    ]


def _record(trajectory: Trajectory, body: dict[str, Any], status_code: int, content: bytes) -> None:
    if status_code != 200:
        return  # the client raises; a failed call is no turn of the conversation
    choice = _returned_choice(body, content)
    if choice is None:
        return
    messages, tools = body["messages"], body.get("tools")
    conversations: list[Trajectory | History] = [trajectory, *trajectory.additional_histories]
    conversation = next((c for c in conversations if _continues(c, messages, tools)), None)
    if conversation is None:
        conversation = History()
        trajectory.additional_histories.append(conversation)
    conversation.messages_and_choices.extend(messages[len(conversation.messages_and_choices) :])
    conversation.messages_and_choices.append(choice)
    conversation.tools = tools


def _when_read(response: Any, not_read: type[Exception], on_body: Callable[[bytes], None]) -> None:
    """Call ``on_body`` with ``response``'s body once the client has read it: now if it is read already,
    else when the client's own reading of the stream ends (or it closes the response having read part)."""
    try:
        on_body(response.content)
        return
    except not_read:
        pass
    received: list[bytes] = []
    pulling = done = False
    iter_bytes, aiter_bytes, close, aclose = (
        response.iter_bytes,
        response.aiter_bytes,
        response.close,
        response.aclose,
    )

    def finish() -> None:
        nonlocal done
        if not done:
            done = True
            on_body(b"".join(received))

    def tee(*args: Any, **kwargs: Any) -> Iterator[bytes]:
        nonlocal pulling
        chunks = iter_bytes(*args, **kwargs)
        while True:
            pulling = True
            try:
                chunk = next(chunks)
            except StopIteration:
                break
            finally:
                pulling = False
            received.append(chunk)
            yield chunk
        finish()

    async def atee(*args: Any, **kwargs: Any) -> AsyncIterator[bytes]:
        nonlocal pulling
        chunks = aiter_bytes(*args, **kwargs)
        while True:
            pulling = True
            try:
                chunk = await anext(chunks)
            except StopAsyncIteration:
                break
            finally:
                pulling = False
            received.append(chunk)
            yield chunk
        finish()

    # A close from within a pull is the stream's own at its end: the decoder's last bytes are still to come.
    def close_then_finish() -> None:
        close()
        if not pulling:
            finish()

    async def aclose_then_finish() -> None:
        await aclose()
        if not pulling:
            finish()

    # On this response only: httpx's own read(), aread() and iteration go through these attributes.
    response.iter_bytes, response.aiter_bytes = tee, atee
    response.close, response.aclose = close_then_finish, aclose_then_finish


_installed = False


def _install_hooks() -> None:
    """Wrap ``Client.send`` and ``AsyncClient.send`` of httpx and httpx2 (once; openai >= 3 sends through
    httpx2, older clients through httpx): every client, whenever made, reports its chat
    completions to the capture of the context that sent them."""
    global _installed
    if _installed:
        return
    _installed = True
    for name in ("httpx", "httpx2"):
        try:
            _hook(importlib.import_module(name))
        except ImportError:
            continue


def _hook(http: ModuleType) -> None:
    sync_send, async_send = http.Client.send, http.AsyncClient.send

    def send(self: Any, request: Any, **kwargs: Any) -> Any:
        trajectory = _AUTO.get()
        body = None if trajectory is None else _chat_request(request, http.RequestNotRead)
        response = sync_send(self, request, **kwargs)
        if trajectory is not None and body is not None:
            _when_read(
                response, http.ResponseNotRead, partial(_record, trajectory, body, response.status_code)
            )
        return response

    async def asend(self: Any, request: Any, **kwargs: Any) -> Any:
        trajectory = _AUTO.get()
        body = None if trajectory is None else _chat_request(request, http.RequestNotRead)
        response = await async_send(self, request, **kwargs)
        if trajectory is not None and body is not None:
            _when_read(
                response, http.ResponseNotRead, partial(_record, trajectory, body, response.status_code)
            )
        return response

    http.Client.send = send
    http.AsyncClient.send = asend
