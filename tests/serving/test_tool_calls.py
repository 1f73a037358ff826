"""Tool calls out of completions and tools into prompts (Hermes / SmolLM2 / Qwen ``<tool_call>`` style)."""

from __future__ import annotations

import json

from serving.tool_calls import parse_tool_calls, prepare_messages


def test_one_call_becomes_an_openai_tool_call() -> None:
    content, calls = parse_tool_calls(
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    )
    assert content is None
    assert len(calls) == 1 and calls[0]["type"] == "function" and calls[0]["id"].startswith("chatcmpl-tool-")
    assert calls[0]["function"]["name"] == "get_weather"
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}


def test_several_calls_with_text_around_them() -> None:
    text = (
        'Let me check.\n<tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call>\n'
        '<tool_call>{"name": "b", "parameters": {"y": [2]}}</tool_call>'
    )
    content, calls = parse_tool_calls(text)
    assert content == "Let me check."
    assert [c["function"]["name"] for c in calls] == ["a", "b"]
    assert json.loads(calls[1]["function"]["arguments"]) == {"y": [2]}
    assert len({c["id"] for c in calls}) == 2


def test_an_unclosed_call_at_eos_still_counts() -> None:
    _, calls = parse_tool_calls('<tool_call>\n{"name": "finish", "arguments": {}}')
    assert [c["function"]["name"] for c in calls] == ["finish"]
    assert calls[0]["function"]["arguments"] == "{}"


def test_string_arguments_are_kept_as_written() -> None:
    _, calls = parse_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>')
    assert calls[0]["function"]["arguments"] == '{"a": 1}'


def test_malformed_calls_leave_the_text_alone() -> None:
    for text in (
        "no calls here",
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>["name", "f"]</tool_call>',
    ):
        assert parse_tool_calls(text) == (text, [])


def test_tools_go_into_the_system_prompt_when_the_template_ignores_them() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    messages, native = prepare_messages([{"role": "user", "content": "hi"}], tools, template="{{ messages }}")
    assert not native
    assert messages[0]["role"] == "system" and "<tools>" in messages[0]["content"]
    assert json.dumps(tools[0]) in messages[0]["content"]
    with_system, _ = prepare_messages(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}], tools, template=""
    )
    assert with_system[0]["content"].startswith("Be brief.\n\n") and len(with_system) == 2


def test_a_tool_aware_template_gets_tools_and_messages_as_they_are() -> None:
    call = {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "ok"},
    ]
    out, native = prepare_messages(
        messages, [{"type": "function"}], template="{% if tools %}{{ tool_calls }}"
    )
    assert native
    assert out == [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "ok"},
    ]


def test_history_is_written_hermes_style_for_a_plain_template() -> None:
    call = {"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    messages = [
        {"role": "assistant", "content": "Calling.", "tool_calls": [call]},
        {"role": "tool", "content": [{"type": "text", "text": "42"}]},
    ]
    out, _ = prepare_messages(messages, None, template="")
    assert out[0] == {
        "role": "assistant",
        "content": 'Calling.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>',
    }
    assert out[1] == {"role": "tool", "content": "<tool_response>\n42\n</tool_response>"}
