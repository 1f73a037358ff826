"""``example_home`` (session): one LocalBackend's directory for the example programs, its stack and
workers held open by a child process (tests/examples/hold_backend.py) so every example reuses them."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dgrpo.local import LocalBackend
from host.processes import ChildProcess

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def example_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    base = tmp_path_factory.mktemp("examples")
    home, ready = base / "home", base / "backend.ready"
    holder = ChildProcess(
        [sys.executable, "-m", "tests.examples.hold_backend", str(home), str(ready)],
        base / "backend.log",
        name="the examples' LocalBackend",
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        cwd=REPO,
        tied_to_parent=True,
    )
    holder.spawn()
    try:
        holder.wait_until(ready.exists, timeout_s=900)
        yield home
    finally:
        holder.stop(timeout_s=60)
        LocalBackend(path=home).stop_all()  # whatever the holder left running
