"""A streamed chat completion (``stream=True``) inside ``capture_auto_trajectory`` is recorded as the choice the
same call returns unstreamed (``dgrpo/capture/chat_stream.py``), whichever client reads the stream and however.

The server here streams a completion as vLLM does (``data:`` events of ``chat.completion.chunk``s: text and
tool-call arguments in pieces, logprobs and ``token_ids`` per chunk, ``prompt_token_ids`` first, a usage-only
chunk, ``[DONE]``): dgrpo's CPU server does not stream (``test_capture.py`` checks that its refusal is no turn),
vLLM does, on a GPU.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import openai
import pytest_asyncio
from aiohttp import web
from openai.types.chat.chat_completion import Choice as OpenAIChoice

import dgrpo as art
from dgrpo.capture.chat_stream import streamed_choice
from schemas.trajectory import Choice

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


def token(text: str, logprob: float) -> dict[str, Any]:
    return {"token": text, "bytes": list(text.encode()), "logprob": logprob, "top_logprobs": []}


TOKENS = [("Let", -0.1), (" me", -0.2), (" look", -0.3), ('{"q"', -0.4), (': "x"}', -0.5)]
COMPLETION: dict[str, Any] = {
    "index": 0,
    "finish_reason": "tool_calls",
    "message": {
        "role": "assistant",
        "content": "Let me look",
        "reasoning_content": "The user wants x.",
        "tool_calls": [
            {"id": "call-1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}
        ],
    },
    "logprobs": {"content": [token(t, lp) for t, lp in TOKENS], "refusal": None},
    "token_ids": [11, 12, 13, 14, 15],
    "prompt_token_ids": [1, 2, 3],
}


def sse(completion: dict[str, Any]) -> bytes:
    """``completion`` streamed as vLLM streams it, one token a chunk (CRLF line ends, as some servers send)."""
    head = {"id": "c-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    message, logprobs = completion["message"], completion["logprobs"]["content"]

    def event(delta: dict[str, Any], **choice: Any) -> str:
        return (
            "data: " + json.dumps({**head, "choices": [{"index": 0, "delta": delta, **choice}]}) + "\r\n\r\n"
        )

    call = message["tool_calls"][0]
    events = [
        event({"role": "assistant", "content": ""}, prompt_token_ids=completion["prompt_token_ids"]),
        event({"reasoning_content": message["reasoning_content"]}),
        event({"content": "Let"}, logprobs={"content": logprobs[0:1]}, token_ids=[11]),
        event({"content": " me"}, logprobs={"content": logprobs[1:2]}, token_ids=[12]),
        event({"content": " look"}, logprobs={"content": logprobs[2:3]}, token_ids=[13]),
        # The call's id and name come again with its second piece, as vLLM's tool parsers may send them.
        event(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": "lookup", "arguments": '{"q"'},
                    }
                ]
            },
            logprobs={"content": logprobs[3:4]},
            token_ids=[14],
        ),
        event(
            {
                "tool_calls": [
                    {"index": 0, "id": call["id"], "function": {"name": "lookup", "arguments": ': "x"}'}}
                ]
            },
            logprobs={"content": logprobs[4:5]},
            token_ids=[15],
            finish_reason="tool_calls",
        ),
        # Another choice's chunk (n=2) and the usage-only chunk: neither is choice 0.
        "data: "
        + json.dumps({**head, "choices": [{"index": 1, "delta": {"content": "other"}}]})
        + "\r\n\r\n",
        "data: " + json.dumps({**head, "choices": [], "usage": {"prompt_tokens": 3}}) + "\r\n\r\n",
        "data: [DONE]\r\n\r\n",
    ]
    return "".join(events).encode()


def test_a_stream_is_the_choice_the_call_returns_unstreamed() -> None:
    assert streamed_choice(sse(COMPLETION)) == OpenAIChoice.model_validate(COMPLETION)
    trained = Choice.model_validate(streamed_choice(sse(COMPLETION)))
    assert (trained.token_ids, trained.prompt_token_ids) == ([11, 12, 13, 14, 15], [1, 2, 3])
    assert trained.sampled_logprobs() == [lp for _, lp in TOKENS]
    # Nothing streamed of choice 0: no choice; no finish_reason sent: "stop".
    assert streamed_choice(b"data: [DONE]\n\n") is None
    text_only = b'data: {"choices": [{"index": 0, "delta": {"content": "Hi"}}]}\n\n'
    assert streamed_choice(text_only) == OpenAIChoice.model_validate(
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Hi"}}
    )


@pytest_asyncio.fixture
async def server() -> AsyncIterator[str]:
    """Streams ``COMPLETION`` in small writes for ``stream: true``; refuses (400) a request asking so."""

    async def chat_completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("user") == "refuse":
            return web.json_response({"error": {"message": "no"}}, status=400)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        data = sse(COMPLETION)
        for start in range(0, len(data), 97):  # pieces that cut events apart
            await response.write(data[start : start + 97])
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat_completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()


USER = {"role": "user", "content": "Find x."}


async def test_streamed_calls_are_recorded_whichever_client_reads_them(server: str) -> None:
    async_client = openai.AsyncOpenAI(base_url=server, api_key="x")
    sync_client = openai.OpenAI(base_url=server, api_key="x")
    recorded_before_return: list[int] = []

    async def rollout() -> None:
        # openai's stream stops reading at [DONE] and closes the response itself.
        async for _ in await async_client.chat.completions.create(
            model="m",
            messages=[USER],
            tools=TOOLS,
            stream=True,  # type: ignore[list-item]
        ):
            pass
        recorded_before_return.append(len(art.auto_trajectory(required=True).choices()))

        # The sync client in a thread (the rollout's context goes with it), without tools: another history.
        def read_sync() -> None:
            for _ in sync_client.chat.completions.create(model="m", messages=[USER], stream=True):  # type: ignore[list-item]
                pass

        await asyncio.to_thread(read_sync)
        # Raw httpx reading the stream to its end, then closing: a third history (other tools).
        async with httpx2.AsyncClient() as raw:
            request = {"model": "m", "messages": [USER], "tools": TOOLS * 2, "stream": True}
            async with raw.stream("POST", f"{server}/chat/completions", json=request) as response:
                async for _ in response.aiter_bytes(50):
                    pass
        # A refused call is no turn.
        try:
            await async_client.chat.completions.create(model="m", messages=[USER], stream=True, user="refuse")  # type: ignore[list-item]
        except openai.BadRequestError:
            pass

    traj = await art.capture_auto_trajectory(rollout())

    expected = OpenAIChoice.model_validate(COMPLETION)
    assert recorded_before_return == [1]
    assert traj.messages_and_choices == [USER, expected] and traj.tools == TOOLS
    assert [(h.messages_and_choices, h.tools) for h in traj.additional_histories] == [
        ([USER, expected], None),
        ([USER, expected], TOOLS * 2),
    ]
    assert traj.choices()[0].token_ids == COMPLETION["token_ids"]
