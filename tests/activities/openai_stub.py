"""A scripted OpenAI-compatible chat server: the seam where a real judge endpoint plugs in.

Replies come from ``script`` (a queue of strings) and, when it is empty, from a well-formed RULER
answer that scores 0.9 every trajectory containing "correct" and 0.1 the others. Every request is
recorded (body, path and the key it carried), so tests can count calls (cache, dedupe) and read what the
judge was asked. A POST to ``.../messages`` is answered as Anthropic's Messages API answers.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "stub-judge"


USAGE = {"prompt_tokens": 1000, "completion_tokens": 100, "total_tokens": 1100}
"""The tokens every reply reports, as a real server reports its own."""


@dataclass
class StubServer:
    base_url: str
    script: list[str] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    keys: list[str | None] = field(default_factory=list)
    """Each request's key: its bearer token, or Anthropic's ``x-api-key``."""
    reply: Callable[[dict[str, Any]], str] | None = None
    """Answers a request when ``script`` is empty (else ``default_reply``)."""

    @property
    def calls(self) -> int:
        return len(self.requests)


def default_reply(body: dict[str, Any]) -> str:
    prompt = next((str(m["content"]) for m in body["messages"] if "<trajectory" in str(m.get("content"))), "")
    blocks = re.findall(r'<trajectory id="(\d+)">(.*?)</trajectory>', prompt, flags=re.DOTALL)
    scores = [
        {"trajectory_id": tid, "explanation": "scripted", "score": 0.9 if "correct" in text else 0.1}
        for tid, text in blocks
    ]
    return json.dumps({"scores": scores})


def anthropic_message(body: dict[str, Any], content: str) -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": body.get("model", MODEL),
        "content": [{"type": "text", "text": content}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": USAGE["prompt_tokens"], "output_tokens": USAGE["completion_tokens"]},
    }


@contextmanager
def openai_stub() -> Iterator[StubServer]:
    state = StubServer(base_url="")
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._send({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "stub"}]})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            bearer = self.headers.get("authorization", "")
            with lock:
                state.requests.append(body)
                state.paths.append(self.path)
                state.keys.append(bearer.removeprefix("Bearer ") or self.headers.get("x-api-key"))
                content = state.script.pop(0) if state.script else (state.reply or default_reply)(body)
            if self.path.endswith("/messages"):
                self._send(anthropic_message(body, content))
                return
            extra = {"prompt_token_ids": [1, 2, 3]} if body.get("return_token_ids") else {}
            self._send(
                {
                    **extra,
                    "id": "c1",
                    "object": "chat.completion",
                    "created": 0,
                    "model": body.get("model", MODEL),
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": "stop",
                            "message": {"role": "assistant", "content": content},
                        }
                    ],
                    "usage": USAGE,
                }
            )

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
