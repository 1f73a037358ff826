"""Fixtures for activity tests that need the real CPU inference server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from workers.serving_process import ServerProcess

SERVED_MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def cpu_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``dgrpo serve --model smollm2-135m-instruct`` on a free port; yields its ``/v1`` base URL."""
    server = ServerProcess(SERVED_MODEL, log_dir=Path(tmp_path_factory.mktemp("serve-logs")))
    server.start()
    try:
        yield server.url
    finally:
        server.stop()
