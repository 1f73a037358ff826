"""Two levels of done for a checkpoint, against the real S3 store: servable once its
adapter and adapter manifest are written, resumable once everything and its manifest are; reload and a rollout's
``ensure_adapter`` need servable only, every reader of checkpoints (resume, retention, the ART client, backups)
sees resumable ones only. Reload and rollouts of a servable checkpoint: tests/activities/test_serving.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from activities.checkpoints import (
    adapter_files_on_disk,
    adapter_ref,
    adapter_sha256,
    publish_adapter,
    publish_staged,
    read_adapter_manifest,
)
from activities.early_upload import EarlyUploads
from activities.object_store import ObjectStore
from activities.retention import complete_checkpoint_steps, delete_checkpoints, select_checkpoints_to_delete
from dgrpo.client.s3_backup import complete_steps
from schemas import layout
from schemas.errors import CorruptCheckpointError


def staging(tmp_path: Path, adapter: bytes, name: str = "staged") -> Path:
    """A staged step as a trainer leaves it: adapter files, optimizer and trainer state."""
    staged = tmp_path / name
    staged.mkdir()
    (staged / "adapter_config.json").write_text('{"r": 4}')
    (staged / "adapter_model.safetensors").write_bytes(adapter)
    (staged / "optimizer.safetensors").write_bytes(b"moments " * 4096)
    (staged / "trainer_state.json").write_text('{"run_id": "r", "step": 1, "base_model": "m"}')
    return staged


def uploaded_in_order(keys: list[str], prefix: str) -> tuple[list[str], str]:
    """The files uploaded (several at once: in any order) and the one uploaded last."""
    names = [k.removeprefix(prefix) for k in keys]
    return sorted(names[:-1]), names[-1]


def test_a_checkpoint_is_servable_first_and_resumable_only_once_its_manifest_is_written(
    object_store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, prefix = "servable-1", layout.checkpoint_prefix("servable-1", 1)
    uploaded: list[str] = []
    put = ObjectStore._put_stream
    monkeypatch.setattr(
        ObjectStore, "_put_stream", lambda self, key, *a: (uploaded.append(key), put(self, key, *a))[1]
    )
    staged = staging(tmp_path, b"weights " * 1024)

    servable, manifest = publish_adapter(object_store, staged, run, 1)
    assert uploaded_in_order(uploaded, prefix) == (
        ["adapter_config.json", "adapter_model.safetensors"], layout.ADAPTER_MANIFEST_NAME,
    )  # fmt: skip
    assert read_adapter_manifest(object_store, prefix) == (manifest, servable.adapter_sha256)
    # Servable is not resumable: nothing that resumes, prunes or backs up a run sees it.
    assert object_store.latest_checkpoint(run) is None and not object_store.is_complete(prefix)
    assert complete_checkpoint_steps(object_store, run) == [] and complete_steps(object_store, run) == []
    assert select_checkpoints_to_delete(object_store, run, None, keep_last=1) == []

    uploaded.clear()
    resumable = publish_staged(object_store, staged, run, 1)
    # The rest goes up, the manifest last; the adapter's files are not uploaded again.
    assert uploaded_in_order(uploaded, prefix) == (
        ["optimizer.safetensors", "trainer_state.json"], layout.MANIFEST_NAME,
    )  # fmt: skip
    assert object_store.latest_checkpoint(run) == resumable
    whole, _ = object_store.read_manifest(prefix)
    assert {e.path for e in whole.files} == {p.name for p in staged.iterdir()}
    # The adapter's identity is the same read from either manifest (old checkpoints have only the whole one).
    assert adapter_sha256(whole) == servable.adapter_sha256
    assert adapter_ref(object_store, resumable)[0] == servable
    object_store.delete_prefix(prefix + layout.ADAPTER_MANIFEST_NAME)
    assert read_adapter_manifest(object_store, prefix)[1] == servable.adapter_sha256

    delete_checkpoints(object_store, run, [1])
    assert object_store.list(prefix) == []
    with pytest.raises(CorruptCheckpointError):
        read_adapter_manifest(object_store, prefix)


def test_a_step_published_again_with_another_adapter_replaces_it_and_the_first_is_refused(
    object_store: ObjectStore, tmp_path: Path
) -> None:
    """A step trained again after its trainer was lost (served, not resumable): its new adapter replaces the
    first, whose ref no longer reads, and a resumable checkpoint of other files stops being resumable first."""
    run, prefix = "servable-2", layout.checkpoint_prefix("servable-2", 1)
    first, _ = publish_adapter(object_store, staging(tmp_path, b"first " * 1024, "a"), run, 1)
    again = staging(tmp_path, b"again " * 1024, "b")
    second, _ = publish_adapter(object_store, again, run, 1)
    assert second.adapter_sha256 != first.adapter_sha256
    assert adapter_ref(object_store, second)[0] == second
    with pytest.raises(CorruptCheckpointError, match="its adapter changed"):
        adapter_ref(object_store, first)
    # Publishing the same adapter again (a retried activity) reuses it.
    assert publish_adapter(object_store, again, run, 1)[0] == second
    whole = publish_staged(object_store, again, run, 1)
    shutil.rmtree(again)
    third, _ = publish_adapter(object_store, staging(tmp_path, b"third " * 1024, "b"), run, 1)
    assert not object_store.is_complete(prefix)  # no manifest may list the files it replaced
    with pytest.raises(CorruptCheckpointError):
        adapter_ref(object_store, whole)
    assert read_adapter_manifest(object_store, prefix)[1] == third.adapter_sha256


def test_an_adapter_goes_up_early_unless_its_step_was_published_before(
    object_store: ObjectStore, tmp_path: Path
) -> None:
    """activities/early_upload.py: a trained step's adapter files go up before ``publish_adapter`` asks, which then
    only writes their manifest; never over a step published before (its manifest would list other files)."""
    run, prefix = "servable-3", layout.checkpoint_prefix("servable-3", 1)
    early = EarlyUploads(object_store)
    fresh = staging(tmp_path, b"fresh " * 1024, "fresh")
    files = adapter_files_on_disk(fresh)
    early.start(fresh, files, run, 1)
    assert early.done(fresh) and not object_store.exists(prefix + layout.ADAPTER_MANIFEST_NAME)
    ref, _ = publish_adapter(object_store, fresh, run, 1, files, uploaded=True)
    assert read_adapter_manifest(object_store, prefix)[1] == ref.adapter_sha256
    assert object_store.get_bytes(prefix + "adapter_model.safetensors") == b"fresh " * 1024

    again = staging(tmp_path, b"again " * 1024, "again")  # the step trained again
    early.start(again, adapter_files_on_disk(again), run, 1)
    assert not early.done(again)
    assert object_store.get_bytes(prefix + "adapter_model.safetensors") == b"fresh " * 1024
    assert adapter_ref(object_store, ref)[0] == ref  # still whole: its manifest and its files agree
