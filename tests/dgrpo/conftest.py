"""The ART-compatibility tests: every test here that needs neither torch in its own process nor minutes of a real
stack carries the marker ``art_compat``, which CI runs a second time on Python 3.12 with the client alone
(.ci/run; docs/art-0523.md). ``NEEDS_TORCH``: the files that start a server or a trainer themselves.
``SERVER_SIDE``: the tests of ``dgrpo art-server``, a server of the full install (its web stack is not the
client's), run by the README's command and not again on the client alone."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

HERE = Path(__file__).parent
NEEDS_TORCH = frozenset(
    {"test_art_sft.py", "test_capture.py", "test_local_gpu_cost.py", "test_model_client_costs.py"}
)
SERVER_SIDE = frozenset({"test_art_server.py", "test_art_server_vllm.py"})
collect_ignore = ([] if importlib.util.find_spec("torch") else sorted(NEEDS_TORCH)) + (
    [] if importlib.util.find_spec("fastapi") else sorted(SERVER_SIDE)
)
"""The client-only environment (no torch, no web server) cannot import these; the others collect and run there."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if (
            item.path.parent == HERE
            and item.path.name not in NEEDS_TORCH | SERVER_SIDE
            and item.get_closest_marker("slow") is None
        ):
            item.add_marker(pytest.mark.art_compat)
