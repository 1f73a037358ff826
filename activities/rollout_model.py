"""The ``model`` a user's rollout function receives, in ART's shape, and the client-side routing behind it.

A rollout function asks for ``model=model.name``; the server only knows the served names (the base
model's, or an adapter's ``<run id>@<step>``). ``routed_openai_client`` closes that gap on the client
side, in an httpx transport, so the very same rollout function runs in the ART-style client loop and in
the workflow's rollouts activity:

- a chat/completions request whose ``model`` is ``name`` is sent as ``target_model`` (a fixed served
  name, or a callable returning the newest one);
- ``logprobs: true`` and ``return_token_ids: true`` (vLLM's switch) are added unless the caller set them,
  because training needs the sampled tokens and their logprobs;
- a response's top-level ``prompt_token_ids`` (vLLM puts them there) is copied into every choice, so
  appending ``completion.choices[0]`` to a trajectory keeps the exact prompt tokens too.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from openai import AsyncOpenAI

from serving.client import ServingClient, serving_api_key

try:  # openai >= 3 sends through httpx2 (httpx's successor); older versions through httpx
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx  # type: ignore[no-redef]

log = logging.getLogger(__name__)

ROUTED_PATHS = ("/chat/completions", "/completions")
"""Endpoints whose JSON body is routed (their path ends with one of these)."""
DEFAULT_API_KEY = "dgrpo"
"""Sent when the operator set no server key (``$DGRPO_SERVE_API_KEY``): the openai SDK insists on one."""

TargetModel = str | Callable[[], str]
"""A served model name, or a callable returning the one to use now (the newest step)."""


def _resolve(target: TargetModel) -> str:
    return target() if callable(target) else target


STRUCTURED = {
    "guided_choice": "choice",
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_grammar": "grammar",
}
"""vLLM's removed ``guided_*`` request fields -> the ``structured_outputs`` keys that replaced them."""


def route_request_body(
    body: dict[str, Any], path: str, name: str, target_model: TargetModel, chat_template: str | None = None
) -> dict[str, Any]:
    """The request body as the server must see it: model routed (a chat with the run's own ``chat_template``,
    unless the request brings one), logprobs and token ids asked for, and ``guided_*`` fields (ART's self-play
    sends ``guided_choice``) as vLLM's ``structured_outputs``."""
    out = dict(body)
    guided = {STRUCTURED[k]: out.pop(k) for k in list(out) if k in STRUCTURED}
    guided = {k: v for k, v in guided.items() if v is not None}
    if guided:  # vLLM >= 0.11 ignores the old fields: ask as it honours (dgrpo's CPU server refuses both)
        out["structured_outputs"] = {**guided, **(out.get("structured_outputs") or {})}
    routed = out.get("model") == name
    if routed:
        out["model"] = _resolve(target_model)
    if path.endswith("/chat/completions"):
        if routed and chat_template is not None:
            out.setdefault("chat_template", chat_template)
        out.setdefault("logprobs", True)
    else:  # legacy completions: logprobs is the number of top alternatives; 0 still returns the sampled ones
        out.setdefault("logprobs", 0)
    out.setdefault("return_token_ids", True)
    return out


def lift_prompt_token_ids(payload: dict[str, Any]) -> dict[str, Any]:
    """Copy a response's top-level ``prompt_token_ids`` into each choice that lacks its own."""
    prompt_ids = payload.get("prompt_token_ids")
    choices = payload.get("choices")
    if prompt_ids is None or not isinstance(choices, list):
        return payload
    for choice in choices:
        if isinstance(choice, dict) and choice.get("prompt_token_ids") is None:
            choice["prompt_token_ids"] = prompt_ids
    return payload


