"""Run examples/art_style.py as the user would: a separate Python process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "art_style.py"
SMALL = ["--groups", "2", "--group-size", "3"]
"""Small steps: 2 scenarios x 3 rollouts of at most 16 tokens."""


def env(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", **(extra or {})}


def example(*args: str) -> list[str]:
    return [sys.executable, str(EXAMPLE), *SMALL, *args]


def run_example(
    *args: str, extra_env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run examples/art_style.py to the end; its output is kept for the assertion messages."""
    return subprocess.run(
        example(*args),
        cwd=REPO,
        env=env(extra_env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def spawn_example(*args: str, log: Path) -> subprocess.Popen[bytes]:
    """Start examples/art_style.py in the background, its output going to ``log``."""
    with open(log, "wb") as out:
        return subprocess.Popen(example(*args), cwd=REPO, env=env(), stdout=out, stderr=subprocess.STDOUT)


def tail(path: Path, n: int = 4000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else ""
