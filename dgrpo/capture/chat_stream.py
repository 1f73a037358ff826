"""A streamed chat completion (``stream=True``: server-sent events of ``chat.completion.chunk``s) put back
together as the ``choices[0]`` the same call would have returned unstreamed, for trajectory capture.

Text deltas (``content``, ``refusal``, ``reasoning``) and tool-call ``arguments`` are joined in order; a tool
call's ``id`` and ``name`` are taken as sent (servers may repeat them); logprobs and vLLM's ``token_ids`` are
joined; the last ``finish_reason`` sent is kept (``"stop"`` when none was).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from openai.types.chat.chat_completion import Choice as OpenAIChoice

JOINED_TEXT = ("content", "refusal", "reasoning", "reasoning_content")
"""Delta fields whose pieces are concatenated into the message's field of the same name."""


def sse_events(content: bytes) -> Iterator[Any]:
    """The JSON data of each server-sent event in ``content`` (``[DONE]`` and blank events left out)."""
    text = content.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")
    for event in text.split("\n\n"):
        data = "\n".join(line[5:].removeprefix(" ") for line in event.split("\n") if line.startswith("data:"))
        if data.strip() and data.strip() != "[DONE]":
            yield json.loads(data)


def streamed_choice(content: bytes, index: int = 0) -> OpenAIChoice | None:
    """The choice with ``index`` of a streamed chat completion's body, or None when it holds none."""
    choice: _Choice | None = None
    for chunk in sse_events(content):
        for delta_choice in chunk.get("choices") or []:
            if delta_choice.get("index", 0) != index:
                continue
            choice = choice or _Choice(index)
            choice.add(delta_choice, chunk)
    return None if choice is None else OpenAIChoice.model_validate(choice.as_dict())


class _Choice:
    """One choice as its chunks arrive."""

    def __init__(self, index: int = 0) -> None:
        self.index = index
        self.finish_reason: str | None = None
        self.text: dict[str, str] = {}
        self.tool_calls: list[dict[str, Any]] = []
        self.function_call: dict[str, str] | None = None
        self.logprobs: dict[str, list[Any]] | None = None
        self.token_ids: list[int] | None = None
        self.prompt_token_ids: list[int] | None = None

    def add(self, delta_choice: dict[str, Any], chunk: dict[str, Any]) -> None:
        self.finish_reason = delta_choice.get("finish_reason") or self.finish_reason
        delta = delta_choice.get("delta") or {}
        for key in JOINED_TEXT:
            if delta.get(key):
                self.text[key] = self.text.get(key, "") + delta[key]
        for call in delta.get("tool_calls") or []:
            self._add_tool_call(call)
        if delta.get("function_call"):
            self.function_call = self.function_call or {"name": "", "arguments": ""}
            _add_function(self.function_call, delta["function_call"])
        if delta_choice.get("logprobs") is not None:
            self.logprobs = self.logprobs or {"content": [], "refusal": []}
            for key in ("content", "refusal"):
                self.logprobs[key] += delta_choice["logprobs"].get(key) or []
        if delta_choice.get("token_ids") is not None:
            self.token_ids = (self.token_ids or []) + list(delta_choice["token_ids"])
        prompt_ids = delta_choice.get("prompt_token_ids") or chunk.get("prompt_token_ids")
        if prompt_ids and self.prompt_token_ids is None:
            self.prompt_token_ids = list(prompt_ids)

    def _add_tool_call(self, call: dict[str, Any]) -> None:
        index = call.get("index", len(self.tool_calls))
        while len(self.tool_calls) <= index:
            self.tool_calls.append({"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
        tool_call = self.tool_calls[index]
        tool_call["id"] = call.get("id") or tool_call["id"]
        tool_call["type"] = call.get("type") or tool_call["type"]
        _add_function(tool_call["function"], call.get("function") or {})

    def as_dict(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", **self.text}
        message.setdefault("content", None)
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        if self.function_call is not None:
            message["function_call"] = self.function_call
        out: dict[str, Any] = {
            "index": self.index,
            "finish_reason": self.finish_reason or "stop",
            "message": message,
        }
        out["logprobs"] = None if self.logprobs is None else {k: v or None for k, v in self.logprobs.items()}
        if self.token_ids is not None:
            out["token_ids"] = self.token_ids
        if self.prompt_token_ids is not None:
            out["prompt_token_ids"] = self.prompt_token_ids
        return out


def _add_function(function: dict[str, str], delta: dict[str, Any]) -> None:
    function["name"] = delta.get("name") or function["name"]
    function["arguments"] += delta.get("arguments") or ""
