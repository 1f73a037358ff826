"""The deploy files: compose publishes ports on loopback only by default, and the image build context
leaves out local state, credentials and caches (while keeping every tracked source file)."""

from __future__ import annotations

import fnmatch
import re
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def published_ports() -> list[tuple[str, str]]:
    compose = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())
    return [(name, str(port)) for name, svc in compose["services"].items() for port in svc.get("ports", [])]


def test_compose_publishes_every_port_on_loopback_by_default() -> None:
    ports = published_ports()
    assert {name for name, _ in ports} >= {"temporal", "minio"}
    for name, port in ports:
        # "HOST:PUBLISHED:TARGET", HOST defaulting to 127.0.0.1; a bare "7233:7233" binds every interface
        match = re.fullmatch(r"\$\{DGRPO_BIND_ADDRESS:-127\.0\.0\.1\}:(\d+):(\d+)", port)
        assert match, f"{name} publishes {port!r} beyond loopback by default"


def ignored(path: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore rule, as far as these patterns need it: a pattern matches a path or one of
    its parent directories, from the context root; ``**/`` matches at any depth."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        anywhere = pattern.startswith("**/")
        glob = pattern.removeprefix("**/")
        for prefix in prefixes:
            candidates = [prefix, prefix.rsplit("/", 1)[-1]] if anywhere else [prefix]
            if any(fnmatch.fnmatchcase(c, glob) for c in candidates):
                return True
    return False


def dockerignore() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


@pytest.mark.parametrize(
    "path",
    [
        ".venv/bin/python",
        ".dgrpo/temporal.db",
        ".dgrpo/stack.json",
        "examples/.dgrpo/seaweed/data.dat",
        "temporal.db",
        ".env",
        ".env.production",
        "deploy/prod.env",
        "aws-credentials.json",
        "deploy/s3-secret.txt",
        "wandb/offline-run/run.wandb",
        "activities/__pycache__/judge.cpython-311.pyc",
        ".pytest_cache/v/cache/nodeids",
        ".mypy_cache/3.11/x.json",
        ".git/config",
        "bench/out/result.json",
    ],
)
def test_dockerignore_keeps_local_state_and_credentials_out_of_images(path: str) -> None:
    assert ignored(path, dockerignore())


def test_dockerignore_keeps_every_tracked_source_file() -> None:
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    files = [f for f in tracked.stdout.splitlines() if f]
    assert "pyproject.toml" in files
    dropped = [f for f in files if ignored(f, dockerignore())]
    assert not dropped, f".dockerignore leaves tracked files out of the image: {dropped}"
