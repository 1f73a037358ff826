"""ObjectStore against the real SeaweedFS S3 server of the test stack."""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path

import psutil
import pytest
from pydantic import SecretStr

from activities.object_store import WORKER_OUTAGE_S, ObjectStore, parse_uri
from schemas import layout
from schemas.errors import CorruptCheckpointError, StoreAuthError, StoreError
from schemas.refs import Manifest, ManifestEntry
from schemas.settings import S3Settings
from workers.stack import EmbeddedStack, free_port


def make_checkpoint(root: Path, seed: str) -> Path:
    (root / "nested" / "deeper").mkdir(parents=True)
    (root / "adapter_model.safetensors").write_bytes(hashlib.sha256(seed.encode()).digest() * 5000)
    (root / "adapter_config.json").write_text(f'{{"seed": "{seed}"}}')
    (root / "nested" / "deeper" / "optimizer.pt").write_bytes(b"\x00\x01" * 777)
    (root / "empty.txt").write_bytes(b"")
    return root


def test_objects_round_trip(object_store: ObjectStore, tmp_path: Path) -> None:
    ref = object_store.put_bytes("a/b/c.bin", b"hello \xff")
    assert ref.uri == f"s3://{object_store.bucket}/a/b/c.bin"
    assert parse_uri(ref.uri) == (object_store.bucket, "a/b/c.bin")
    assert ref.sha256 == hashlib.sha256(b"hello \xff").hexdigest() and ref.size == 7
    assert object_store.get_bytes(ref.uri) == b"hello \xff"
    local = tmp_path / "f.txt"
    local.write_text("ünïcode")
    object_store.put_file(local, "a/f.txt")
    assert object_store.get_file("a/f.txt", tmp_path / "out" / "g.txt").read_text() == "ünïcode"
    assert object_store.exists("a/f.txt") and not object_store.exists("a/missing")
    assert object_store.list("a/") == ["a/b/c.bin", "a/f.txt"]
    assert object_store.delete_prefix("a/b/") == 1
    assert object_store.list("a/") == ["a/f.txt"]
    with pytest.raises(StoreError, match="NoSuchKey"):
        object_store.get_bytes("a/missing")


def test_from_env_uses_the_stack(stack: object) -> None:
    store = ObjectStore.from_env()
    store.ensure_bucket()
    store.put_bytes("from-env/x", b"1")
    assert store.get_bytes("from-env/x") == b"1"


def test_dir_round_trip_verifies_manifest(object_store: ObjectStore, tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src", "a")
    manifest_ref = object_store.put_dir(src, "ckpt/x", {"step": 3})
    assert manifest_ref.uri.endswith("ckpt/x/" + layout.MANIFEST_NAME)
    assert object_store.is_complete("ckpt/x/")
    manifest = object_store.get_dir("ckpt/x/", tmp_path / "dst")
    assert manifest.metadata == {"step": 3}
    assert sorted(e.path for e in manifest.files) == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "empty.txt",
        "nested/deeper/optimizer.pt",
    ]
    for entry in manifest.files:
        assert (tmp_path / "dst" / entry.path).read_bytes() == (src / entry.path).read_bytes()


