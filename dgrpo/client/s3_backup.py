"""ART's S3 backup calls on a backend (``LocalBackend`` and ``TemporalBackend``): ``_experimental_push_to_s3``,
``_experimental_pull_from_s3`` and ``_experimental_pull_model_checkpoint``, on dgrpo's layout.

dgrpo's checkpoints already live durably in its store (``runs/<run id>/checkpoints/<step>/``, manifest last);
ART's live in a local directory that these calls copy to and from a bucket. Here the bucket (backup_bucket.py)
gets ART's layout, ``[<prefix>/]<project>/models/<run name>/``: the model's local files (``history.jsonl``,
``trajectories/``, ``state.json``) and each checkpoint of the store as ``checkpoints/<step:04d>/`` (the PEFT
adapter with its optimizer state and dgrpo's manifest). A pull (backup_pull.py) merges the local files back (so ``model.log``'s
running totals continue) and imports each checkpoint the store lacks, checked to fit the model (its base model
and LoRA shape, else ``ModelConflictError``) and published manifest last; a registered model is then served at
its newest step, so ``get_step()`` and the served adapter agree.
"""

from __future__ import annotations

import asyncio
import logging
import re
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from activities.object_store import ObjectStore
from dgrpo.client.backup_bucket import BackupBucket, backup_bucket_name
from dgrpo.client.backup_pull import (
    checkpoint_folder,
    download_checkpoint_files,
    import_checkpoint,
    md5_file,
    pull_files,
    restore_into,
)
from dgrpo.errors import NotRegisteredError
from dgrpo.model import Model, TrainableModel
from schemas import layout
from schemas.config import ModelSpec
from schemas.refs import CheckpointRef

log = logging.getLogger(__name__)

ExcludableOption = Literal["checkpoints", "logs", "trajectories"]
_CHECKPOINT = re.compile(rf"^{layout.ART_CHECKPOINTS_DIR}/(\d+)/(.+)$")


