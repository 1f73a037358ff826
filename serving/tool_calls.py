"""Tools in chat prompts and tool calls out of completions, in the Hermes ``<tool_call>`` style.

SmolLM2, Qwen2/2.5/3 and Hermes models write a call as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.
A chat template that knows tools (Qwen's) gets them as ``tools=``; one that does not (SmolLM2's) gets a
Hermes-style system block listing them, and earlier assistant calls rendered back in the same style.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)

HERMES_TOOLS_PROMPT = (
    "You are a function calling AI model. You are provided with function signatures within <tools></tools> "
    "XML tags. You may call one or more functions to assist with the user query. Don't make assumptions "
    "about what values to plug into functions. For each function call return a json object with function "
    "name and arguments within <tool_call></tool_call> XML tags as follows:\n"
    '<tool_call>\n{{"name": <function-name>, "arguments": <args-dict>}}\n</tool_call>\n'
    "<tools>\n{tools}\n</tools>"
)


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """Split a completion into its plain content and OpenAI ``tool_calls``.

    Returns ``(text, [])`` unchanged when it holds no well-formed call; an unclosed last ``<tool_call>``
    (the model stopped at EOS) counts when its JSON parses.
    """
    calls: list[dict[str, Any]] = []
    for match in TOOL_CALL_RE.finditer(text):
        try:
            call = json.loads(match.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            continue
        arguments = call.get("arguments", call.get("parameters", {}))
        calls.append(
            {
                "id": f"chatcmpl-tool-{uuid.uuid4().hex}",
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                },
            }
        )
    if not calls:
        return text, []
    content = TOOL_CALL_RE.sub("", text).strip()
    return content or None, calls


def _text(content: Any) -> str:
    """Message content as text: a string, a list of ``{"type": "text"}`` parts, or None."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise ValueError("only text content parts ({'type': 'text', 'text': ...}) are supported")
        parts.append(part["text"])
    return "".join(parts)


def _call_text(call: dict[str, Any]) -> str:
    function = call.get("function") or {}
    arguments = function.get("arguments", "{}")
    try:
        arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError:
        pass  # keep the string the model wrote
    return (
        "<tool_call>\n"
        + json.dumps({"name": function.get("name"), "arguments": arguments})
        + "\n</tool_call>"
    )


def prepare_messages(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, template: str
) -> tuple[list[dict[str, Any]], bool]:
    """Messages a chat template can render; True when ``tools`` should go to the template as ``tools=``.

    Content parts are joined to text. For a template that does not handle tools, tool definitions go into
    the system message and assistant ``tool_calls`` / tool results are written out Hermes-style.
    """
    native_tools = "tools" in template
    native_calls = "tool_calls" in template
    out: list[dict[str, Any]] = []
    for message in messages:
        m = dict(message)
        m["content"] = _text(m.get("content"))
        if m["role"] == "assistant" and m.get("tool_calls") and not native_calls:
            calls = "\n".join(_call_text(c) for c in m.pop("tool_calls"))
            m["content"] = f"{m['content']}\n{calls}".strip()
        elif m["role"] == "tool" and not native_calls:
            m["content"] = f"<tool_response>\n{m['content']}\n</tool_response>"
        out.append({k: v for k, v in m.items() if v is not None})
    if tools and not native_tools:
        block = HERMES_TOOLS_PROMPT.format(tools="\n".join(json.dumps(t) for t in tools))
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{block}"}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out, native_tools
