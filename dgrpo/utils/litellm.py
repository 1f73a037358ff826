"""ART's ``art.utils.litellm``: a litellm completion choice as the openai ``Choice`` a trajectory holds.

litellm is not a dgrpo dependency: any choice object or dict shaped like litellm's ``Choices`` (a pydantic
model with ``message``, ``finish_reason``, ``index``, ``logprobs``) converts.
"""

from __future__ import annotations

from typing import Any

from openai.types.chat.chat_completion import Choice


def convert_litellm_choice_to_openai(litellm_choice: Any) -> Choice:
    """The openai ``Choice`` of a non-streaming litellm choice: its assistant message, function tool calls
    and token logprobs. A streaming choice (a ``delta``, no ``message``) is refused."""
    data = _as_dict(litellm_choice)
    if data.get("message") is None:
        raise TypeError(
            f"only a non-streaming litellm choice (litellm.types.utils.Choices) converts; "
            f"{type(litellm_choice).__name__} has no message"
        )
    message = _as_dict(data["message"])
    if message.get("role") != "assistant":
        raise ValueError(f"only assistant messages convert, not role={message.get('role')!r}")
    tool_calls = [_tool_call(_as_dict(call)) for call in message.get("tool_calls") or []]
    logprobs = _as_dict(data["logprobs"]) if data.get("logprobs") is not None else None
    return Choice.model_validate(
        {
            "finish_reason": data.get("finish_reason"),
            "index": data.get("index", 0),
            "message": {
                "role": "assistant",
                "content": message.get("content"),
                "tool_calls": tool_calls or None,
            },
            "logprobs": None if logprobs is None else {"content": logprobs.get("content") or []},
        }
    )


def _tool_call(call: dict[str, Any]) -> dict[str, Any]:
    function = _as_dict(call.get("function") or {})
    if call.get("type", "function") != "function" or not function.get("name"):
        raise ValueError(f"only function tool calls with a name convert, not {call!r}")
    return {
        "id": call.get("id"),
        "type": "function",
        "function": {"name": function["name"], "arguments": function.get("arguments") or ""},
    }


def _as_dict(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        dumped = dump()
        if isinstance(dumped, dict):
            return dumped
    return dict(vars(value))


__all__ = ["convert_litellm_choice_to_openai"]
