"""A loopback HTTP listener that records every request it gets and answers like an OpenAI-compatible server.

It stands in for three hosts in the bad-input table: the operator's own inference server (the seam the
real CPU server fills in tests/workers), a judge endpoint the operator allowed, and an attacker's host
that must never be called. Replies: ``/v1/models`` lists one base model; chat completions get a
well-formed RULER answer scoring every trajectory 0.5.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

BASE_MODEL = "recorder-base"


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    """Lower-cased names."""
    body: bytes


@dataclass
class Recorder:
    base_url: str = ""
    """``http://127.0.0.1:<port>/v1``."""
    requests: list[Recorded] = field(default_factory=list)

    def seen(self, secret: str) -> bool:
        """True when ``secret`` appears in any recorded request (headers, path or body)."""
        return any(
            secret in r.path or secret in json.dumps(r.headers) or secret.encode() in r.body
            for r in self.requests
        )


def ruler_reply(body: dict[str, Any]) -> str:
    prompt = " ".join(str(m.get("content")) for m in body.get("messages", []))
    ids = re.findall(r'<trajectory id="(\d+)">', prompt)
    return json.dumps({"scores": [{"trajectory_id": i, "explanation": "ok", "score": 0.5} for i in ids]})


@contextmanager
def recorder() -> Iterator[Recorder]:
    state = Recorder()
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _record(self) -> bytes:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            with lock:
                state.requests.append(
                    Recorded(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                )
            return body

        def _send(self, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._record()
            self._send({"object": "list", "data": [{"id": BASE_MODEL, "object": "model", "parent": None}]})

        def do_POST(self) -> None:
            body = json.loads(self._record() or b"{}")
            message = {"role": "assistant", "content": ruler_reply(body)}
            choice = {"index": 0, "finish_reason": "stop", "message": message}
            self._send(
                {
                    "id": "c1",
                    "object": "chat.completion",
                    "created": 0,
                    "model": BASE_MODEL,
                    "choices": [choice],
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
