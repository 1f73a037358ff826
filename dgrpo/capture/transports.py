"""Where trajectory capture sees a rollout's calls: the HTTP clients' send, wrapped once per process.

``install()`` wraps ``Client.send`` and ``AsyncClient.send`` of httpx and httpx2 (openai >= 3 sends through
httpx2, older clients and anthropic through httpx), ``aiohttp.ClientSession._request`` and
``requests.Session.send``, those of them that are installed. With no capture scope active (``CAPTURE_SCOPES``,
schemas/trajectory.py) a wrapped send only reads that context variable. Inside one, a ``POST`` to a model
endpoint with a JSON body is recorded into the innermost scope's trajectory once the client has read the
whole response: as an exchange (ART 0.5.23's ``with trajectory:``, dgrpo/capture/exchange_bodies.py), or as
messages and a choice (ART 0.5.18's ``capture_auto_trajectory``, Chat Completions only). A call is recorded
where it began, once: a client library calling another (litellm through openai) records the outer call only.
"""

from __future__ import annotations

import importlib
import json
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from contextvars import ContextVar
from datetime import UTC, datetime
from functools import partial
from types import ModuleType
from typing import Any

from openai.types.chat.chat_completion import Choice as OpenAIChoice

from dgrpo.capture.chat_stream import streamed_choice
from dgrpo.capture.exchange_bodies import Endpoint, build_exchange, endpoint_of
from schemas.exchanges import PROTOCOLS
from schemas.trajectory import CAPTURE_SCOPES, Trajectory

log = logging.getLogger(__name__)

OnResponse = Callable[[int, bytes], None]
"""Given the status code and the whole (decoded) body once the client has read it."""

_SENDING: ContextVar[bool] = ContextVar("dgrpo_capture_sending", default=False)


def recorder(method: str, path: str, body: Any) -> OnResponse | None:
    """What to do with the response of a call about to be sent, or None when it is not captured."""
    scopes = CAPTURE_SCOPES.get()
    if not scopes or _SENDING.get() or method.upper() != "POST":
        return None
    endpoint = endpoint_of(path)
    request = _json_object(body)
    if endpoint is None or request is None:
        return None
    scope = scopes[-1]
    if scope.legacy:
        if endpoint != "chat_completions" or not isinstance(request.get("messages"), list):
            return None
        return partial(_record_turn, scope.trajectory, request)
    return partial(_record_exchange, scope.trajectory, endpoint, request, datetime.now(UTC))


def _json_object(body: Any) -> dict[str, Any] | None:
    if isinstance(body, dict):
        return json.loads(json.dumps(body))  # the client's own dict, copied as it is sent
    if isinstance(body, str):
        body = body.encode()
    if not isinstance(body, bytes | bytearray):
        return None
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _record_turn(trajectory: Trajectory, request: dict[str, Any], status_code: int, content: bytes) -> None:
    if status_code != 200:
        return  # the client raises; a failed call is no turn of the conversation
    try:
        if request.get("stream"):
            choice = streamed_choice(content)
        else:
            choice = OpenAIChoice.model_validate(json.loads(content)["choices"][0])
    except (ValueError, KeyError, IndexError, TypeError):
        return  # not a chat completion the client can read either; it raises its own error
    if choice is not None:
        trajectory.add_turn(request["messages"], request.get("tools"), choice)


def _record_exchange(
    trajectory: Trajectory,
    endpoint: Endpoint,
    request: dict[str, Any],
    started: datetime,
    status_code: int,
    content: bytes,
) -> None:
    if not 200 <= status_code < 300:
        return
    try:
        exchange = build_exchange(endpoint, request, content, started, datetime.now(UTC))
    except (ValueError, KeyError, TypeError) as err:  # pydantic's ValidationError is a ValueError
        log.debug("a %s call was not captured: %s", endpoint, err)
        return
    if exchange is None:
        return
    if trajectory.messages_and_choices or trajectory.tools is not None or trajectory.additional_histories:
        log.debug("a %s call was not captured: the trajectory holds messages_and_choices", endpoint)
        return
    getattr(trajectory.exchanges, PROTOCOLS[_PROTOCOL_INDEX[endpoint]]).append(exchange)


_PROTOCOL_INDEX = {name: i for i, name in enumerate(PROTOCOLS)}

_installed = False


def install() -> None:
    """Wrap the send of every HTTP client library installed (once per process)."""
    global _installed
    if _installed:
        return
    _installed = True
    for name, hook in (("httpx", _hook_httpx), ("httpx2", _hook_httpx), ("aiohttp", _hook_aiohttp)):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        hook(module)
    try:
        import requests
    except ImportError:
        return
    _hook_requests(requests)


# ---- httpx and httpx2 ----------------------------------------------------------------------------
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


def _httpx_recorder(http: ModuleType, request: Any) -> OnResponse | None:
    if not CAPTURE_SCOPES.get():
        return None
    try:
        body = request.content
    except http.RequestNotRead:
        return None
    return recorder(request.method, request.url.path, body)


