"""ART's ``art.guided_completion``: request parameters that guide a student to repeat a teacher's reply
(distillation inside RL, as ART's self-play tic-tac-toe does).

    guided_choice, tool_choice, tools = get_guided_completion_params(teacher_completion, base_tools)
    await client.chat.completions.create(..., extra_body={"guided_choice": guided_choice})

A text reply becomes ``guided_choice=[its content]``; a tool call becomes a forced ``tool_choice`` and that
tool with a schema that admits only the teacher's arguments. Who enforces them is the engine: through
``model.openai_client()`` vLLM gets them as ``structured_outputs`` and enforces them; dgrpo's CPU server
refuses them (HTTP 400), as it samples freely and the student would learn from something else.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from typing import Any, Literal

from openai.types.chat.chat_completion import ChatCompletion
from openai.types.chat.chat_completion_tool_param import ChatCompletionToolParam
from pydantic import create_model

GuidedParams = tuple[list[str | None] | None, dict[str, Any] | None, list[ChatCompletionToolParam] | None]
"""``(guided_choice, tool_choice, tools)``: one of the first two is None."""


def freeze_tool_schema(
    tool: ChatCompletionToolParam, fixed_args: dict[str, object]
) -> ChatCompletionToolParam:
    """A copy of ``tool`` whose parameters admit only ``fixed_args``: each argument a one-value enum, which a
    JSON-schema-guided sampler can produce in one way only."""
    fields: dict[str, Any] = {name: (Literal[value], ...) for name, value in fixed_args.items()}  # type: ignore[valid-type]
    frozen = create_model(f"{tool['function']['name'].title()}FrozenArgs", **fields)
    locked = copy.deepcopy(tool)
    locked["function"]["parameters"] = frozen.model_json_schema()
    return locked


def get_guided_completion_params(
    completion: ChatCompletion, base_tools: Iterable[ChatCompletionToolParam] | None = None
) -> GuidedParams:
    """What makes a student reply as ``completion`` (a teacher's) did: ``([content], None, None)`` for a text
    reply; ``(None, tool_choice forcing the tool, [the tool frozen to the teacher's arguments])`` for a reply
    whose first tool call names one of ``base_tools``."""
    message = completion.choices[0].message
    if not message.tool_calls:
        return [message.content], None, None
    call = message.tool_calls[0]
    if call.type != "function":
        raise ValueError(f"only function tool calls can guide a student, not {call.type!r}")
    if base_tools is None:
        raise ValueError("the teacher called a tool: pass base_tools, the tools it was given")
    name = call.function.name
    tool = next((t for t in base_tools if t["function"]["name"] == name), None)
    if tool is None:
        raise ValueError(f"the teacher called {name!r}, which is not among base_tools")
    tool_choice = {"type": "function", "function": {"name": name}}
    return None, tool_choice, [freeze_tool_schema(tool, json.loads(call.function.arguments))]


__all__ = ["freeze_tool_schema", "get_guided_completion_params"]
