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
- ``manifest.json`` (in S3 only): every file with its sha256, written last by ``ObjectStore.put_dir``.
- ``.sha256.json`` (staged only, never uploaded): each file's sha256 as staging wrote it, so publishing does
  not read the files twice.
"""

from __future__ import annotations

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
from schemas.refs import CheckpointRef, Manifest

log = logging.getLogger(__name__)

TRAINER_STATE_FILE = "trainer_state.json"
METRICS_FILE = "metrics.json"
HASHES_FILE = ".sha256.json"
"""In a staged checkpoint: each file's sha256, computed from the bytes staging wrote."""
VERIFIED_MARKER = ".manifest_sha256"
"""In a downloaded checkpoint: the sha256 of the manifest its files were verified against."""


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


def publish_staged(
    store: ObjectStore, staging: Path, run_id: str, step: int, metadata: dict[str, Any] | None = None
) -> CheckpointRef:
    """Upload a staged checkpoint (manifest last); a complete checkpoint with the same files is reused."""
    if not (staging / TRAINER_STATE_FILE).is_file():
        raise CorruptCheckpointError(f"{staging} is not a staged checkpoint (no {TRAINER_STATE_FILE})")
    prefix = layout.checkpoint_prefix(run_id, step)
    hashes = staged_hashes(staging)
    if store.is_complete(prefix):
        local = {
            rel: hashes.get(rel) or sha256_file(p)[0]
            for p in staging.rglob("*")
            if p.is_file()
            and not p.name.startswith(".")
            and (rel := p.relative_to(staging).as_posix()) != layout.MANIFEST_NAME
        }
        try:
            manifest, sha = store.read_manifest(prefix)
        except CorruptCheckpointError:
            manifest, sha = None, ""
        if manifest is not None and {e.path: e.sha256 for e in manifest.files} == local:
            log.info("checkpoint %s already published with the same files", store.uri(prefix))
            return CheckpointRef(run_id=run_id, step=step, uri=store.uri(prefix), manifest_sha256=sha)
    meta = {k: v for k, v in (metadata or {}).items() if isinstance(v, str | int | float | bool) or v is None}
    return store.publish_checkpoint(staging, run_id, step, meta, hashes)


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


def download_checkpoint(
    store: ObjectStore, ref: CheckpointRef, local: Path, only: Callable[[str], bool] | None = None
) -> Manifest | None:
    """Download the published checkpoint ``ref`` (``ObjectStore.get_checkpoint``: its manifest is the one
    published, every file sha256-verified) into ``local``: all its files, or ``only`` some (the adapter's, to
    serve it). A copy verified against that manifest is reused: then None, else the manifest."""
    marker = local / VERIFIED_MARKER
    verified = ref.manifest_sha256 if only is None else f"{ref.manifest_sha256} (some files)"
    if marker.is_file() and marker.read_text() == verified:
        return None
    if local.exists():
        shutil.rmtree(local)
    tmp = local.with_name(f".{local.name}.download")
    if tmp.exists():
        shutil.rmtree(tmp)
    manifest = store.get_checkpoint(ref, tmp, only)
    (tmp / VERIFIED_MARKER).write_text(verified)
    os.replace(tmp, local)
    return manifest