class ArtS3Backup:
    """ART's ``_experimental_*`` S3 calls for a backend (a mixin beside ``ArtTraining``)."""

    if TYPE_CHECKING:  # the Backend this mixes into

        async def start(self) -> None: ...

        def object_store(self) -> ObjectStore: ...

    async def _experimental_push_to_s3(
        self,
        model: Model,
        *,
        s3_bucket: str | None = None,
        prefix: str | None = None,
        verbose: bool = False,
        delete: bool = False,
    ) -> None:
        """Back the model up to ``s3_bucket`` (or ``$BACKUP_BUCKET``): its local files and, for a
        ``TrainableModel``, every checkpoint of dgrpo's store the bucket lacks. ``delete`` removes what the
        model no longer has from its backup. ``FileNotFoundError`` when there is nothing to back up."""
        bucket = BackupBucket(backup_bucket_name(s3_bucket))
        run = await self._run_of(model)
        base = layout.art_backup_prefix(prefix, model.project, model.storage_name())
        await asyncio.to_thread(push, bucket, base, model.local_log().dir, run, verbose, delete)

    async def _experimental_pull_from_s3(
        self,
        model: Model,
        *,
        s3_bucket: str | None = None,
        prefix: str | None = None,
        verbose: bool = False,
        delete: bool = False,
        only_step: int | Literal["latest"] | None = None,
        step: int | None = None,
        exclude: list[ExcludableOption] | None = None,
        latest_only: bool = False,
    ) -> None:
        """Restore the model from its backup: its local files, and each checkpoint the store lacks (``only_step``
        an int or ``"latest"``: that one only; ``exclude=["checkpoints"]``: none). Deprecated in ART, as here."""
        warnings.warn(
            "_experimental_pull_from_s3 is deprecated. Use _experimental_pull_model_checkpoint instead.",
            DeprecationWarning,
            stacklevel=2,
        )
        bucket = BackupBucket(backup_bucket_name(s3_bucket))
        base = layout.art_backup_prefix(prefix, model.project, model.storage_name())
        keys = await asyncio.to_thread(bucket.keys, base)
        steps = checkpoint_steps(keys, base)
        if only_step is None and latest_only:
            only_step = "latest"
        if step is None and only_step is not None:
            if only_step == "latest" and not steps:
                log.info("no checkpoint in %s", bucket.uri(base))
                return
            step = max(steps) if only_step == "latest" else int(only_step)
        skip: set[str] = set(exclude or [])
        if step is None:
            await asyncio.to_thread(
                pull_files, bucket, base, keys, model.local_log().dir, skip, delete, verbose
            )
            model.reload_local_log()  # state.json's running totals, as pulled
        run = await self._run_of(model) if "checkpoints" not in skip else None
        if run is None:
            return
        wanted = steps if step is None else [step]
        imported = [
            s for s in wanted if await asyncio.to_thread(import_checkpoint, bucket, base, run, s, verbose)
        ]
        if imported and self._registers(model):
            assert isinstance(model, TrainableModel)
            await model.register(model.backend())  # serve the newest step, so get_step() and the server agree

    async def _experimental_pull_model_checkpoint(
        self,
        model: TrainableModel,
        *,
        step: int | Literal["latest"] | None = None,
        local_path: str | None = None,
        s3_bucket: str | None = None,
        prefix: str | None = None,
        verbose: bool = False,
    ) -> str:
        """A checkpoint of the model as a local PEFT directory (registered or not): ``step``, or the newest in
        dgrpo's store and, when ``s3_bucket`` is given, its backup (the store's on a tie), copied into
        ``local_path`` or ``<base_path>/<project>/models/<run name>/checkpoints/<step:04d>``; returns the path.
        As ART's copy into ``local_path``: the checkpoint's files replace those of the same name and every other
        file there stays; a file that would land outside the directory is skipped with a warning."""
        run = await self._run_of(model)
        assert run is not None
        store, run_id, _ = run
        bucket = BackupBucket(s3_bucket) if s3_bucket else None
        base = layout.art_backup_prefix(prefix, model.project, model.storage_name())
        in_store = await asyncio.to_thread(complete_steps, store, run_id)
        in_bucket = checkpoint_steps(await asyncio.to_thread(bucket.keys, base), base) if bucket else []
        if step is None or step == "latest":
            if not in_store and not in_bucket:
                raise ValueError(
                    f"No checkpoints found for {model.project}/{model.storage_name()} in the store or S3"
                )
            step = max([*in_store, *in_bucket])
        target = Path(local_path) if local_path else local_checkpoint_dir(model, step)
        if step in in_store:
            prefix = layout.checkpoint_prefix(run_id, step)
            _, sha = await asyncio.to_thread(store.read_manifest, prefix)
            ref = CheckpointRef(run_id=run_id, step=step, uri=store.uri(prefix), manifest_sha256=sha)
            await asyncio.to_thread(
                restore_into, target, lambda tmp: store.get_checkpoint(ref, tmp), store.uri(prefix)
            )
        elif bucket is not None and step in in_bucket:
            folder = checkpoint_folder(base, step)
            await asyncio.to_thread(
                restore_into,
                target,
                lambda tmp: download_checkpoint_files(bucket, base, step, tmp),
                bucket.uri(folder),
            )
        else:
            where = "" if bucket is not None else " and no S3 bucket specified"
            raise FileNotFoundError(f"Checkpoint step {step} of run {run_id} not found{where}")
        if verbose:
            log.info("checkpoint step %d of %s is at %s", step, run_id, target)
        return str(target)

    async def _run_of(self, model: Model) -> tuple[ObjectStore, str, ModelSpec] | None:
        """For a ``TrainableModel``: this backend's store, and the model's run id and spec; None for a ``Model``."""
        if not isinstance(model, TrainableModel):
            return None
        run_id, spec = model.check_identity()
        await self.start()
        return self.object_store(), run_id, spec

    def _registers(self, model: Model) -> bool:
        try:
            return model.backend() is self
        except NotRegisteredError:
            return False


