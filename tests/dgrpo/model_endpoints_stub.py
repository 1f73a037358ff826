"""A model endpoint speaking the four protocols ART 0.5.23 captures, for the capture tests: Chat Completions,
Completions, Responses and Anthropic's Messages, each plainly or streamed (``"stream": true``), the stream in
pieces that cut its events apart. A request with ``"user": "fail"`` (Messages: ``metadata.user_id``) gets a
500; every reply names the model the request named, and says which call it answers (``reply <n>``)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web


def chat_completion(model: str, text: str) -> dict[str, Any]:
    return {
        "id": "chat-1",
        "object": "chat.completion",
        "created": 1,
        "model": model,
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": text},
                "token_ids": [7, 8],
                "prompt_token_ids": [1, 2, 3],
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }


def chat_stream(model: str, text: str) -> bytes:
    head = {"id": "chat-1", "object": "chat.completion.chunk", "created": 1, "model": model}
    pieces = [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "prompt_token_ids": [1, 2, 3]},
        {"index": 0, "delta": {"content": text[:3]}, "token_ids": [7]},
        {"index": 0, "delta": {"content": text[3:]}, "token_ids": [8], "finish_reason": "stop"},
    ]
    events = [{**head, "choices": [p]} for p in pieces]
    events.append(
        {**head, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}
    )
    return ("".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n").encode()


def completion(model: str, text: str) -> dict[str, Any]:
    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1,
        "model": model,
        "choices": [{"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}],
    }


def response(model: str, text: str) -> dict[str, Any]:
    return {
        "id": "resp-1",
        "object": "response",
        "created_at": 1,
        "model": model,
        "status": "completed",
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "tools": [],
        "output": [
            {
                "type": "message",
                "id": "msg-1",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
    }


def message(model: str, text: str) -> dict[str, Any]:
    return {
        "id": "msg-1",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 3, "output_tokens": 2},
    }


def message_stream(model: str, text: str) -> bytes:
    start = {**message(model, ""), "content": [], "stop_reason": None}
    events = [
        ("message_start", {"type": "message_start", "message": start}),
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ("ping", {"type": "ping"}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text[:3]}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text[3:]}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}}),
        ("message_stop", {"type": "message_stop"}),
    ]  # fmt: skip
    return "".join(f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in events).encode()


def response_stream(model: str, text: str) -> bytes:
    done = {"type": "response.completed", "response": response(model, text)}
    delta = {"type": "response.output_text.delta", "delta": text}
    return (
        f"event: response.output_text.delta\ndata: {json.dumps(delta)}\n\n"
        f"event: response.completed\ndata: {json.dumps(done)}\n\n"
    ).encode()


def completion_stream(model: str, text: str) -> bytes:
    head = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": model}
    events = [
        {**head, "choices": [{"index": 0, "text": text[:3], "finish_reason": None}]},
        {**head, "choices": [{"index": 0, "text": text[3:], "finish_reason": "stop"}]},
    ]
    return ("".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n").encode()


PLAIN = {
    "chat/completions": chat_completion,
    "completions": completion,
    "responses": response,
    "messages": message,
}
STREAMED = {
    "chat/completions": chat_stream,
    "completions": completion_stream,
    "responses": response_stream,
    "messages": message_stream,
}


async def serve() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """Serve on a free loopback port: yields the ``/v1`` base URL and the list of request bodies received."""
    received: list[dict[str, Any]] = []

    async def answer(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        received.append(body)
        user = body.get("user") or (body.get("metadata") or {}).get("user_id")
        if user == "fail":
            return web.json_response({"error": {"message": "failed on purpose"}}, status=500)
        path = request.match_info["path"]
        text = f"reply {len(received)}"
        if not body.get("stream"):
            return web.json_response(PLAIN[path](body["model"], text))
        streamed = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await streamed.prepare(request)
        data = STREAMED[path](body["model"], text)
        for start in range(0, len(data), 61):  # pieces that cut events apart
            await streamed.write(data[start : start + 61])
        await streamed.write_eof()
        return streamed

    app = web.Application()
    app.router.add_post("/v1/{path:chat/completions|completions|responses|messages}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1", received
    finally:
        await runner.cleanup()
