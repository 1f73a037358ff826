"""The CPU serving engine's HTTP server: vLLM's OpenAI-compatible API on transformers + peft.

``python -m serving.server --model smollm2-135m-instruct --port 8000`` (or ``dgrpo serve``) serves
``/v1/chat/completions``, ``/v1/models``, ``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``, ``/health``,
``/sleep``, ``/wake_up`` and ``/is_sleeping``. The request's ``model`` is the served base name or a loaded
adapter's name. A request holds a lease on its adapter until it is answered; unloading waits for the
leases to end, and new requests for an adapter being unloaded get 404.

When ``--model`` is a LoRA adapter directory, its base (``base_model_name_or_path``) is served under
``--served-name`` (default: that base string) and the adapter is loaded at start under
``--start-adapter-name`` (default ``<adapter dir name>@0``).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import ValidationError

from base_models.resolve import resolve_base_model
from host.cpu_share import CpuShare
from schemas.errors import DgrpoError
from serving.api import (
    ChatCompletionRequest,
    LoadLoraAdapterRequest,
    ServingHTTPError,
    UnloadLoraAdapterRequest,
    error_body,
)
from serving.batcher import GenerationEngine, GenerationRequest
from serving.chat import ChatRenderer
from serving.options import ServerOptions, add_arguments, options_from_args
from serving.tool_calls import parse_tool_calls
from serving.vllm_plugin.dgrpo_key_guard import require_key

log = logging.getLogger(__name__)


class AdapterTable:
    """Loaded adapters and the leases in-flight requests hold on them (event-loop side)."""

    def __init__(self) -> None:
        self.paths: dict[str, str] = {}
        self.leases: Counter[str] = Counter()
        self.unloading: set[str] = set()
        self.changed = asyncio.Condition()
        self.lock = asyncio.Lock()
        """Serialises loads and unloads."""

    def acquire(self, name: str) -> None:
        if name not in self.paths or name in self.unloading:
            raise ServingHTTPError(404, f"The model `{name}` does not exist.", "model")
        self.leases[name] += 1

    async def release(self, name: str) -> None:
        async with self.changed:
            self.leases[name] -= 1
            if self.leases[name] <= 0:
                del self.leases[name]
                self.changed.notify_all()

    async def drained(self, name: str) -> None:
        """Return once no request holds ``name``."""
        async with self.changed:
            await self.changed.wait_for(lambda: self.leases[name] <= 0)


def verify_adapter_dir(path: str, sha256: dict[str, str] | None) -> None:
    """Refuse a path that is not a PEFT adapter dir, or whose files do not match ``sha256``."""
    root = Path(path)
    if not root.is_dir():
        raise ServingHTTPError(
            404, f"adapter path {path} does not exist (or is not a directory)", "lora_path"
        )
    if not (root / "adapter_config.json").is_file():
        raise ServingHTTPError(
            400, f"{path} holds no adapter_config.json: not a PEFT LoRA adapter", "lora_path"
        )
    for rel, expected in (sha256 or {}).items():
        file = root / rel
        if not file.is_file():
            raise ServingHTTPError(400, f"sha256 check: {file} is missing", "sha256")
        digest = hashlib.sha256()
        with open(file, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        if digest.hexdigest() != expected:
            raise ServingHTTPError(
                400,
                f"sha256 mismatch for {file}: expected {expected[:12]}…, got {digest.hexdigest()[:12]}…; "
                "the adapter is corrupt or was overwritten, refusing to load it",
                "sha256",
            )


def check_rank(path: str, max_rank: int | None) -> None:
    """Refuse (400) an adapter whose rank (or any ``rank_pattern`` rank) is above ``max_rank``."""
    if max_rank is None:
        return
    config = json.loads((Path(path) / "adapter_config.json").read_text())
    rank = max([int(config.get("r") or 0), *(int(r) for r in (config.get("rank_pattern") or {}).values())])
    if rank > max_rank:
        raise ServingHTTPError(
            400, f"LoRA rank {rank} of {path} is above this server's --max-lora-rank {max_rank}", "lora_path"
        )


def check_under_root(path: str, root: str) -> None:
    """Refuse (400) an adapter path that is not inside ``root`` once links and ``..`` are resolved."""
    resolved, base = Path(path).resolve(), Path(root).resolve()
    if not resolved.is_relative_to(base):
        raise ServingHTTPError(
            400,
            f"lora_path {path} is outside this server's adapter root {base}; adapters load only from under "
            "it: put the adapter there, or start the server with --adapter-root",
            "lora_path",
        )


async def _json_body(request: Request) -> Any:
    try:
        return await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ServingHTTPError(400, f"the request body is not valid JSON: {err}") from None


def _validate(model: type[Any], body: Any) -> Any:
    try:
        return model.model_validate(body)
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}"
            for e in err.errors(include_url=False)
        )
        first = err.errors()[0]["loc"] if err.error_count() else ()
        raise ServingHTTPError(
            400, f"invalid request: {problems}", str(first[0]) if first else None
        ) from None


def build_app(
    engine: GenerationEngine, served_name: str, options: ServerOptions, table: AdapterTable | None = None
) -> FastAPI:
    """The FastAPI app around a ``GenerationEngine``."""
    adapters = table or AdapterTable()
    renderer = ChatRenderer(
        engine.tokenizer,
        engine.max_model_len,
        options.default_max_tokens,
        options.trust_request_chat_template,
        vocab_size=engine.vocab_size,
        render_bound_s=options.render_timeout_s,
    )
    app = FastAPI(title="durable-grpo CPU serving engine")
    app.state.adapters = adapters

    @app.exception_handler(ServingHTTPError)
    async def _http_error(_: Request, err: ServingHTTPError) -> JSONResponse:
        return JSONResponse(error_body(err.status, err.message, err.param), status_code=err.status)

    @app.exception_handler(Exception)
    async def _internal_error(_: Request, err: Exception) -> JSONResponse:
        log.error("request failed: %s: %s", type(err).__name__, err)
        return JSONResponse(error_body(500, f"{type(err).__name__}: {err}"), status_code=500)

    require_key(app, options.api_key.get_secret_value() if options.api_key is not None else None)

    @app.get("/health")
    async def health() -> Response:
        # As vLLM's: an HTTP loop that answers over a dead engine is not a healthy server.
        return Response(status_code=200 if engine.alive() else 503)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        now = int(time.time())
        card = {"object": "model", "created": now, "owned_by": "dgrpo", "max_model_len": engine.max_model_len}
        data = [{**card, "id": served_name, "root": options.model, "parent": None}]
        data += [
            {**card, "id": n, "root": p, "parent": served_name, "in_flight": adapters.leases[n]}
            for n, p in adapters.paths.items()
        ]
        return {"object": "list", "data": data}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> dict[str, Any]:
        req: ChatCompletionRequest = _validate(ChatCompletionRequest, await _json_body(request))
        adapter = None if req.model == served_name else req.model
        # Rendering and tokenizing are CPU work (a request's own template can be slow): off the event loop,
        # which answers /health and every other request meanwhile, and bounded (--render-timeout-s).
        prompt_ids, params = await asyncio.to_thread(renderer.prepare, req)
        if adapter is not None:
            adapters.acquire(adapter)
        try:
            requests = [
                GenerationRequest(prompt_ids, adapter, renderer.params_for_choice(params, i))
                for i in range(req.n)
            ]
            completions = await engine.generate(requests)
        finally:
            if adapter is not None:
                await adapters.release(adapter)
        return await asyncio.to_thread(renderer.response, req, prompt_ids, completions, parse_tool_calls)

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> PlainTextResponse:
        req: LoadLoraAdapterRequest = _validate(LoadLoraAdapterRequest, await _json_body(request))
        name = req.lora_name
        if name == served_name:
            raise ServingHTTPError(
                400, f"{name!r} is the base model's name; pick another lora_name", "lora_name"
            )
        async with adapters.lock:
            if name in adapters.paths and not req.load_inplace:
                raise ServingHTTPError(
                    400, f"The lora adapter '{name}' has already been loaded.", "lora_name"
                )
            check_under_root(req.lora_path, options.adapter_root)
            await asyncio.to_thread(verify_adapter_dir, req.lora_path, req.sha256)
            check_rank(req.lora_path, options.max_lora_rank)
            if name in adapters.paths:
                adapters.unloading.add(name)
                await adapters.drained(name)
                await engine.control("unload", name)
                del adapters.paths[name]
                adapters.unloading.discard(name)
            try:
                await engine.control("load", name, req.lora_path)
            except Exception as err:
                raise ServingHTTPError(
                    400, f"loading adapter {name!r} from {req.lora_path} failed: {err}"
                ) from err
            adapters.paths[name] = req.lora_path
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: Request) -> PlainTextResponse:
        req: UnloadLoraAdapterRequest = _validate(UnloadLoraAdapterRequest, await _json_body(request))
        name = req.lora_name
        if name not in adapters.paths or name in adapters.unloading:
            raise ServingHTTPError(404, f"The lora adapter '{name}' cannot be found.", "lora_name")
        adapters.unloading.add(name)  # new requests for it are refused from here on
        try:
            await adapters.drained(name)
            async with adapters.lock:
                await engine.control("unload", name)
                adapters.paths.pop(name, None)
        finally:
            adapters.unloading.discard(name)
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")

    @app.post("/sleep")
    async def sleep(level: int = 1) -> Response:
        await engine.control("sleep")  # finishes in-flight rows; new ones wait for wake_up
        return Response(status_code=200)

    @app.post("/wake_up")
    async def wake_up() -> Response:
        await engine.control("wake_up")
        return Response(status_code=200)

    @app.get("/is_sleeping")
    async def is_sleeping() -> dict[str, bool]:
        return {"is_sleeping": bool(engine.sleeping)}

    return app


def create_server(options: ServerOptions) -> tuple[FastAPI, GenerationEngine]:
    """Load the model (and starting adapters) and build the app; returns ``(app, engine)``."""
    if options.threads:
        torch.set_num_threads(options.threads)
    resolved = resolve_base_model(options.model)
    served_name = options.served_name or options.model
    to_load = dict(options.lora_modules)
    if resolved.adapter_path is not None:
        config = json.loads((Path(resolved.adapter_path) / "adapter_config.json").read_text())
        served_name = options.served_name or str(config["base_model_name_or_path"])
        start_name = options.start_adapter_name or f"{Path(resolved.adapter_path).name}@0"
        to_load = {start_name: resolved.adapter_path, **to_load}
    engine = GenerationEngine(
        resolved.base_path,
        dtype=options.dtype,
        max_batch=options.max_batch,
        batch_window_s=options.batch_window_s,
        max_model_len=options.max_model_len,
        prefix_cache_bytes=options.prefix_cache_mb << 20,
        cpu_share=CpuShare.for_host(options.threads),
    )
    table = AdapterTable()
    for name, path in to_load.items():
        verify_adapter_dir(path, None)
        engine.command("load", name, path).result()
        table.paths[name] = path
    log.info("serving %s as %r with adapters %s", resolved.base_path, served_name, sorted(table.paths))
    return build_app(engine, served_name, options, table), engine


def serve(options: ServerOptions) -> None:
    """Run the server until interrupted (what ``dgrpo serve`` does)."""
    import uvicorn

    app, engine = create_server(options)
    try:
        uvicorn.run(app, host=options.host, port=options.port, log_level="warning", access_log=False)
    finally:
        engine.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m serving.server", description=__doc__.splitlines()[0])
    add_arguments(parser)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        serve(options_from_args(parser.parse_args(argv)))
    except DgrpoError as err:  # bad options, a model it cannot load or run: the reason, not a traceback
        log.error("%s", err)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
