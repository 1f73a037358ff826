"""Restoring from an ART backup (``_experimental_pull_from_s3``, ``_experimental_pull_model_checkpoint``), as ART's
``aws s3 sync`` and copy do it: into a directory, merged with what is there (nothing of it deleted unless the
user asks ART's ``delete=True``), every object kept inside the directory (a key that would leave it, by ``..``, a
``/`` after the prefix or a link already there, is skipped with a warning naming it, as the AWS CLI skips it), and
a checkpoint imported into dgrpo's store only when it fits the model.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from activities.checkpoints import TRAINER_STATE_FILE, TrainerState, check_checkpoint_fits
from activities.object_store import ObjectStore, sha256_file
from dgrpo.client.backup_bucket import BackupBucket
from dgrpo.errors import ModelConflictError
from host.files import inside, merge_dir
from schemas import layout
from schemas.config import ModelSpec
from schemas.errors import CheckpointMismatchError, CorruptCheckpointError

log = logging.getLogger(__name__)


def checkpoint_folder(base: str, step: int) -> str:
    """``<base>checkpoints/<step:04d>/``: a checkpoint's folder in a backup."""
    return f"{base}{layout.ART_CHECKPOINTS_DIR}/{layout.art_checkpoint_name(step)}/"


def skip_key(uri: str, root: Path) -> None:
    """Warn that the object at ``uri`` is left out: its key would put it outside ``root``."""
    warnings.warn(
        f"Skipping {uri}: its key would write it outside {root} ('..', '/' after the prefix, or a link "
        "out of the directory); as the AWS CLI, nothing of it was written",
        UserWarning,
        stacklevel=2,
    )


def restore_into(target: Path, fetch: Callable[[Path], object], where: str) -> None:
    """``fetch(folder)`` a checkpoint into a fresh folder inside ``target``, then merge it into ``target``
    (``host.files.merge_dir``): nothing already there is deleted, a file of the same name is replaced."""
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".dgrpo-pull-", dir=target) as tmp:
        fetch(Path(tmp))
        for rel in merge_dir(tmp, target):
            skip_key(f"{where}{rel}", target)


def md5_file(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def pull_files(
    bucket: BackupBucket,
    base: str,
    keys: list[str],
    local_dir: Path,
    skip: set[str],
    delete: bool,
    verbose: bool,
) -> None:
    """The backup's files other than checkpoints into ``local_dir`` (``skip``: top folders left out)."""
    have = bucket.etags(base)
    pulled: set[Path] = set()
    for key in keys:
        rel = key[len(base) :]
        top = rel.split("/", 1)[0]
        if top == layout.ART_CHECKPOINTS_DIR or top in skip:
            continue
        target = inside(local_dir, rel)
        if target is None:
            skip_key(bucket.uri(key), local_dir)
            continue
        pulled.add(target)
        if not target.is_file() or md5_file(target) != have.get(key):
            bucket.download(key, target)
    if delete and local_dir.is_dir():  # ART's ``aws s3 sync --delete``: the model's files the backup lacks
        for path in local_dir.rglob("*"):
            top = path.relative_to(local_dir).parts[0]
            if (
                path.is_file()
                and path.resolve() not in pulled
                and top not in (layout.ART_CHECKPOINTS_DIR, *skip)
            ):
                path.unlink()
    if verbose:
        log.info("pulled %d file(s) from %s into %s", len(pulled), bucket.uri(base), local_dir)


def download_checkpoint_files(bucket: BackupBucket, base: str, step: int, target: Path) -> None:
    """Checkpoint ``step`` of the backup into the fresh folder ``target``, each file checked against its manifest
    when it has one; a key that would leave ``target`` is skipped with a warning."""
    folder = checkpoint_folder(base, step)
    keys = bucket.keys(folder)
    if not keys:
        raise FileNotFoundError(f"Checkpoint step {step} not found in {bucket.uri(folder)}")
    for key in keys:
        if key == folder + layout.MANIFEST_NAME:
            continue
        place = inside(target, key[len(folder) :])
        if place is None:
            skip_key(bucket.uri(key), target)
        else:
            bucket.download(key, place)
    manifest = bucket.read(folder + layout.MANIFEST_NAME)
    for entry in json.loads(manifest)["files"] if manifest else []:
        place = inside(target, entry["path"])
        if place is None or not place.is_file() or sha256_file(place)[0] != entry["sha256"]:
            raise CorruptCheckpointError(f"{bucket.uri(folder + entry['path'])} does not match its manifest")


def import_checkpoint(
    bucket: BackupBucket, base: str, run: tuple[ObjectStore, str, ModelSpec], step: int, verbose: bool
) -> bool:
    """Publish checkpoint ``step`` of the backup as the run's, unless the store has it; True when imported."""
    store, run_id, spec = run
    if store.is_complete(layout.checkpoint_prefix(run_id, step)):
        return False
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / layout.art_checkpoint_name(step)
        download_checkpoint_files(bucket, base, step, folder)
        where = bucket.uri(checkpoint_folder(base, step))
        state = fitting_state(folder, spec, run_id, step, where)
        (folder / TRAINER_STATE_FILE).write_text(state.model_dump_json(indent=2))
        store.publish_checkpoint(folder, run_id, step, {"imported_from": where})
    if verbose:
        log.info("imported checkpoint %d of %s from %s", step, run_id, where)
    return True


def fitting_state(folder: Path, spec: ModelSpec, run_id: str, step: int, where: str) -> TrainerState:
    """The trainer state of a pulled checkpoint as this run's, refused (``ModelConflictError``) when the adapter
    was trained for another base model or LoRA shape than the model's."""
    config_file = folder / "adapter_config.json"
    if not config_file.is_file():
        raise ModelConflictError(
            f"{where} is not a LoRA adapter (no adapter_config.json): nothing was imported"
        )
    adapter: dict[str, Any] = json.loads(config_file.read_text())
    shape = (adapter.get("r"), adapter.get("lora_alpha"))
    if shape != (spec.lora.rank, spec.lora.alpha):
        raise ModelConflictError(
            f"{where} is a LoRA of rank {shape[0]}, alpha {shape[1]}; model {spec.name!r} trains rank "
            f"{spec.lora.rank}, alpha {spec.lora.alpha}: give it that lora_config, or pull into another model"
        )
    if (folder / TRAINER_STATE_FILE).is_file():
        state = TrainerState.model_validate_json((folder / TRAINER_STATE_FILE).read_text())
        try:
            check_checkpoint_fits(state, spec, where)
        except CheckpointMismatchError as err:
            raise ModelConflictError(str(err)) from err
        return state.model_copy(update={"run_id": run_id, "step": step})
    base = adapter.get("base_model_name_or_path")
    if base != spec.base_model:
        raise ModelConflictError(
            f"{where} was trained on base model {base!r} (its adapter_config.json); model {spec.name!r} trains "
            f"{spec.base_model!r}: give it base_model={base!r}, or pull into another model"
        )
    return TrainerState(
        run_id=run_id, step=step, base_model=spec.base_model, lora=spec.lora.model_dump(mode="json")
    )