def _hook_httpx(http: ModuleType) -> None:
    sync_send, async_send = http.Client.send, http.AsyncClient.send

    def send(self: Any, request: Any, **kwargs: Any) -> Any:
        on_response = _httpx_recorder(http, request)
        if on_response is None:
            return sync_send(self, request, **kwargs)
        token = _SENDING.set(True)
        try:
            response = sync_send(self, request, **kwargs)
        finally:
            _SENDING.reset(token)
        _when_read(response, http.ResponseNotRead, partial(on_response, response.status_code))
        return response

    async def asend(self: Any, request: Any, **kwargs: Any) -> Any:
        on_response = _httpx_recorder(http, request)
        if on_response is None:
            return await async_send(self, request, **kwargs)
        token = _SENDING.set(True)
        try:
            response = await async_send(self, request, **kwargs)
        finally:
            _SENDING.reset(token)
        _when_read(response, http.ResponseNotRead, partial(on_response, response.status_code))
        return response

    http.Client.send = send
    http.AsyncClient.send = asend


# ---- aiohttp ---------------------------------------------------------------------------------------
class _Body:
    """A response body as the client reads it; handed on once, when read to its end."""

    def __init__(self, on_body: Callable[[bytes], None]) -> None:
        self.on_body = on_body
        self.parts: list[bytes] = []
        self.done = False

    def add(self, chunk: bytes) -> None:
        if not self.done:
            self.parts.append(chunk)

    def finish(self) -> None:
        if not self.done:
            self.done = True
            self.on_body(b"".join(self.parts))


class _TeedStream:
    """An aiohttp ``StreamReader`` whose reads are also kept in a ``_Body`` (``response.read()``,
    ``response.content.iter_any()``, ... all read through it)."""

    def __init__(self, stream: Any, body: _Body) -> None:
        self._stream = stream
        self._body = body

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    def _kept(self, chunk: bytes) -> bytes:
        self._body.add(chunk)
        if self._stream.at_eof():
            self._body.finish()
        return chunk

    async def read(self, n: int = -1) -> bytes:
        return self._kept(await self._stream.read(n))

    async def readany(self) -> bytes:
        return self._kept(await self._stream.readany())

    async def readline(self) -> bytes:
        return self._kept(await self._stream.readline())

    async def readexactly(self, n: int) -> bytes:
        return self._kept(await self._stream.readexactly(n))

    async def readuntil(self, separator: bytes = b"\n") -> bytes:
        return self._kept(await self._stream.readuntil(separator))

    async def readchunk(self) -> tuple[bytes, bool]:
        chunk, end = await self._stream.readchunk()
        return self._kept(chunk), end

    async def _through(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        async for chunk in chunks:
            yield self._kept(chunk)
        self._body.finish()

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._through(self._stream.__aiter__())

    def iter_any(self) -> AsyncIterator[bytes]:
        return self._through(self._stream.iter_any())

    def iter_chunked(self, n: int) -> AsyncIterator[bytes]:
        return self._through(self._stream.iter_chunked(n))


def _hook_aiohttp(aiohttp: ModuleType) -> None:
    original = aiohttp.ClientSession._request
    url_of = importlib.import_module("yarl").URL  # aiohttp's own URL type

    async def request(self: Any, method: str, str_or_url: Any, **kwargs: Any) -> Any:
        on_response = None
        if CAPTURE_SCOPES.get():
            body = kwargs.get("json") if kwargs.get("json") is not None else kwargs.get("data")
            on_response = recorder(method, url_of(str_or_url).path, body)
        if on_response is None:
            return await original(self, method, str_or_url, **kwargs)
        token = _SENDING.set(True)
        try:
            response = await original(self, method, str_or_url, **kwargs)
        finally:
            _SENDING.reset(token)
        response.content = _TeedStream(response.content, _Body(partial(on_response, response.status)))
        return response

    aiohttp.ClientSession._request = request


# ---- requests --------------------------------------------------------------------------------------
def _hook_requests(requests: ModuleType) -> None:
    original = requests.Session.send

    def send(self: Any, request: Any, **kwargs: Any) -> Any:
        on_response = None
        if CAPTURE_SCOPES.get():
            path = requests.utils.urlparse(request.url or "").path
            on_response = recorder(request.method or "GET", path, request.body)
        if on_response is None:
            return original(self, request, **kwargs)
        token = _SENDING.set(True)
        try:
            response = original(self, request, **kwargs)
        finally:
            _SENDING.reset(token)
        body = _Body(partial(on_response, response.status_code))
        if not kwargs.get("stream", False):
            body.add(response.content)
            body.finish()
            return response
        iter_content = response.iter_content

        def teed(*args: Any, **kw: Any) -> Iterator[Any]:
            for chunk in iter_content(*args, **kw):
                body.add(chunk.encode(response.encoding or "utf-8") if isinstance(chunk, str) else chunk)
                yield chunk
            body.finish()

        response.iter_content = teed
        return response

    requests.Session.send = send
