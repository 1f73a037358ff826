"""Checkpoint directories in the real object store: a checkpoint published again as a later step."""

from __future__ import annotations

import json
from pathlib import Path

from activities.checkpoints import TRAINER_STATE_FILE, TrainerState, republish_checkpoint
from activities.object_store import ObjectStore


def test_a_checkpoint_republished_as_the_next_step_keeps_its_adapter(
    object_store: ObjectStore, tmp_path: Path
) -> None:
    source_dir = tmp_path / "source"
    source_dir.mkdir()
    (source_dir / "adapter_model.safetensors").write_bytes(b"weights")
    state = TrainerState(run_id="run-r", step=3, base_model="m", seed=7)
    (source_dir / TRAINER_STATE_FILE).write_text(state.model_dump_json())
    source = object_store.publish_checkpoint(source_dir, "run-r", 3)

    ref = republish_checkpoint(object_store, tmp_path / "staging", source, 4)
    again = republish_checkpoint(object_store, tmp_path / "staging", source, 4)  # a retried activity

    assert (ref.step, again) == (4, ref)
    assert object_store.latest_checkpoint("run-r") == ref
    out = tmp_path / "out"
    manifest = object_store.get_checkpoint(ref, out)
    assert manifest.metadata["copied_from_step"] == 3
    assert (out / "adapter_model.safetensors").read_bytes() == b"weights"
    copied = json.loads((out / TRAINER_STATE_FILE).read_text())
    assert (copied["step"], copied["copied_from_step"], copied["seed"]) == (4, 3, 7)
