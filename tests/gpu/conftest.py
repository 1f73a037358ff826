"""Fixtures for the GPU tests (``pytest -m gpu tests/gpu``; the default run deselects them).

They need a CUDA device, vLLM and the project's deps (``deploy/gpu/install-offline.sh``), and reuse the
session's real stack (``tests/conftest.py``) and the CPU tests' adapters (``tests/serving/serving_adapters``).
``DGRPO_GPU_RESULTS``: a directory where each test also writes what it measured, as JSON
(``deploy/gpu/check-on-device.sh`` points it at ``$OUT``).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

# The serving tests' adapters live beside the CPU serving tests; one definition serves both.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serving"))

ENV_RESULTS = "DGRPO_GPU_RESULTS"
Record = Callable[[str, dict[str, Any]], None]


@pytest.fixture(scope="session", autouse=True)
def cuda_device() -> str:
    """Fail at once, with the reason, where there is no GPU (these tests are never skipped)."""
    assert torch.cuda.is_available(), "the gpu tests need a CUDA device; CI deselects them (-m 'not gpu')"
    return torch.cuda.get_device_name(0)


@pytest.fixture(scope="session")
def record() -> Record:
    """``record(name, data)`` writes ``data`` to ``$DGRPO_GPU_RESULTS/<name>.json`` (and logs it)."""

    def write(name: str, data: dict[str, Any]) -> None:
        text = json.dumps(data, indent=2, default=str)
        print(f"{name}: {text}")
        out = os.environ.get(ENV_RESULTS)
        if out:
            Path(out).mkdir(parents=True, exist_ok=True)
            (Path(out) / f"{name}.json").write_text(text + "\n")

    return write
