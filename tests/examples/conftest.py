"""``example_home`` (session): one LocalBackend's directory for the example programs, its stack and
workers held open by a child process (tests/examples/hold_backend.py) so every example reuses them; or the one
``$DGRPO_EXAMPLE_HOME`` names, held by whoever set it (.ci/run)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dgrpo.local import LocalBackend
from host.processes import ChildProcess

REPO = Path(__file__).resolve().parents[2]


EXAMPLE_HOME = "DGRPO_EXAMPLE_HOME"
"""A folder where ``hold_backend`` runs already (``<it>/home``, ready once ``<it>/backend.ready`` exists): .ci/run
holds one for the Python 3.11 suite and the Python 3.12 lane alike, so both share one stack and its workers."""


@pytest.fixture(scope="session")
def example_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    held = os.environ.get(EXAMPLE_HOME)
    if held:
        ready = Path(held) / "backend.ready"
        deadline = time.monotonic() + 900
        while not ready.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{EXAMPLE_HOME}={held}: its backend was not ready in 900 s")
            time.sleep(1)
        yield Path(held) / "home"
        return
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
