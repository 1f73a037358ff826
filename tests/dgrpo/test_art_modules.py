"""ART's module paths that programs import, implemented here: ``art.guided_completion`` (a teacher's reply as
a student's guidance), ``art.openai`` (a streamed completion put back together), ``art.mcp`` (scenarios for an
MCP agent from any OpenAI-compatible model: the scripted stub here), and ``art.utils.deployment`` (its types
import; deploying is refused when called)."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from openai.types.chat.chat_completion import ChatCompletion
from openai.types.chat.chat_completion_chunk import ChatCompletionChunk

from dgrpo.errors import UnsupportedArtFeature
from dgrpo.guided_completion import get_guided_completion_params
from dgrpo.mcp import MCPResource, MCPTool, complete_task_tool, generate_scenarios
from dgrpo.openai import (
    IncompleteChatCompletionStreamError,
    consume_chat_completion_stream,
    consume_sync_chat_completion_stream,
)
from dgrpo.utils.deployment import TogetherDeploymentConfig, deploy_model

sys.path.insert(0, str(Path(__file__).parents[1] / "activities"))
from openai_stub import StubServer, openai_stub

MOVE_TOOL = {
    "type": "function",
    "function": {
        "name": "make_move",
        "parameters": {
            "type": "object",
            "properties": {"square": {"type": "string"}},
            "required": ["square"],
        },
    },
}


def teacher(message: dict[str, Any]) -> ChatCompletion:
    return ChatCompletion.model_validate(
        {
            "id": "t",
            "object": "chat.completion",
            "created": 0,
            "model": "teacher",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", **message}}],
        }
    )


def test_a_teachers_reply_becomes_the_students_guidance() -> None:
    assert get_guided_completion_params(teacher({"content": "B2"})) == (["B2"], None, None)
    call = {"id": "c", "type": "function", "function": {"name": "make_move", "arguments": '{"square": "C3"}'}}
    guided, tool_choice, tools = get_guided_completion_params(teacher({"tool_calls": [call]}), [MOVE_TOOL])  # type: ignore[list-item]
    assert guided is None and tool_choice == {"type": "function", "function": {"name": "make_move"}}
    assert tools is not None
    square = tools[0]["function"]["parameters"]["properties"]["square"]  # type: ignore[index]
    assert square.get("const", (square.get("enum") or [None])[0]) == "C3"  # only the teacher's argument
    assert MOVE_TOOL["function"]["parameters"]["properties"]["square"] == {"type": "string"}  # type: ignore[index]
    with pytest.raises(ValueError, match="base_tools"):
        get_guided_completion_params(teacher({"tool_calls": [call]}))


def chunk(index: int, finish: str | None = None, **delta: Any) -> ChatCompletionChunk:
    choice: dict[str, Any] = {"index": index, "delta": delta, "finish_reason": finish}
    if "token_ids" in delta:
        choice["token_ids"] = delta.pop("token_ids")
    if "logprob" in delta:
        token = delta.pop("logprob")
        choice["logprobs"] = {
            "content": [{"token": token, "logprob": -0.5, "bytes": None, "top_logprobs": []}]
        }
    return ChatCompletionChunk.model_validate(
        {"id": "s", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [choice]}
    )


STREAM = [
    chunk(0, role="assistant", content="Hel", logprob="Hel", token_ids=[1]),
    chunk(1, tool_calls=[{"index": 0, "id": "call_1", "type": "function", "function": {"name": "make_move", "arguments": '{"sq'}}]),
    chunk(0, content="lo", logprob="lo", token_ids=[2]),
    chunk(1, tool_calls=[{"index": 0, "function": {"arguments": 'uare": "A1"}'}}]),
    chunk(1, finish="tool_calls"),
    chunk(0, finish="stop"),
]  # fmt: skip


class Stream:
    """What ``consume_chat_completion_stream`` asks of the SDK's stream: chunks, and ``close``."""

    def __init__(self, chunks: list[ChatCompletionChunk]) -> None:
        self.chunks, self.closed = chunks, False

    async def __aiter__(self) -> AsyncIterator[ChatCompletionChunk]:
        for c in self.chunks:
            if self.closed:
                return
            yield c

    def __iter__(self) -> Iterator[ChatCompletionChunk]:
        return iter(self.chunks)

    async def close(self) -> None:
        self.closed = True


