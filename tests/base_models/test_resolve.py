"""A hub-id ``base_model`` comes only from the local HF cache: nothing is downloaded at run time."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from huggingface_hub import constants

from base_models.resolve import ModelNotFoundError, resolve_base_model


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty local HF cache."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def test_a_hub_id_not_in_the_cache_is_refused_without_asking_the_hub(
    hub_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as hub:
        hub.bind(("127.0.0.1", 0))
        hub.listen()
        hub.setblocking(False)
        monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{hub.getsockname()[1]}")
        with pytest.raises(
            ModelNotFoundError, match="'made-up-org/no-such-model' is an HF hub id that is not"
        ):
            resolve_base_model("made-up-org/no-such-model")
        with pytest.raises(BlockingIOError):
            hub.accept()  # nobody connected


def test_a_cached_hub_id_resolves_to_its_snapshot_directory(hub_cache: Path) -> None:
    repo = hub_cache / "models--some-org--tiny-model"
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    resolved = resolve_base_model("some-org/tiny-model")
    assert Path(resolved.base_path) == snapshot.resolve()
    assert resolved.requested == "some-org/tiny-model" and resolved.adapter_path is None
