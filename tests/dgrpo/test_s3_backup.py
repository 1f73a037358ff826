"""ART's S3 backup calls on dgrpo's layout, against the test stack's SeaweedFS reached as AWS S3 is (the AWS
variables, a bucket of its own): a model's local files go and come back, and a pulled checkpoint is imported
into dgrpo's store only when it fits the model. Training, registering and serving the pulled step are in the
example programs (tests/examples/test_art_programs.py)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import dgrpo as art
from activities.checkpoints import TRAINER_STATE_FILE, read_trainer_state
from activities.object_store import ObjectStore
from dgrpo.client.backup_bucket import BackupBucket, BackupBucketUnset
from dgrpo.client.s3_backup import import_checkpoint
from dgrpo.errors import ModelConflictError
from schemas import layout
from schemas.config import LoraConfig, ModelSpec
from schemas.settings import S3Settings


@pytest.fixture
def backup(s3_settings: S3Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[BackupBucket]:
    """The stack's SeaweedFS as the user's "AWS": only the AWS variables, never dgrpo's own."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{s3_settings.endpoint.removeprefix('http://')}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_settings.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_settings.secret_key.get_secret_value())
    bucket = f"backup-{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv("BACKUP_BUCKET", bucket)
    backup = BackupBucket(bucket)
    yield backup
    if backup.client.bucket_exists(bucket):  # a bucket holds a SeaweedFS volume: free it
        backup.delete(backup.keys(""))
        backup.client.remove_bucket(bucket)


async def logged_model(tmp_path: Path) -> art.Model:
    model = art.Model(name="baseline", project="p", base_path=str(tmp_path / "a"), report_metrics=[])
    await model.log([art.TrajectoryGroup([art.Trajectory(reward=1.0), art.Trajectory(reward=0.0)])], step=1)
    await model.log(metrics={"costs/eval/judge": 0.25}, split="val", step=1)
    return model


async def test_a_models_local_files_go_to_its_backup_and_come_back(
    backup: BackupBucket, tmp_path: Path
) -> None:
    backend = art.LocalBackend(path=tmp_path / "never-started")  # a Model's files need no stack
    model = await logged_model(tmp_path)
    await backend._experimental_push_to_s3(model, verbose=True)
    base = "p/models/baseline/"
    assert backup.keys(base) == [
        f"{base}history.jsonl",
        f"{base}state.json",
        f"{base}trajectories/val/0001.parquet",
    ]
    restored = art.Model(name="baseline", project="p", base_path=str(tmp_path / "b"), report_metrics=[])
    with pytest.warns(DeprecationWarning, match="_experimental_pull_model_checkpoint"):
        await backend._experimental_pull_from_s3(restored, exclude=["trajectories"])
    local = tmp_path / "b/p/models/baseline"
    assert sorted(p.name for p in local.iterdir()) == ["history.jsonl", "state.json"]
    await restored.log(metrics={"costs/eval/judge": 0.5}, split="val", step=2)
    last = json.loads((local / "history.jsonl").read_text().splitlines()[-1])
    assert last["costs/cum/eval/judge"] == pytest.approx(0.75)  # the pulled running total continues
    (tmp_path / "a/p/models/baseline/history.jsonl").unlink()
    await backend._experimental_push_to_s3(model, delete=True)  # the backup follows what the model has
    assert f"{base}history.jsonl" not in backup.keys(base)


async def test_without_a_bucket_the_call_fails_as_arts_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BACKUP_BUCKET", raising=False)
    model = await logged_model(tmp_path)
    with pytest.raises(KeyError, match=r"BACKUP_BUCKET.*s3_bucket=.*already durable in its own store"):
        await art.LocalBackend(path=tmp_path / "x")._experimental_push_to_s3(model)
    assert issubclass(BackupBucketUnset, KeyError)


def art_adapter(folder: Path, rank: int, base_model: str) -> None:
    folder.mkdir(parents=True)
    config = {"r": rank, "lora_alpha": 2 * rank, "base_model_name_or_path": base_model, "peft_type": "LORA"}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    (folder / "adapter_model.safetensors").write_bytes(b"weights")


def test_a_pulled_checkpoint_is_imported_only_when_it_fits_the_model(
    backup: BackupBucket, object_store: ObjectStore, tmp_path: Path
) -> None:
    spec = ModelSpec(name="agent", project="p", base_model="org/base", lora=LoraConfig(rank=8, alpha=16))
    backup.ensure_exists()
    base = "p/models/agent/"
    for step, rank, base_model in [(1, 8, "org/base"), (2, 16, "org/base"), (3, 8, "org/other")]:
        art_adapter(tmp_path / str(step), rank, base_model)  # as ART's LocalBackend saves one
        for f in (tmp_path / str(step)).iterdir():
            backup.upload(f, f"{base}checkpoints/{step:04d}/{f.name}")
    run = (object_store, "p-agent", spec)
    assert import_checkpoint(backup, base, run, 1, verbose=True)
    imported = tmp_path / "imported"
    object_store.get_dir(layout.checkpoint_prefix("p-agent", 1), imported)  # published, manifest last
    state = read_trainer_state(imported)
    assert (state.run_id, state.step, state.base_model, state.lora) == (
        "p-agent",
        1,
        "org/base",
        spec.lora.model_dump(),
    )
    assert not import_checkpoint(backup, base, run, 1, verbose=False)  # the store's own is kept
    with pytest.raises(ModelConflictError, match=r"rank 16, alpha 32.*trains rank 8"):
        import_checkpoint(backup, base, run, 2, verbose=False)
    with pytest.raises(ModelConflictError, match="base model 'org/other'"):
        import_checkpoint(backup, base, run, 3, verbose=False)
    assert object_store.checkpoint_steps("p-agent") == [1]  # nothing of the refused ones was published
    assert (imported / TRAINER_STATE_FILE).is_file()