class RoutingTransport(httpx.AsyncBaseTransport):
    """An httpx transport that routes ``model=name`` to a served model and keeps what training needs."""

    def __init__(
        self,
        name: str,
        target_model: TargetModel,
        inner: httpx.AsyncBaseTransport | None = None,
        chat_template: str | None = None,
    ) -> None:
        self.name = name
        self.target_model = target_model
        self.inner = inner or httpx.AsyncHTTPTransport()
        self.chat_template = chat_template

    def _routed(self, request: httpx.Request) -> bool:
        return request.method == "POST" and request.url.path.endswith(ROUTED_PATHS)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if not self._routed(request):
            return await self.inner.handle_async_request(request)
        body = json.loads(await request.aread() or b"{}")
        streaming = bool(body.get("stream"))
        routed = route_request_body(body, request.url.path, self.name, self.target_model, self.chat_template)
        content = json.dumps(routed).encode()
        headers = [(k, v) for k, v in request.headers.multi_items() if k.lower() != "content-length"]
        new_request = httpx.Request(
            request.method,
            request.url,
            headers=[*headers, ("content-length", str(len(content)))],
            content=content,
            extensions=request.extensions,
        )
        response = await self.inner.handle_async_request(new_request)
        if streaming or response.status_code != 200:
            return response
        raw = await response.aread()
        await response.aclose()
        try:
            payload = json.loads(raw)
        except ValueError:
            return httpx.Response(response.status_code, headers=response.headers, content=raw)
        if isinstance(payload, dict):
            payload = lift_prompt_token_ids(payload)
        content = json.dumps(payload).encode()
        headers = [
            (k, v)
            for k, v in response.headers.multi_items()
            if k.lower() not in ("content-length", "content-encoding", "transfer-encoding")
        ]
        return httpx.Response(
            response.status_code,
            headers=[*headers, ("content-length", str(len(content)))],
            content=content,
            extensions={k: v for k, v in response.extensions.items() if k != "network_stream"},
        )

    async def aclose(self) -> None:
        await self.inner.aclose()


def routed_openai_client(
    base_url: str,
    name: str,
    target_model: TargetModel,
    api_key: str = DEFAULT_API_KEY,
    *,
    timeout: float = 600.0,
    max_connections: int = 256,
    max_retries: int = 2,
    chat_template: str | None = None,
) -> AsyncOpenAI:
    """An ``AsyncOpenAI`` on ``base_url`` (``http://host:port/v1``) whose ``model=name`` means ``target_model``
    (rendered with ``chat_template`` when given)."""
    http_client = routed_http_client(
        name, target_model, timeout=timeout, max_connections=max_connections, chat_template=chat_template
    )
    return AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http_client, max_retries=max_retries)


def routed_http_client(
    name: str,
    target_model: TargetModel,
    *,
    timeout: float = 600.0,
    max_connections: int = 256,
    chat_template: str | None = None,
) -> httpx.AsyncClient:
    """The HTTP client of ``routed_openai_client``: requests naming ``model=name`` go to ``target_model``."""
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=min(64, max_connections))
    transport = RoutingTransport(name, target_model, httpx.AsyncHTTPTransport(limits=limits), chat_template)
    return httpx.AsyncClient(transport=transport, timeout=timeout)


@dataclass
class RolloutModel:
    """What ``async def rollout(model, scenario)`` gets as ``model`` (ART's ``art.Model`` shape)."""

    name: str
    """The trainable model's name: pass it as ``model=`` in requests."""
    inference_base_url: str
    """The OpenAI-compatible base URL (ending in ``/v1``) of the inference server."""
    served_model: str
    """The served name requests are routed to: ``<run id>@<step>`` or the base model's served name."""
    step: int = 0
    """The policy step whose adapter answers (0: the base model or the starting adapter)."""
    base_model: str = ""
    """The base model, as the run spec names it."""
    project: str = "default"
    api_key: str = DEFAULT_API_KEY
    chat_template: str | None = None
    """The run's own chat template (``ModelSpec.chat_template``): sent with each chat of ``model=name``."""
    _client: AsyncOpenAI | None = field(default=None, repr=False)

    def openai_client(self) -> AsyncOpenAI:
        """An ``AsyncOpenAI`` (shared by every call) whose ``model=self.name`` is routed to ``served_model``."""
        if self._client is None:
            self._client = routed_openai_client(
                self.inference_base_url,
                self.name,
                self.served_model,
                api_key=self.api_key,
                chat_template=self.chat_template,
            )
        return self._client

    def get_inference_name(self) -> str:
        """The served name this model's requests are answered by (ART has the same method)."""
        return self.served_model

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None


def own_server_api_key() -> str:
    """The key for the operator's own inference server: ``$DGRPO_SERVE_API_KEY``, else a placeholder."""
    return serving_api_key() or DEFAULT_API_KEY


async def discover_base_model(
    base_url: str, request_timeout_s: float = 10.0, api_key: str | None = None
) -> str:
    """The served name of the base model on an OpenAI-compatible server (``/v1/models``, no ``parent``)."""
    return await ServingClient(base_url, timeout_s=request_timeout_s, api_key=api_key).base_model()
