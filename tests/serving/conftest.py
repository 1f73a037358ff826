"""``served_adapters`` (session): the serving tests' real LoRA adapters, made once for every module that serves
them (tests/serving/serving_adapters.py: one SFT-trained to answer a fixed string, two random)."""

from __future__ import annotations

from pathlib import Path

import pytest
from serving_adapters import random_adapter, train_fixed_answer_adapter


@pytest.fixture(scope="session")
def served_adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Under the session's temp root, which every test server takes as its adapter root. Tests only read them."""
    root = tmp_path_factory.mktemp("served-adapters")
    return {
        "fixed": train_fixed_answer_adapter(root / "fixed"),
        "random": random_adapter(root / "random", seed=1),
        "other": random_adapter(root / "other", seed=2),
    }