async def test_a_streamed_completion_is_put_back_together() -> None:
    completion = await consume_chat_completion_stream(Stream(STREAM))  # type: ignore[arg-type]
    text, tool = completion.choices
    token_ids = text.token_ids  # type: ignore[attr-defined]  # vLLM's, kept as an extra field
    assert (text.message.content, text.finish_reason, token_ids) == ("Hello", "stop", [1, 2])
    assert [t.token for t in text.logprobs.content or []] == ["Hel", "lo"]  # type: ignore[union-attr]
    [call] = tool.message.tool_calls or []
    assert (call.id, call.function.name, json.loads(call.function.arguments)) == (  # type: ignore[union-attr]
        "call_1",
        "make_move",
        {"square": "A1"},
    )
    assert consume_sync_chat_completion_stream(Stream(STREAM)).choices[0].message.content == "Hello"  # type: ignore[arg-type]


async def test_on_chunk_may_stop_a_stream_and_an_unfinished_stream_is_refused() -> None:
    seen: list[str] = []

    def stop_after_two(c: ChatCompletionChunk, so_far: ChatCompletion) -> None:
        seen.append(c.id)
        if len(seen) == 2:
            raise StopIteration

    stream = Stream(STREAM)
    early = await consume_chat_completion_stream(stream, on_chunk=stop_after_two)  # type: ignore[arg-type]
    assert stream.closed and len(seen) == 2 and early.choices[0].message.content == "Hel"
    with pytest.raises(IncompleteChatCompletionStreamError, match=r"choice\(s\) \[0, 1\]"):
        await consume_chat_completion_stream(Stream(STREAM[:3]))  # type: ignore[arg-type]
    with pytest.raises(IncompleteChatCompletionStreamError, match="no choices"):
        await consume_chat_completion_stream(Stream([]))  # type: ignore[arg-type]


@pytest.fixture
def stub() -> Iterator[StubServer]:
    with openai_stub() as server:
        yield server


async def test_mcp_scenarios_come_from_any_openai_compatible_model(stub: StubServer) -> None:
    scenarios = [{"task": f"Report the weather of city {i}", "difficulty": 1 + i % 5} for i in range(6)]
    stub.script = [json.dumps({"scenarios": scenarios})]
    tools = [MCPTool("get_weather", "The weather in a city", {"type": "object"}), complete_task_tool]
    resources = [
        MCPResource.from_dict(
            {"uri": "w://cities", "name": "cities", "description": "", "mimeType": "text/csv"}
        )
    ]
    collection = await generate_scenarios(
        tools, resources, num_scenarios=6, show_preview=False, generator_api_key="sk-test", generator_base_url=stub.base_url
    )  # fmt: skip
    [request] = stub.requests
    assert request["model"] == "openai/gpt-4.1-mini" and stub.keys == ["sk-test"]
    assert request["response_format"]["json_schema"]["schema"]["properties"]["scenarios"]["minItems"] == 6
    assert (
        "get_weather" in request["messages"][0]["content"] and "text/csv" in request["messages"][0]["content"]
    )
    train, val = collection.split(4)
    assert (len(train), len(val), len(collection.filter_by_difficulty(4, 5))) == (4, 2, 2)
    assert sorted(s.task for s in collection.shuffle()) == sorted(s["task"] for s in scenarios)
    stub.script = [json.dumps({"scenarios": scenarios[:2]})]
    with pytest.raises(ValueError, match="Expected 6 scenarios, got 2"):
        await generate_scenarios(
            tools, num_scenarios=6, generator_api_key="k", generator_base_url=stub.base_url
        )


async def test_deploying_is_refused_when_called_saying_what_to_use() -> None:
    config = TogetherDeploymentConfig(s3_bucket="b", wait_for_completion=True)
    with pytest.raises(UnsupportedArtFeature, match=r"_experimental_pull_model_checkpoint.*local_path"):
        await deploy_model(model=None, checkpoint_path="/x", step=3, provider="together", config=config)
