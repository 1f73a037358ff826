"""Run ``dgrpo art-server``: the durable backend started (or reached), then ART's API and the OpenAI endpoint,
each on its own port, in one process until SIGTERM or SIGINT; what the backend started is stopped after."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Iterator

import uvicorn

from activities.rollout_model import own_server_api_key
from dgrpo.art_server.art_api import art_app
from dgrpo.art_server.models import ServedModels, ServerBackend
from dgrpo.art_server.openai_api import openai_app
from dgrpo.art_server.options import ArtServerError, ArtServerOptions
from dgrpo.client.temporal_backend import TemporalBackend
from dgrpo.local.backend import LocalBackend

log = logging.getLogger(__name__)


class Listener(uvicorn.Server):
    """A uvicorn server that leaves the signals to ``serve`` (two of them share one process)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def backend_of(options: ArtServerOptions) -> ServerBackend:
    if options.backend == "temporal":
        return TemporalBackend(task_queues=options.task_queues)
    return LocalBackend(path=options.path, task_queues=options.task_queues)


def check_free(host: str, ports: list[int]) -> None:
    """Refuse to start when a port is taken, before the backend starts (uvicorn would say so only after)."""
    for port in ports:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError as err:
                raise ArtServerError(f"cannot listen on {host}:{port}: {err.strerror}") from None


async def serve(options: ArtServerOptions) -> None:
    """Serve until SIGTERM or SIGINT."""
    check_free(options.host, [options.port, options.openai_port])
    backend = backend_of(options)
    await backend.start()
    models = ServedModels(backend, options.art_path)
    api_key = None if options.api_key is None else options.api_key.get_secret_value()
    listeners = [
        Listener(uvicorn.Config(app, host=options.host, port=port, log_level="warning", access_log=False))
        for app, port in (
            (art_app(models, options.openai_port, api_key), options.port),
            (openai_app(models, own_server_api_key(), api_key), options.openai_port),
        )
    ]

    def stop() -> None:
        for listener in listeners:
            listener.should_exit = True

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    log.info(
        "ART's API on http://%s:%d, the OpenAI endpoint on http://%s:%d/v1 (backend: %s)",
        options.host, options.port, options.host, options.openai_port, options.backend,
    )  # fmt: skip
    try:
        await asyncio.gather(*(listener.serve() for listener in listeners))
    finally:
        await backend.close()
