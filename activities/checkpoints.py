"""Checkpoint directories: what a staged/published checkpoint holds, and how it is published.

A checkpoint directory (local staging dir or ``runs/<run>/checkpoints/<step:06d>/`` in S3):

- ``adapter_config.json`` + ``adapter_model.safetensors``: the LoRA adapter in PEFT format, at the top
  level, so the downloaded directory loads as is with ``PeftModel.from_pretrained`` or vLLM's
  ``/v1/load_lora_adapter`` (``lora_path`` = the directory).
- ``optimizer.safetensors``: the AdamW state (absent at step 0), so resume is exact (``optimizer.pt``, a
  ``torch.save``, in checkpoints written before; activities/state_files.py reads both).
- ``trainer_state.json``: step, run id, base model, seed, the micro-batch the step finished with.
- ``rng_state.pt``: torch's RNG state after the step.
- ``metrics.json``: the step's training metrics.
- ``adapter_manifest.json`` (in S3 only): the adapter's files with their sha256, written once they are in: the
  checkpoint is *servable* (reload needs no more), while the rest may still be uploading.
- ``manifest.json`` (in S3 only): every file with its sha256, written last by ``ObjectStore.put_dir``: the
  checkpoint is *resumable*. Resume, retention and the ART client trust only this one.
- ``.sha256.json`` (staged only, never uploaded): each file's sha256 as staging wrote it, so publishing does
  not read the files twice.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from activities.object_store import ObjectStore, sha256_file
from host.files import inside, write_dir_atomic, write_json_atomic
from schemas import layout
from schemas.config import ModelSpec
from schemas.errors import CheckpointMismatchError, CorruptCheckpointError, UnsafePathError
from schemas.refs import AdapterRef, CheckpointRef, Manifest, ManifestEntry

log = logging.getLogger(__name__)

TRAINER_STATE_FILE = "trainer_state.json"
METRICS_FILE = "metrics.json"
HASHES_FILE = ".sha256.json"
"""In a staged checkpoint: each file's sha256, computed from the bytes staging wrote."""
VERIFIED_MARKER = ".manifest_sha256"
"""In a downloaded checkpoint: the sha256 of the manifest its files were verified against."""
ADAPTER_FILE_PREFIX = "adapter_"
"""The files of a checkpoint the inference servers read (``adapter_config.json``, ``adapter_model.safetensors``)."""


def serves(path: str) -> bool:
    """Whether a checkpoint file is one the servers read (the optimizer and trainer state stay in the store)."""
    return path.startswith(ADAPTER_FILE_PREFIX)


def adapter_manifest(manifest: Manifest) -> Manifest:
    """The adapter manifest of a checkpoint whose (whole or adapter) manifest is ``manifest``: its adapter's files,
    by path, and nothing else. Its JSON (``adapter_manifest_bytes``) is what ``publish_adapter`` writes."""
    return Manifest(files=sorted((e for e in manifest.files if serves(e.path)), key=lambda e: e.path))


def adapter_manifest_bytes(manifest: Manifest) -> bytes:
    return adapter_manifest(manifest).model_dump_json(indent=2).encode()


def adapter_sha256(manifest: Manifest) -> str:
    """The adapter's identity (``AdapterRef.adapter_sha256``): the sha256 of its adapter manifest, the same whether
    read from that file or derived from the whole manifest."""
    return hashlib.sha256(adapter_manifest_bytes(manifest)).hexdigest()


class TrainerState(BaseModel):
    """``trainer_state.json``: the small facts about how a checkpoint was produced."""

    model_config = ConfigDict(extra="allow")

    run_id: str
    step: int
    base_model: str
    seed: int = 0
    micro_batch_size: int | None = None
    """The micro-batch the step finished with (None at step 0)."""
    worker_id: str = ""
    lora: dict[str, Any] | None = None
    """The run's ``model.lora`` the adapter was trained with (None in checkpoints written before it was kept)."""
    staged_id: str = ""
    """Names the staging that produced the checkpoint on its trainer (empty in checkpoints written before)."""


class OomState(BaseModel):
    """The last out-of-memory failure of a step on this worker (read by the next attempt)."""

    micro_batch_size: int
    """The micro-batch that ran out of memory."""
    attempt: int


