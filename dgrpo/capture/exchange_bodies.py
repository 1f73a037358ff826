"""A captured call's response body (plain JSON, or a complete stream of server-sent events) as the SDK's
response object, and the exchange it makes (ART 0.5.23's capture, schemas/exchanges.py).

Four endpoints, by the request path's ending: ``/chat/completions`` (openai ``ChatCompletion``),
``/completions`` (``Completion``), ``/responses`` (``Response``) and ``/messages`` (anthropic ``Message``: only
where the ``anthropic`` package is installed; without it such calls are left out, with one warning). A stream
counts only once complete (``[DONE]``, ``response.completed``, ``message_stop``); an incomplete or unreadable
body raises ``ValueError``, and the caller records nothing for it.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any, Literal

from openai.types import Completion
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from dgrpo.capture.chat_stream import sse_events, streamed_choice
from schemas.exchanges import (
    ChatCompletionsExchange,
    CompletionsExchange,
    Exchange,
    MessagesExchange,
    ResponsesExchange,
    TrajectoryExchanges,
)

log = logging.getLogger(__name__)

Endpoint = Literal["chat_completions", "completions", "responses", "messages"]
_ENDPOINTS: dict[str, Endpoint] = {
    "/chat/completions": "chat_completions",
    "/completions": "completions",
    "/responses": "responses",
    "/messages": "messages",
}


def endpoint_of(path: str) -> Endpoint | None:
    """The protocol a request path speaks, or None for one that is not captured."""
    path = path.rstrip("/")
    return next((endpoint for suffix, endpoint in _ENDPOINTS.items() if path.endswith(suffix)), None)


def build_exchange(
    endpoint: Endpoint, request: dict[str, Any], body: bytes, start_time: datetime, end_time: datetime
) -> Exchange | None:
    """The exchange of one 2xx call; None for a Messages call without the ``anthropic`` package."""
    stream = request.get("stream") is True
    times = {"request": request, "start_time": start_time, "end_time": end_time}
    if endpoint == "chat_completions":
        return ChatCompletionsExchange(response=_chat_completion(body, stream), **times)
    if endpoint == "completions":
        return CompletionsExchange(response=_completion(body, stream), **times)
    if endpoint == "responses":
        return ResponsesExchange(response=_response(body, stream), **times)
    message = _message(body, stream)
    return None if message is None else MessagesExchange(response=message, **times)


def _events(body: bytes) -> list[tuple[str | None, Any]]:
    """``(event name, data)`` of each server-sent event; data ``"[DONE]"`` as the string."""
    text = body.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    events: list[tuple[str | None, Any]] = []
    for block in text.split("\n\n"):
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
        raw = "\n".join(data)
        if raw.strip():
            events.append((name, raw if raw.strip() == "[DONE]" else json.loads(raw)))
    return events


def _require_done(body: bytes, what: str) -> None:
    if not any(data == "[DONE]" for _, data in _events(body)):
        raise ValueError(f"incomplete {what} stream (no [DONE])")


def _chat_completion(body: bytes, stream: bool) -> ChatCompletion:
    if not stream:
        return ChatCompletion.model_validate_json(body)
    _require_done(body, "Chat Completions")
    chunks = list(sse_events(body))
    if not chunks:
        raise ValueError("a Chat Completions stream without chunks")
    indexes = sorted({c.get("index", 0) for chunk in chunks for c in chunk.get("choices") or []})
    choices = [streamed_choice(body, index) for index in indexes]
    usage = next((chunk["usage"] for chunk in reversed(chunks) if chunk.get("usage")), None)
    first = chunks[0]
    return ChatCompletion.model_validate(
        {
            "id": first.get("id", ""),
            "object": "chat.completion",
            "created": first.get("created", 0),
            "model": first.get("model", ""),
            "choices": [c.model_dump(exclude_none=True) for c in choices if c is not None],
            "usage": usage,
        }
    )


def _completion(body: bytes, stream: bool) -> Completion:
    if not stream:
        return Completion.model_validate_json(body)
    _require_done(body, "Completions")
    chunks = [data for _, data in _events(body) if isinstance(data, dict)]
    if not chunks:
        raise ValueError("a Completions stream without chunks")
    choices: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        for part in chunk.get("choices") or []:
            choice = choices.setdefault(part.get("index", 0), {"text": "", "finish_reason": "stop"})
            choice["text"] += part.get("text") or ""
            choice["finish_reason"] = part.get("finish_reason") or choice["finish_reason"]
            if isinstance(part.get("token_ids"), list):
                choice["token_ids"] = choice.get("token_ids", []) + part["token_ids"]
            if isinstance(part.get("prompt_token_ids"), list):
                choice.setdefault("prompt_token_ids", part["prompt_token_ids"])
    usage = next((chunk["usage"] for chunk in reversed(chunks) if chunk.get("usage")), None)
    return Completion.model_validate(
        {
            **{k: chunks[0].get(k) for k in ("id", "created", "model")},
            "object": "text_completion",
            "choices": [{"index": i, **choices[i]} for i in sorted(choices)],
            "usage": usage,
        }
    )


def _response(body: bytes, stream: bool) -> Response:
    if not stream:
        return Response.model_validate_json(body)
    for name, data in reversed(_events(body)):
        if isinstance(data, dict) and "response.completed" in (name, data.get("type")):
            return Response.model_validate(data["response"])
    raise ValueError("incomplete Responses stream (no response.completed)")


_warned_anthropic = False


def _message(body: bytes, stream: bool) -> Any:
    global _warned_anthropic
    try:
        from anthropic.types import Message
    except ImportError:
        if not _warned_anthropic:
            _warned_anthropic = True
            log.warning("Messages API calls are not captured: install the anthropic package to capture them")
        return None
    if not stream:
        return Message.model_validate_json(body)
    return Message.model_validate(_streamed_message(body))


def _streamed_message(body: bytes) -> dict[str, Any]:
    """An Anthropic Messages stream's events put together as the message the call would have returned."""
    message: dict[str, Any] | None = None
    partial_json: dict[int, str] = {}
    for name, data in _events(body):
        kind = data.get("type", name) if isinstance(data, dict) else name
        if kind == "error":
            raise ValueError("the Messages stream returned an error event")
        if kind == "message_start":
            message = dict(data["message"])
            message["content"] = list(message.get("content") or [])
        elif message is None or not isinstance(data, dict):
            continue
        elif kind == "content_block_start":
            message["content"].append(dict(data["content_block"]))
        elif kind == "content_block_delta":
            block, delta = message["content"][data["index"]], data["delta"]
            if delta.get("type") == "input_json_delta":
                partial_json[data["index"]] = partial_json.get(data["index"], "") + delta["partial_json"]
            else:
                for key in ("text", "thinking", "signature"):
                    if key in delta:
                        block[key] = block.get(key, "") + delta[key]
        elif kind == "content_block_stop" and data["index"] in partial_json:
            message["content"][data["index"]]["input"] = json.loads(partial_json.pop(data["index"]) or "{}")
        elif kind == "message_delta":
            message.update({k: v for k, v in (data.get("delta") or {}).items() if v is not None})
            message["usage"] = {**(message.get("usage") or {}), **(data.get("usage") or {})}
        elif kind == "message_stop":
            return message
    raise ValueError("incomplete Messages stream (no message_stop)")


def exchanges_from_json(data: dict[str, Any]) -> TrajectoryExchanges:
    """A trajectory's exchanges as ``model_dump(mode="json")`` wrote them, their responses parsed by their SDK
    again (a Messages exchange needs the ``anthropic`` package)."""
    parsers: dict[str, Any] = {
        "chat_completions": ChatCompletion,
        "completions": Completion,
        "responses": Response,
    }
    out: dict[str, list[dict[str, Any]]] = {}
    for protocol, items in data.items():
        if protocol == "messages" and items:
            from anthropic.types import Message

            parsers["messages"] = Message
        out[protocol] = [
            {
                **{k: v for k, v in item.items() if k != "model"},  # computed from the request
                "response": parsers[protocol].model_validate(item["response"]),
            }
            for item in items
        ]
    return TrajectoryExchanges.model_validate(out)