def local_checkpoint_dir(model: Model, step: int) -> Path:
    return model.local_log().dir / layout.ART_CHECKPOINTS_DIR / layout.art_checkpoint_name(step)


def checkpoint_steps(keys: list[str], base: str) -> list[int]:
    """The steps with a ``checkpoints/<step>/`` folder among a backup's keys, ascending."""
    return sorted({int(m.group(1)) for k in keys if (m := _CHECKPOINT.match(k[len(base) :]))})


def complete_steps(store: ObjectStore, run_id: str) -> list[int]:
    return [
        s for s in store.checkpoint_steps(run_id) if store.is_complete(layout.checkpoint_prefix(run_id, s))
    ]


def push(
    bucket: BackupBucket,
    base: str,
    local_dir: Path,
    run: tuple[ObjectStore, str, ModelSpec] | None,
    verbose: bool,
    delete: bool,
) -> None:
    files = [p for p in local_dir.rglob("*") if p.is_file()] if local_dir.is_dir() else []
    files = [p for p in files if p.relative_to(local_dir).parts[0] != layout.ART_CHECKPOINTS_DIR]
    steps = complete_steps(run[0], run[1]) if run is not None else []
    if not files and not steps:
        if run is None or not run[0].exists(layout.model_key(run[1])):
            raise FileNotFoundError(
                f"nothing to back up: {local_dir} does not exist and the model has no run"
            )
        log.info("nothing to back up yet for run %s: no local file and no checkpoint", run[1])
        return  # registered, before its first step (ART's model directory exists from register on)
    bucket.ensure_exists()
    have = bucket.etags(base)
    wanted: set[str] = set()
    for path in files:
        key = base + path.relative_to(local_dir).as_posix()
        wanted.add(key)
        if have.get(key) != md5_file(path):  # as ``aws s3 sync``: only what changed
            bucket.upload(path, key)
    if run is not None:
        store, run_id, _ = run
        for step in steps:
            wanted |= push_checkpoint(bucket, base, store, run_id, step, have, verbose)
    if delete:
        bucket.delete([k for k in have if k not in wanted])
    if verbose:
        log.info("backed up %d file(s) and %d checkpoint(s) to %s", len(files), len(steps), bucket.uri(base))


def push_checkpoint(
    bucket: BackupBucket,
    base: str,
    store: ObjectStore,
    run_id: str,
    step: int,
    have: dict[str, str],
    verbose: bool,
) -> set[str]:
    """Checkpoint ``step`` of the store into the backup (unless the backup has its manifest); its keys there."""
    prefix = layout.checkpoint_prefix(run_id, step)
    folder = checkpoint_folder(base, step)
    manifest_bytes = store.get_bytes(prefix + layout.MANIFEST_NAME)
    manifest, _ = store.read_manifest(prefix)
    keys = {folder + e.path for e in manifest.files} | {folder + layout.MANIFEST_NAME}
    if folder + layout.MANIFEST_NAME in have and bucket.read(folder + layout.MANIFEST_NAME) == manifest_bytes:
        return keys
    with tempfile.TemporaryDirectory() as tmp:
        store.get_dir(prefix, tmp)  # every file checked against its manifest
        for entry in manifest.files:
            bucket.upload(Path(tmp) / entry.path, folder + entry.path)
        (Path(tmp) / layout.MANIFEST_NAME).write_bytes(manifest_bytes)
        bucket.upload(
            Path(tmp) / layout.MANIFEST_NAME, folder + layout.MANIFEST_NAME
        )  # last, as in the store
    if verbose:
        log.info("checkpoint %d of %s backed up to %s", step, run_id, bucket.uri(folder))
    return keys
