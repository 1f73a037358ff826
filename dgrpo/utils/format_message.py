"""ART's ``format_message``: a chat message as readable text, ``Role:\\n<content>`` then one
``name(arguments)`` line per function tool call (ART's format, a content line always ending in a newline)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def format_message(message: Mapping[str, Any]) -> str:
    """The message's role (capitalised), its content (or refusal) and its function tool calls."""
    content = message.get("content", message.get("refusal", "")) or ""
    calls = [
        f"{call['function']['name']}({call['function']['arguments']})"
        for call in message.get("tool_calls") or []
        if "function" in call
    ]
    after_content = "\n" if content else ""  # ART's: a newline after any content, calls or not
    return f"{message['role'].capitalize()}:\n{content}{after_content}" + "\n".join(calls)