def under_root(root: str | Path, *parts: str) -> Path:
    """``root/parts...``, refused with ``UnsafePathError`` unless it stays inside ``root`` once ``..`` and
    links are resolved (run ids are validated names, so this only trips on a bug or a hostile input)."""
    base = Path(root).resolve()
    if not parts or inside(base, "/".join(parts)) is None:
        raise UnsafePathError(
            f"{'/'.join(parts)!r} would leave {base}; run ids and names are 1-128 letters, digits, '.', '_' "
            "or '-', starting with a letter or digit"
        )
    return base.joinpath(*parts)


def run_dir(root: str | Path, run_id: str) -> Path:
    """A run's directory under a worker's staging root (checked to stay under it)."""
    return under_root(root, run_id)


def staging_dir(root: str | Path, run_id: str, step: int) -> Path:
    return run_dir(root, run_id) / layout.step_name(step)


def oom_state_file(root: str | Path, run_id: str, step: int) -> Path:
    # Outside the step's staging dir, so it is never uploaded with the checkpoint.
    return run_dir(root, run_id) / f".{layout.step_name(step)}.oom.json"


def read_oom_state(root: str | Path, run_id: str, step: int) -> OomState | None:
    path = oom_state_file(root, run_id, step)
    if not path.is_file():
        return None
    try:
        return OomState.model_validate_json(path.read_text())
    except ValueError:
        return None


def stage_checkpoint(
    target: Path,
    save_adapter: Callable[[Path], dict[str, str] | None],
    state: TrainerState,
    metrics: dict[str, float],
) -> Path:
    """Write a checkpoint dir atomically: into a temp dir, then renamed over ``target``. ``save_adapter``
    writes the trainer's files and may return their sha256 (kept in ``HASHES_FILE`` for publishing)."""

    def fill(staging: Path) -> None:
        hashes = save_adapter(staging)
        write_json_atomic(staging / TRAINER_STATE_FILE, state.model_dump(mode="json"))
        write_json_atomic(staging / METRICS_FILE, metrics)
        if hashes is not None:
            for name in (TRAINER_STATE_FILE, METRICS_FILE):
                hashes[name] = sha256_file(staging / name)[0]
            write_json_atomic(staging / HASHES_FILE, hashes)

    return write_dir_atomic(target, fill)


def read_trainer_state(directory: str | Path) -> TrainerState:
    return TrainerState.model_validate_json((Path(directory) / TRAINER_STATE_FILE).read_text())


def published_trainer_state(store: ObjectStore, ref: CheckpointRef) -> TrainerState:
    """``trainer_state.json`` of a published checkpoint, read from the store (a few hundred bytes)."""
    return TrainerState.model_validate_json(store.get_bytes(ref.uri + TRAINER_STATE_FILE))


def check_checkpoint_fits(state: TrainerState, model: ModelSpec, where: str) -> None:
    """Raise ``CheckpointMismatchError`` when checkpoint ``where`` was trained for another base model or LoRA
    shape than ``model`` (the run's spec), naming each: resuming it would train (or fail on) the wrong one."""
    differ = []
    if state.base_model != model.base_model:
        differ.append(f"base_model {state.base_model!r} (the spec says {model.base_model!r})")
    spec_lora = model.lora.model_dump(mode="json")
    if state.lora is not None and state.lora != spec_lora:
        differ.append(f"lora {state.lora} (the spec says {spec_lora})")
    if differ:
        raise CheckpointMismatchError(
            f"checkpoint {where} (step {state.step} of run {state.run_id}) was trained with "
            f"{' and '.join(differ)}; resume the run with the spec it was trained with, or start this spec "
            "under another run_id"
        )


def _staged_files(staging: Path, only: Callable[[str], bool] | None = None) -> dict[str, str]:
    """Each staged file's sha256 by path (as staging wrote it, else read now), bookkeeping left out."""
    hashes = staged_hashes(staging)
    manifests = (layout.MANIFEST_NAME, layout.ADAPTER_MANIFEST_NAME)
    return {
        rel: hashes.get(rel) or sha256_file(p)[0]
        for p in staging.rglob("*")
        if p.is_file()
        and not p.name.startswith(".")
        and (rel := p.relative_to(staging).as_posix()) not in manifests
        and (only is None or only(rel))
    }


def _published_as(
    store: ObjectStore,
    prefix: str,
    name: str,
    files: dict[str, str],
    only: Callable[[str], bool] | None = None,
) -> str | None:
    """The sha256 of manifest ``name`` under ``prefix`` when it lists exactly ``files`` (path -> sha256; with
    ``only``, of the files it lists that ``only`` picks); else None, and a manifest that lists others is deleted
    first: its step is being published again with other files, and no reader may pair it with the new ones."""
    try:
        manifest, sha = store.read_manifest(prefix, name)
    except CorruptCheckpointError:
        return None
    if {e.path: e.sha256 for e in manifest.files if only is None or only(e.path)} == files:
        return sha
    log.warning("%s lists other files than this staging: replaced", store.uri(prefix + name))
    store.delete_prefix(prefix + name)
    return None


