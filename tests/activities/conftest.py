"""Fixtures for activity tests that need the real CPU inference server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from schemas.settings import ENV_ADAPTER_ROOT
from serving.launchers import CpuServerProcess

SERVED_MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def cpu_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``dgrpo serve --model smollm2-135m-instruct`` on a free port; yields its ``/v1`` base URL."""
    log_path = tmp_path_factory.mktemp("serve-logs") / "serve.log"
    server = CpuServerProcess(SERVED_MODEL, log_path=log_path)
    with pytest.MonkeyPatch.context() as mp:  # tests download adapters under their own tmp_path
        mp.setenv(ENV_ADAPTER_ROOT, str(tmp_path_factory.getbasetemp()))
        server.start()
    try:
        yield server.client.openai_base_url
    finally:
        server.stop()
