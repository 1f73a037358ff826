"""The OpenAI-compatible endpoint of ``dgrpo art-server``: each registered model's newest step under the model's
own name, as ART's vLLM serves it, in front of the backend's inference server (our CPU engine or vLLM alike).

A request whose ``model`` is a registered model's ``name`` goes to its newest served step, ``<name>@<step>`` to
that step (ART's names); any other name (the base model's, ``<run id>@<step>``) goes through unchanged. A routed
request asks for what training needs, as dgrpo's own client does (``activities/rollout_model.py``: logprobs, the
sampled token ids) and as ART's server is configured (logprob tokens as ``token_id:<n>``, so a client that keeps
only the logprobs, as NeMo Agent Toolkit does, still has the exact tokens). The response's ``model`` names the
served step that answered.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask

from activities.rollout_model import route_request_body
from dgrpo.art_server.models import AmbiguousModelName, ServedModels
from serving.api import error_body
from serving.client import ServingClient, auth_headers, openai_base_url
from serving.vllm_plugin.dgrpo_key_guard import require_key

OPEN_PATHS = frozenset({"/health"})
ROUTED = ("/v1/chat/completions", "/v1/completions")
UPSTREAM_TIMEOUT = httpx.Timeout(connect=10.0, read=None, write=60.0, pool=None)
"""A generation takes as long as it takes (the client sets its own limit); connecting does not."""


def openai_app(models: ServedModels, upstream_key: str | None, api_key: str | None) -> FastAPI:
    """The endpoint over ``models``, forwarding to the backend's inference server with ``upstream_key``."""
    client = httpx.AsyncClient(timeout=UPSTREAM_TIMEOUT)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await client.aclose()

    app = FastAPI(title="dgrpo art-server: OpenAI-compatible endpoint", lifespan=lifespan)
    require_key(app, api_key, OPEN_PATHS)

    def upstream() -> str:
        return openai_base_url(models.backend.inference_url())

    @app.get("/health")
    async def health() -> Response:
        healthy = await ServingClient(upstream(), api_key=upstream_key).health()
        return Response(status_code=200 if healthy else 503)

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        served = await ServingClient(upstream(), api_key=upstream_key).models()
        return {"object": "list", "data": served + model_cards(models, served)}

    async def forward(request: Request) -> Response:
        try:
            body = json.loads(await request.body() or b"{}")
        except ValueError:
            return JSONResponse(error_body(400, "the request body is not JSON"), status_code=400)
        if not isinstance(body, dict):
            return JSONResponse(error_body(400, "the request body is not a JSON object"), status_code=400)
        requested = body.get("model")
        try:
            served = models.served_name(requested) if isinstance(requested, str) else None
        except AmbiguousModelName as err:
            return JSONResponse(error_body(409, str(err), "model"), status_code=409)
        if served is not None:
            body = route_request_body(body, request.url.path, str(requested), served)
            body.setdefault("return_tokens_as_token_ids", True)
        sent = client.build_request(
            "POST",
            upstream() + request.url.path.removeprefix("/v1"),
            json=body,
            headers=auth_headers(upstream_key),
        )
        try:
            answer = await client.send(sent, stream=True)
        except httpx.HTTPError as err:
            message = f"the inference server behind this endpoint did not answer: {type(err).__name__}: {err}"
            return JSONResponse(error_body(503, message), status_code=503)
        return StreamingResponse(
            answer.aiter_raw(),
            status_code=answer.status_code,
            media_type=answer.headers.get("content-type"),
            background=BackgroundTask(answer.aclose),
        )

    for path in ROUTED:
        app.post(path)(forward)
    return app


def model_cards(models: ServedModels, served: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``/v1/models`` entries for each registered model: its ``name`` (the newest step) and ``<name>@<step>``
    for each of its steps the server holds, each with the served name it stands for as ``parent``."""
    ids = {str(card.get("id")) for card in served}
    cards = []
    for model in models:
        aliases = {model.name: model.get_inference_name()}
        prefix = f"{model.run_id}@"
        for served_id in sorted(ids):
            if served_id.startswith(prefix) and served_id[len(prefix) :].isdigit():
                aliases[f"{model.name}@{served_id[len(prefix) :]}"] = served_id
        for alias, target in aliases.items():
            cards.append({"id": alias, "object": "model", "owned_by": "dgrpo", "root": model.base_model,
                          "parent": target})  # fmt: skip
    return cards
