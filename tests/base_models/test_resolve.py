"""A hub-id ``base_model`` comes only from the local HF cache: nothing is downloaded at run time."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from huggingface_hub import constants

from base_models.resolve import ModelNotFoundError, resolve_base_model
from schemas.errors import UnsafePathError


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


def test_a_local_model_resolves_only_under_the_model_roots(tmp_path: Path) -> None:
    """A run names ``base_model``; the trainer reads it only from under its operator's roots, once links and
    ``..`` are resolved, and an adapter's own base model is held to the same roots."""
    root, elsewhere = tmp_path / "models", tmp_path / "elsewhere"
    for model in (root / "mine", elsewhere / "theirs"):
        model.mkdir(parents=True)
        (model / "config.json").write_text("{}")
    roots = [str(root)]
    assert resolve_base_model(str(root / "mine"), roots=roots).base_path == str((root / "mine").resolve())
    (root / "link").symlink_to(elsewhere / "theirs")
    adapter = root / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(
        json.dumps({"base_model_name_or_path": str(elsewhere / "theirs")})
    )
    for escaping in (elsewhere / "theirs", root / ".." / "elsewhere" / "theirs", root / "link", adapter):
        with pytest.raises(
            UnsafePathError, match="outside the directories this trainer reads models from"
        ) as err:
            resolve_base_model(str(escaping), roots=roots)
        assert "DGRPO_MODEL_ROOTS" in str(err.value) and not err.value.retryable
    assert resolve_base_model(str(elsewhere / "theirs")).base_path  # no roots: the operator's own --model