AdapterFiles = dict[str, tuple[bytes, str]]
"""A staged step's adapter files: name -> (bytes, sha256), as the trainer serialized them (first)."""


def adapter_files_on_disk(staging: Path) -> AdapterFiles:
    """The adapter files of a staged step on disk, with their sha256 (as staging wrote them, else read now)."""
    return {
        name: ((staging / name).read_bytes(), sha) for name, sha in _staged_files(staging, serves).items()
    }


def publish_adapter(
    store: ObjectStore,
    staging: Path,
    run_id: str,
    step: int,
    files: AdapterFiles | None = None,
    uploaded: bool = False,
) -> tuple[AdapterRef, Manifest]:
    """Upload a staged step's adapter files (``files``: from memory, as the trainer serialized them; else from
    ``staging``; ``uploaded``: they went up already, activities/early_upload.py), then its adapter manifest: the
    checkpoint is servable. The same adapter already up is reused. Also that adapter manifest."""
    prefix = layout.checkpoint_prefix(run_id, step)
    files = adapter_files_on_disk(staging) if files is None else files
    hashes = {name: sha for name, (_, sha) in files.items()}
    manifest = adapter_manifest(
        Manifest(
            files=[ManifestEntry(path=n, size=len(data), sha256=sha) for n, (data, sha) in files.items()]
        )
    )
    listed = set(store.list(prefix, recursive=False))
    if prefix + layout.MANIFEST_NAME in listed:  # resumable with another adapter: no longer, first
        _published_as(store, prefix, layout.MANIFEST_NAME, hashes, only=serves)
    sha = None
    if prefix + layout.ADAPTER_MANIFEST_NAME in listed:
        sha = _published_as(store, prefix, layout.ADAPTER_MANIFEST_NAME, hashes)
    if sha is None:
        for name, (data, digest) in files.items():
            if not uploaded or listed & {
                prefix + layout.MANIFEST_NAME,
                prefix + layout.ADAPTER_MANIFEST_NAME,
            }:
                store.put_bytes(prefix + name, data, digest)
        sha = store.put_bytes(prefix + layout.ADAPTER_MANIFEST_NAME, adapter_manifest_bytes(manifest)).sha256
    return AdapterRef(run_id=run_id, step=step, uri=store.uri(prefix), adapter_sha256=sha), manifest


def publish_staged(
    store: ObjectStore, staging: Path, run_id: str, step: int, metadata: dict[str, Any] | None = None
) -> CheckpointRef:
    """Upload a staged checkpoint: its adapter first (``publish_adapter``: servable), then the rest, manifest last
    (resumable). A complete checkpoint with the same files is reused, and adapter files already up are not
    uploaded again."""
    if not (staging / TRAINER_STATE_FILE).is_file():
        raise CorruptCheckpointError(f"{staging} is not a staged checkpoint (no {TRAINER_STATE_FILE})")
    prefix = layout.checkpoint_prefix(run_id, step)
    if store.is_complete(prefix):
        sha = _published_as(store, prefix, layout.MANIFEST_NAME, _staged_files(staging))
        if sha is not None:
            log.info("checkpoint %s already published with the same files", store.uri(prefix))
            return CheckpointRef(run_id=run_id, step=step, uri=store.uri(prefix), manifest_sha256=sha)
    _, adapter = publish_adapter(store, staging, run_id, step)
    meta = {k: v for k, v in (metadata or {}).items() if isinstance(v, str | int | float | bool) or v is None}
    present = {e.path: e for e in adapter.files}
    return store.publish_checkpoint(staging, run_id, step, meta, staged_hashes(staging), present=present)


def staged_hashes(staging: Path) -> dict[str, str]:
    """The sha256 of each file as staging wrote it (``HASHES_FILE``); empty when it kept none."""
    path = staging / HASHES_FILE
    if not path.is_file():
        return {}
    try:
        hashes = json.loads(path.read_text())
    except ValueError:
        return {}
    return (
        {k: v for k, v in hashes.items() if isinstance(k, str) and isinstance(v, str)}
        if isinstance(hashes, dict)
        else {}
    )


