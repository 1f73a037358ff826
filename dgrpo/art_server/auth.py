"""The server's API key on both listeners, checked as our inference server checks its own (serving/vllm_plugin/
dgrpo_key_guard.py): every path but the health checks wants ``Authorization: Bearer <key>``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from serving.vllm_plugin.dgrpo_key_guard import authorized, refusal


def require_key(app: FastAPI, api_key: str | None, open_paths: frozenset[str]) -> None:
    """Refuse (401) a request for any path outside ``open_paths`` without ``api_key``; no key: nothing to check."""
    if api_key is None:
        return
    key = api_key

    @app.middleware("http")
    async def _require_api_key(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        if request.url.path not in open_paths and not authorized(
            request.headers.get("authorization", ""), key
        ):
            return JSONResponse(refusal(), status_code=401)
        return await call_next(request)
