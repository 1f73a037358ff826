"""Every HTTP path but ``/health`` wants the server's API key: our CPU server's rule, and vLLM's with it.

vLLM 0.32's own key (``VLLM_API_KEY``) guards only paths under ``/v1``, ``/v2``, ``/inference`` and ``/cohere``:
``/invocations`` (SageMaker's route, which generates), ``/tokenize``, ``/detokenize``, ``/pooling``, ``/score``,
``/rerank``, ``/metrics``, ``/version``, ``/ping`` and the rest answer without it. The launcher passes
``--middleware dgrpo_key_guard.require_api_key`` with this directory on vLLM's import path (this module alone,
so none of ours can shadow one of vLLM's), and our server uses the same check. Standard library and Starlette
only: it runs inside vLLM's own environment.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Awaitable, Callable
from typing import Any

OPEN_PATHS = frozenset({"/health"})
"""The only paths a server with an API key answers without it (launchers and probes poll ``/health``)."""
KEY_ENV = "VLLM_API_KEY"
"""Where vLLM's process finds the key (the launcher sets it from ``DGRPO_SERVE_API_KEY``)."""


def authorized(authorization: str, api_key: str) -> bool:
    """True when an ``Authorization`` header is ``Bearer <api_key>`` (compared in constant time)."""
    scheme, _, token = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), api_key.encode())


def refusal() -> dict[str, Any]:
    """The 401 body (OpenAI's error shape)."""
    return {
        "error": {
            "message": "missing or wrong API key: send 'Authorization: Bearer <the server's API key>'",
            "type": "AuthenticationError",
            "param": None,
            "code": 401,
        }
    }


async def require_api_key(request: Any, call_next: Callable[[Any], Awaitable[Any]]) -> Any:
    """vLLM's ``--middleware``: refuse (401) a request for any path but ``/health`` without the key."""
    from starlette.responses import JSONResponse

    api_key = os.environ.get(KEY_ENV)
    if (
        api_key
        and request.method != "OPTIONS"
        and request.url.path not in OPEN_PATHS
        and not authorized(request.headers.get("authorization", ""), api_key)
    ):
        return JSONResponse(refusal(), status_code=401)
    return await call_next(request)


def require_key(app: Any, api_key: str | None, open_paths: frozenset[str] = OPEN_PATHS) -> None:
    """Refuse (401) a request to Starlette/FastAPI ``app`` for any path outside ``open_paths`` without ``api_key``;
    no key: nothing to check. Our CPU server's guard and ``dgrpo art-server``'s."""
    if api_key is None:
        return
    key = api_key

    @app.middleware("http")
    async def _require_api_key(request: Any, call_next: Callable[[Any], Awaitable[Any]]) -> Any:
        from starlette.responses import JSONResponse

        if request.url.path not in open_paths and not authorized(
            request.headers.get("authorization", ""), key
        ):
            return JSONResponse(refusal(), status_code=401)
        return await call_next(request)