def republish_checkpoint(
    store: ObjectStore, staging_root: str | Path, source: CheckpointRef, step: int
) -> CheckpointRef:
    """Publish ``source`` again as checkpoint ``step`` of its run, its trainer state saying so: the step
    that trained nothing (every group's rewards equal) still advances, as in ART >= 0.4.4."""
    target = staging_dir(staging_root, source.run_id, step)
    if target.exists():  # a retried attempt's partial copy
        shutil.rmtree(target)
    store.get_checkpoint(source, target)
    state = read_trainer_state(target).model_dump(mode="json")
    write_json_atomic(target / TRAINER_STATE_FILE, {**state, "step": step, "copied_from_step": source.step})
    return publish_staged(store, target, source.run_id, step, {"copied_from_step": source.step})


def download_checkpoint(store: ObjectStore, ref: CheckpointRef, local: Path) -> Manifest | None:
    """Download the published checkpoint ``ref`` (``ObjectStore.get_checkpoint``: its manifest is the one
    published, every file sha256-verified) into ``local``. A copy verified against that manifest is reused:
    then None, else the manifest."""
    return _download(local, ref.manifest_sha256, lambda tmp: store.get_checkpoint(ref, tmp))


def read_adapter_manifest(store: ObjectStore, prefix: str) -> tuple[Manifest, str]:
    """The adapter's files of checkpoint ``prefix`` and its ``adapter_sha256``: from its adapter manifest (servable),
    else from its whole manifest (a checkpoint written before adapter manifests); CorruptCheckpointError when it
    has neither."""
    try:
        manifest, sha = store.read_manifest(prefix, layout.ADAPTER_MANIFEST_NAME)
    except CorruptCheckpointError as missing:
        try:
            whole, _ = store.read_manifest(prefix)
        except CorruptCheckpointError:
            raise missing from None
        return adapter_manifest(whole), adapter_sha256(whole)
    return manifest, sha


def adapter_ref(store: ObjectStore, ref: CheckpointRef | AdapterRef) -> tuple[AdapterRef, Manifest]:
    """``ref``'s adapter as an ``AdapterRef``, and its adapter manifest, checked to be the one ``ref`` names:
    CorruptCheckpointError when the checkpoint was published again (trained again, or overwritten) since."""
    prefix = store.key(ref.uri)
    if isinstance(ref, AdapterRef):
        manifest, sha = read_adapter_manifest(store, prefix)
        if sha != ref.adapter_sha256:
            raise CorruptCheckpointError(
                f"{ref.uri}: its adapter changed since step {ref.step} was published (adapter sha256 {sha[:12]}… "
                f"vs {ref.adapter_sha256[:12]}…): the step was trained again or overwritten"
            )
        return ref, manifest
    whole, sha = store.read_manifest(prefix)
    if sha != ref.manifest_sha256:
        raise CorruptCheckpointError(
            f"{ref.uri}: its manifest changed since step {ref.step} was published "
            f"(sha256 {sha[:12]}… vs {ref.manifest_sha256[:12]}…); it was overwritten"
        )
    servable = AdapterRef(run_id=ref.run_id, step=ref.step, uri=ref.uri, adapter_sha256=adapter_sha256(whole))
    return servable, adapter_manifest(whole)


def download_adapter(
    store: ObjectStore, ref: CheckpointRef | AdapterRef, local: Path
) -> tuple[AdapterRef, Manifest, bool]:
    """Download the adapter's files of ``ref`` (servable or resumable), each verified against the manifest ``ref``
    names, into ``local``; a copy verified against the same adapter is reused. The adapter, its manifest and
    whether it was downloaded now."""
    servable, manifest = adapter_ref(store, ref)
    prefix = store.key(ref.uri)
    fresh = _download(
        local, f"adapter {servable.adapter_sha256}", lambda tmp: store.get_dir(prefix, tmp, manifest)
    )
    return servable, manifest, fresh is not None


def _download(local: Path, verified: str, get: Callable[[Path], Manifest]) -> Manifest | None:
    """``get`` into a temporary directory renamed to ``local``, marked ``verified``; None when ``local`` already
    holds a copy so marked."""
    marker = local / VERIFIED_MARKER
    if marker.is_file() and marker.read_text() == verified:
        return None
    if local.exists():
        shutil.rmtree(local)
    tmp = local.with_name(f".{local.name}.download")
    if tmp.exists():
        shutil.rmtree(tmp)
    manifest = get(tmp)
    (tmp / VERIFIED_MARKER).write_text(verified)
    os.replace(tmp, local)
    return manifest
