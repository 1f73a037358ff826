"""``/health`` of our CPU server answers for its engine, not only its HTTP loop (as vLLM's does): once the
engine thread has ended, it says 503, so the inference worker's probes restart the server."""

from __future__ import annotations

import httpx

from serving.options import ServerOptions
from serving.server import create_server


async def test_health_says_503_once_the_engine_thread_has_ended() -> None:
    app, engine = create_server(ServerOptions(model="smollm2-135m-instruct", prefix_cache_mb=0))
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://server"
        ) as http:
            assert (await http.get("/health")).status_code == 200
            engine.close()
            assert (await http.get("/health")).status_code == 503
    finally:
        engine.close()
