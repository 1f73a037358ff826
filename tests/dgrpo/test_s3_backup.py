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
from dgrpo.client import s3_backup
from dgrpo.client.backup_bucket import BackupBucket, BackupBucketUnset
from dgrpo.client.s3_backup import ArtS3Backup, import_checkpoint
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


# --- restoring never destroys: a merge into the directory, every key kept inside it --------------------------


class StoreOnly(ArtS3Backup):
    """The backup calls at their seam (a backend's ``start`` and ``object_store``), over the test's store: the
    real backends fill it in the example programs (tests/examples/test_art_programs.py)."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    async def start(self) -> None:
        return None

    def object_store(self) -> ObjectStore:
        return self.store


class AwsKeys(BackupBucket):
    """The user's bucket with keys as AWS S3 keeps them, verbatim. SeaweedFS refuses a key with a ``..`` segment
    and folds ``//`` into ``/``, so such a key is listed here as AWS lists it and read from a real object of the
    bucket planted under another name (``planted``: hostile key -> stored key)."""

    def __init__(self, bucket: str, planted: dict[str, str]) -> None:
        super().__init__(bucket)
        self.planted = planted

    def keys(self, prefix: str) -> list[str]:
        return sorted([*super().keys(prefix), *(k for k in self.planted if k.startswith(prefix))])

    def etags(self, prefix: str) -> dict[str, str]:
        stored = super().etags("")
        return {
            **super().etags(prefix),
            **{k: stored[v] for k, v in self.planted.items() if k.startswith(prefix)},
        }

    def download(self, key: str, local: Path) -> None:
        super().download(self.planted.get(key, key), local)


def put(backup: BackupBucket, key: str, data: bytes, tmp_path: Path) -> None:
    source = tmp_path / f"upload-{uuid.uuid4().hex[:8]}"
    source.write_bytes(data)
    backup.upload(source, key)


def hostile_bucket(
    backup: BackupBucket, folder: str, outside: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> list[str]:
    """Keys under ``folder`` that a naive ``dir / key[len(folder):]`` writes outside the directory: ``..`` past
    the top and ``//`` after the prefix (an absolute path), as AWS keeps them, and ``linked/...`` through the link
    the directory holds, stored as is. The backup calls then reach the bucket as ``AwsKeys``."""
    planted = {
        f"{folder}../../../{outside.name}/dotdot.txt": "planted/dotdot",
        f"{folder}/{(outside / 'slashes.txt').as_posix().lstrip('/')}": "planted/slashes",
    }
    for stored in planted.values():
        put(backup, stored, b"planted", tmp_path)
    put(backup, f"{folder}linked/through-link.txt", b"planted", tmp_path)
    monkeypatch.setattr(s3_backup, "BackupBucket", lambda name: AwsKeys(name, planted))
    return [*planted, f"{folder}linked/through-link.txt"]


def user_files(directory: Path, outside: Path) -> dict[Path, str]:
    """A user's files in the directory a restore writes into, and a link in it to a folder outside."""
    files = {directory / "notes.txt": "my notes", directory / "src" / "train.py": "print('mine')"}
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    outside.mkdir()
    (directory / "linked").symlink_to(outside, target_is_directory=True)
    return files


def assert_each_skipped(warned: pytest.WarningsRecorder, backup: BackupBucket, keys: list[str]) -> None:
    messages = [str(w.message) for w in warned]
    for key in keys:
        assert any(backup.uri(key) in m for m in messages), (key, messages)


async def test_pulling_a_checkpoint_into_a_directory_keeps_its_files_and_writes_nothing_outside(
    backup: BackupBucket, object_store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``_experimental_pull_model_checkpoint(local_path=DIR)`` merges into DIR as ART's copy does: the user's files
    stay, the checkpoint's replace those of the same name, and no key of the backup writes outside DIR."""
    model = art.TrainableModel(name="pulled", project="p", base_model="org/base")
    backup.ensure_exists()
    folder = f"p/models/{model.storage_name()}/checkpoints/0002/"
    target, outside = tmp_path / "work", tmp_path / "outside"
    mine = user_files(target, outside)
    (target / "adapter_config.json").write_text("an older adapter's config")
    put(backup, folder + "adapter_config.json", b'{"r": 8}', tmp_path)
    put(backup, folder + "adapter_model.safetensors", b"weights", tmp_path)
    hostile = hostile_bucket(backup, folder, outside, tmp_path, monkeypatch)
    with pytest.warns(UserWarning) as warned:
        path = await StoreOnly(object_store)._experimental_pull_model_checkpoint(
            model, step=2, local_path=str(target), s3_bucket=backup.bucket
        )
    assert path == str(target)
    assert {p: p.read_text() for p in mine} == mine  # nothing of the user's was deleted
    assert (target / "adapter_config.json").read_text() == '{"r": 8}'
    assert (target / "adapter_model.safetensors").read_bytes() == b"weights"
    assert [p.name for p in outside.iterdir()] == []  # nothing was written outside
    assert not list(target.glob(".dgrpo-pull-*"))
    assert_each_skipped(warned, backup, hostile)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # ART deprecates the call, as here
async def test_pulling_a_models_files_keeps_the_directorys_files_and_writes_nothing_outside(
    backup: BackupBucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``_experimental_pull_from_s3`` syncs a model's files into its directory as ``aws s3 sync`` does: the files
    there stay, and a key that would leave the directory is skipped with a warning naming it."""
    model = art.Model(name="synced", project="p", base_path=str(tmp_path / "art"), report_metrics=[])
    backup.ensure_exists()
    local, outside = model.local_log().dir, tmp_path / "outside"
    mine = user_files(local, outside)
    put(backup, "p/models/synced/history.jsonl", b'{"step": 1}\n', tmp_path)
    hostile = hostile_bucket(backup, "p/models/synced/", outside, tmp_path, monkeypatch)
    with pytest.warns(UserWarning) as warned:
        await art.LocalBackend(path=tmp_path / "never-started")._experimental_pull_from_s3(model)
    assert {p: p.read_text() for p in mine} == mine
    assert (local / "history.jsonl").read_text() == '{"step": 1}\n'
    assert [p.name for p in outside.iterdir()] == []
    assert_each_skipped(warned, backup, hostile)