def test_prefix_without_manifest_is_incomplete(object_store: ObjectStore, tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src", "b")
    run = "run-1"
    for step in (1, 2):
        ref = object_store.publish_checkpoint(src, run, step, {"base_model": "m"})
        assert ref.step == step and ref.uri == object_store.uri(layout.checkpoint_prefix(run, step))
    # Step 3 was interrupted: its files are there, its manifest never was.
    object_store.put_file(
        src / "adapter_config.json", layout.checkpoint_prefix(run, 3) + "adapter_config.json"
    )
    assert object_store.checkpoint_steps(run) == [1, 2, 3]
    assert not object_store.is_complete(layout.checkpoint_prefix(run, 3))
    latest = object_store.latest_checkpoint(run)
    assert latest is not None and latest.step == 2
    manifest_bytes = object_store.get_bytes(layout.checkpoint_prefix(run, 2) + layout.MANIFEST_NAME)
    assert latest.manifest_sha256 == hashlib.sha256(manifest_bytes).hexdigest()
    with pytest.raises(CorruptCheckpointError, match=r"no manifest\.json"):
        object_store.get_dir(layout.checkpoint_prefix(run, 3), tmp_path / "dst")
    assert object_store.latest_checkpoint("never-ran") is None


def test_tampered_file_is_refused(object_store: ObjectStore, tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src", "c")
    ref = object_store.publish_checkpoint(src, "run-t", 5)
    key = layout.checkpoint_prefix("run-t", 5) + "nested/deeper/optimizer.pt"
    same_size = bytearray(object_store.get_bytes(key))
    same_size[10] ^= 0xFF
    object_store.put_bytes(key, bytes(same_size))
    with pytest.raises(CorruptCheckpointError, match=r"optimizer\.pt does not match its manifest.*sha256"):
        object_store.get_dir(ref.uri, tmp_path / "dst")
    assert not (tmp_path / "dst" / "nested" / "deeper" / "optimizer.pt").exists()
    object_store.put_bytes(key, b"short")
    with pytest.raises(CorruptCheckpointError, match="size 5 vs 1554"):
        object_store.get_dir(ref.uri, tmp_path / "dst2")


@pytest.mark.parametrize("path", ["../escaped.txt", "/tmp/escaped.txt", "linked/escaped.txt"])
def test_a_manifest_path_that_would_leave_the_folder_is_refused(
    object_store: ObjectStore, tmp_path: Path, path: str
) -> None:
    """A manifest names where each file goes: one that would land outside the download folder (``..``, an absolute
    path, a link already in the folder) refuses the whole checkpoint, and nothing is written outside."""
    manifest = Manifest(
        files=[ManifestEntry(path=path, size=7, sha256=hashlib.sha256(b"planted").hexdigest())]
    )
    object_store.put_bytes("ckpt/hostile/" + layout.MANIFEST_NAME, manifest.model_dump_json().encode())
    if not path.startswith(("/", "..")):  # the store keeps no key with '..' (nor '//'); this one it keeps
        object_store.put_bytes("ckpt/hostile/" + path, b"planted")
    local, outside = tmp_path / "dst", tmp_path / "outside"
    outside.mkdir()
    local.mkdir()
    (local / "linked").symlink_to(outside, target_is_directory=True)
    with pytest.raises(CorruptCheckpointError, match="would be written outside"):
        object_store.get_dir("ckpt/hostile/", local)
    assert list(outside.iterdir()) == [] and not (tmp_path / "escaped.txt").exists()


def test_wrong_credentials_raise_store_auth_error(s3_settings: S3Settings) -> None:
    for access_key, secret in ((s3_settings.access_key, "not-the-secret"), ("nobody", "nothing")):
        bad = ObjectStore(
            s3_settings.model_copy(update={"access_key": access_key, "secret_key": SecretStr(secret)})
        )
        with pytest.raises(StoreAuthError) as err:
            bad.get_bytes("anything")
        message = str(err.value)
        assert "refused access key" in message and access_key in message
        assert "DGRPO_S3_ACCESS_KEY" in message and "DGRPO_S3_SECRET_KEY" in message
        assert secret not in message


def test_unreachable_endpoint_fails_fast(s3_settings: S3Settings) -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    store = ObjectStore(s3_settings.model_copy(update={"endpoint": endpoint}))
    started = time.monotonic()
    with pytest.raises(StoreError, match=f"cannot reach the S3 store at {endpoint}") as err:
        store.put_bytes("x", b"y")
    assert not isinstance(err.value, StoreAuthError)
    assert time.monotonic() - started < 10


def test_get_checkpoint_checks_the_published_manifest(object_store: ObjectStore, tmp_path: Path) -> None:
    ref = object_store.publish_checkpoint(make_checkpoint(tmp_path / "a", "a"), "run-m", 1)
    assert object_store.get_checkpoint(ref, tmp_path / "out").metadata == {"run_id": "run-m", "step": 1}
    object_store.publish_checkpoint(make_checkpoint(tmp_path / "b", "b"), "run-m", 1)  # a rogue re-publish
    with pytest.raises(CorruptCheckpointError, match="manifest changed since step 1 was published"):
        object_store.get_checkpoint(ref, tmp_path / "out2")


def test_a_workers_store_rides_out_a_restart_of_the_store(tmp_path: Path) -> None:
    """S3 killed, then back on its ports 20 s later: a worker's request waits it out; a client's fails fast."""
    home = tmp_path / "outage-home"
    embedded = EmbeddedStack(home, free_ports=True, ui=False, tied_to_parent=True)
    state = embedded.start()
    try:
        settings = embedded.s3_settings
        ObjectStore(settings).put_bytes("kept/z", b"before the outage")
        psutil.Process(state.seaweed.pid).kill()
        psutil.Process(state.seaweed.pid).wait(10)
        with pytest.raises(StoreError, match="cannot reach"):
            ObjectStore(settings).get_bytes("kept/z")
        restarting = threading.Event()

        def restart() -> None:
            restarting.set()
            # Not tied to this timer thread: a child tied to its parent gets SIGTERM when that thread ends.
            EmbeddedStack(home, free_ports=True, ui=False).start()

        timer = threading.Timer(20.0, restart)
        timer.start()
        assert ObjectStore(settings, outage_s=WORKER_OUTAGE_S).get_bytes("kept/z") == b"before the outage"
        assert restarting.is_set()  # answered by the restarted store, not before the outage
        timer.join()
    finally:
        EmbeddedStack(home).stop()
