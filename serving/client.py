"""The async control client of a serving engine (ours or vLLM): health, models, adapters, sleep/wake.

The same calls work against both: they are vLLM's endpoints. Chat completions go through the ``openai``
SDK on ``client.openai_base_url`` instead. Each call opens its own short-lived HTTP connection, so one
client may be used from any event loop (a Temporal worker's, a test's).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping
from typing import Any

import httpx

from schemas.settings import ENV_SERVE_API_KEY

DEFAULT_TIMEOUT_S = 300.0
"""Unloading waits for the requests that use the adapter, so control calls get a long read timeout; it fits
inside the stages that make them (``workflows/stages.py``: reload 15 min, sleep/wake 10 min)."""
QUERY_TIMEOUT_S = 30.0
"""Calls that only read the server's state (models, adapters, is_sleeping) answer at once on a live server."""
LOAD_TIMEOUT_S = 120.0
"""Loading a new adapter waits for no request (replacing one in place waits like an unload): a rank-64 adapter
of an 8B model loads in seconds. vLLM's CPU build once took a load and never answered it (its engine idle);
this bound turns that into an error the reload activity retries, not a 5-minute stall."""
NO_ANSWER = 504
"""``ServingError.status`` of a control call the server took and did not answer in time (a gateway timeout):
5xx, so the activities that make the call retry it."""
PROBE_TIMEOUT_S = 5.0
"""``/health``: a server that does not answer within this is not answering."""


class ServingError(RuntimeError):
    """The server answered a control call with an error status, or (``NO_ANSWER``) did not answer in time."""

    def __init__(self, url: str, status: int, message: str) -> None:
        super().__init__(f"{url}: HTTP {status}: {message}")
        self.url = url
        self.status = status
        self.message = message


def serving_api_key(env: Mapping[str, str] | None = None) -> str | None:
    """The inference server's API key from the operator's environment (``$DGRPO_SERVE_API_KEY``), if set."""
    e = os.environ if env is None else env
    return e.get(ENV_SERVE_API_KEY) or None


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The ``Authorization: Bearer`` header a server started with ``--api-key`` wants (none without a key)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def tls_verify(url: str) -> bool:
    """httpx's ``verify`` for ``url``: a plain ``http://`` URL has no certificate to check, and a client made
    without loading the CA bundle costs ~1 ms instead of ~80 ms (each call makes one)."""
    return not url.startswith("http://")


def server_root(url: str) -> str:
    """``http://host:port`` from ``http://host:port``, ``.../`` or ``.../v1``."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def openai_base_url(url: str) -> str:
    """``http://host:port`` or ``http://host:port/v1`` -> the ``/v1`` base URL the openai SDK wants."""
    return server_root(url) + "/v1"


def _message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message", body))
    if isinstance(body, dict) and "message" in body:
        return str(body["message"])
    return str(body)


class ServingClient:
    """Talks to one server at ``url`` (``http://host:port``, with or without ``/v1``).

    ``api_key`` is sent as a Bearer token; default ``$DGRPO_SERVE_API_KEY`` (none when unset).
    """

    def __init__(self, url: str, timeout_s: float = DEFAULT_TIMEOUT_S, api_key: str | None = None) -> None:
        self.base_url = server_root(url)
        self.timeout_s = timeout_s
        self.headers = auth_headers(api_key or serving_api_key())

    @property
    def openai_base_url(self) -> str:
        """What ``openai.AsyncOpenAI(base_url=...)`` wants."""
        return openai_base_url(self.base_url)

    def __repr__(self) -> str:
        return f"ServingClient({self.base_url!r})"

    async def _request(
        self, method: str, path: str, timeout_s: float | None = None, **kwargs: Any
    ) -> httpx.Response:
        limit = min(timeout_s or self.timeout_s, self.timeout_s)
        try:
            async with httpx.AsyncClient(
                timeout=httpx.Timeout(limit, connect=5.0),
                headers=self.headers,
                verify=tls_verify(self.base_url),
            ) as http:
                response = await http.request(method, self.base_url + path, **kwargs)
        except httpx.ReadTimeout as err:
            raise ServingError(
                self.base_url,
                NO_ANSWER,
                f"the server stopped answering: no answer to {method} {path} within {limit:.0f}s",
            ) from err
        if response.status_code >= 400:
            raise ServingError(self.base_url, response.status_code, _message(response))
        return response

    async def health(self, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
        """True when the server answers ``/health`` with 200 within ``timeout_s``."""
        try:
            async with httpx.AsyncClient(timeout=timeout_s, verify=tls_verify(self.base_url)) as http:
                return (await http.get(self.base_url + "/health")).status_code == 200
        except httpx.HTTPError:
            return False

    async def wait_healthy(self, timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not await self.health():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.base_url} did not become healthy within {timeout_s:.0f}s")
            await asyncio.sleep(0.5)

    async def models(self) -> list[dict[str, Any]]:
        """``/v1/models`` entries: the base model (``parent`` None) and every loaded adapter."""
        return list((await self._request("GET", "/v1/models", QUERY_TIMEOUT_S)).json()["data"])

    async def base_model(self) -> str:
        """The served name of the base model (the entry with no ``parent`` that is no ``<model>@<step>``)."""
        models = await self.models()
        names = [m["id"] for m in models if not m.get("parent") and "@" not in str(m["id"])]
        if not names:
            ids = [m.get("id") for m in models]
            raise ServingError(self.base_url, 200, f"/v1/models lists no base model (got {ids})")
        return str(names[0])

    async def adapters(self) -> dict[str, str]:
        """Loaded adapters: served name -> the path it was loaded from."""
        return {m["id"]: str(m.get("root", "")) for m in await self.models() if m.get("parent")}

    async def load_adapter(
        self, name: str, path: str, sha256: dict[str, str] | None = None, replace: bool = False
    ) -> bool:
        """Load the adapter dir ``path`` as ``name``; False when ``name`` was already loaded (a retry).

        ``sha256`` (file path relative to ``path`` -> hex digest) makes our server verify the files first;
        vLLM ignores it (the reload activity verified them already).
        """
        body: dict[str, Any] = {"lora_name": name, "lora_path": path}
        if sha256:
            body["sha256"] = sha256
        if replace:
            body["load_inplace"] = True
        try:
            await self._request(
                "POST", "/v1/load_lora_adapter", None if replace else LOAD_TIMEOUT_S, json=body
            )
        except ServingError as err:
            if err.status == 400 and "already been loaded" in err.message:
                return False
            raise
        return True

    async def unload_adapter(self, name: str) -> bool:
        """Unload ``name`` once no request uses it; False when it was not loaded."""
        try:
            await self._request("POST", "/v1/unload_lora_adapter", json={"lora_name": name})
        except ServingError as err:
            if err.status in (400, 404) and ("cannot be found" in err.message or "not found" in err.message):
                return False
            raise
        return True

    async def sleep(self, level: int = 1) -> None:
        """Free the engine's memory for the trainer (vLLM sleep mode; ours finishes in-flight work and waits)."""
        await self._request("POST", "/sleep", params={"level": level})

    async def wake_up(self) -> None:
        await self._request("POST", "/wake_up")

    async def is_sleeping(self) -> bool:
        return bool((await self._request("GET", "/is_sleeping", QUERY_TIMEOUT_S)).json()["is_sleeping"])
