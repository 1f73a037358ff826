"""The object store: S3 (MinIO, SeaweedFS, AWS) through the ``minio`` client, with checkpoint manifests.

Methods are synchronous; async callers wrap them in ``asyncio.to_thread``. Transfers report each MiB moved to
the activity's current stage (activities/progress.py), so a transfer that hangs is seen. Errors are typed:
refused credentials raise ``StoreAuthError``, an unreachable endpoint ``StoreError`` (within seconds),
a missing manifest or a sha256/size mismatch ``CorruptCheckpointError``.
"""

from __future__ import annotations

import builtins
import concurrent.futures
import contextvars
import hashlib
import io
import logging
import os
import re
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import urllib3
from minio import Minio
from minio.deleteobjects import DeleteObject
from minio.error import S3Error
from urllib3 import BaseHTTPResponse

from activities import progress
from host.files import inside
from schemas import layout
from schemas import settings as env_names
from schemas.errors import CorruptCheckpointError, ForeignObjectError, StoreAuthError, StoreError
from schemas.refs import CheckpointRef, Manifest, ManifestEntry, ObjectRef
from schemas.settings import S3Settings, WorkerLifecycle

log = logging.getLogger(__name__)

AUTH_CODES = frozenset({"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken"})
MISSING_CODES = frozenset({"NoSuchKey", "NoSuchObject", "NoSuchBucket", "ResourceNotFound"})
_CHUNK = 1 << 20
_STEP_DIR = re.compile(r"^(\d+)/$")

ManifestMetadata = dict[str, str | int | float | bool | None]
T = TypeVar("T")
R = TypeVar("R")


def parse_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/key`` -> ``(bucket, key)``."""
    if not uri.startswith("s3://") or "/" not in uri[5:]:
        raise ValueError(f"not an s3://bucket/key URI: {uri!r}")
    bucket, key = uri[5:].split("/", 1)
    return bucket, key


def sha256_file(path: str | Path) -> tuple[str, int]:
    """Hex sha256 and size of a local file."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


PART_SIZE = 64 << 20
"""Objects up to this size go up in one PUT; larger ones in parts of this size."""
UPLOADS_AT_ONCE = 4
"""Files of one directory uploaded at once (a checkpoint's adapter, optimizer state and small files)."""
RETRY_BACKOFF_MAX_S = 8.0
WORKER_OUTAGE_S = WorkerLifecycle().store_outage_s
"""How long a worker's store requests keep retrying unless its operator says otherwise
(``WorkerLifecycle.store_outage_s``): a store restart or a 60 s outage costs a wait, not a run."""


def _http_client(outage_s: float, read_timeout_s: float = 120.0) -> urllib3.PoolManager:
    """Retries of unreachable or failing (5xx) requests that last about ``outage_s``: a client gives up in
    seconds (a stopped store is a clear error at once), a worker rides out a restart of the store."""
    waited, attempts = 0.0, 1
    while waited < outage_s:
        waited += min(0.5 * 2 ** (attempts - 1), RETRY_BACKOFF_MAX_S)
        attempts += 1
    retries = urllib3.Retry(
        total=attempts,
        connect=attempts,
        read=attempts,
        status=attempts,
        backoff_factor=0.5,
        backoff_max=RETRY_BACKOFF_MAX_S,
        status_forcelist=(500, 502, 503, 504),
        allowed_methods=None,  # S3 writes are whole-object puts to fixed keys: safe to repeat
        raise_on_status=False,
    )
    return _SendingPool(
        timeout=urllib3.Timeout(connect=3.0, read=read_timeout_s), retries=retries, maxsize=16
    )


class _SendingPool(urllib3.PoolManager):
    """Sends a request's body block by block, each block reporting progress as it goes out: minio hands urllib3
    a whole part's bytes (up to ``PART_SIZE``), which would otherwise leave in one send that never advances."""

    def urlopen(  # type: ignore[override]  # as PoolManager.urlopen itself
        self, method: str, url: str, redirect: bool = True, **kw: Any
    ) -> BaseHTTPResponse:
        body = kw.get("body")
        if isinstance(body, bytes) and len(body) > _CHUNK:
            kw["body"] = _Sending(body)  # seekable: urllib3 rewinds it for a retry
        return super().urlopen(method, url, redirect, **kw)


class _Sending(io.BytesIO):
    """A request body whose every read (http.client reads each block just before it sends it) advances."""

    def read(self, size: int | None = -1) -> bytes:
        progress.advance()
        return super().read(size)


def _advancing(chunks: Iterator[bytes]) -> Iterator[bytes]:
    for chunk in chunks:
        progress.advance()
        yield chunk


def in_threads(work: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``work`` on each of ``items``, ``UPLOADS_AT_ONCE`` at a time, each in the caller's context: the threads
    that move a directory's files report to the activity's stage as the caller would (activities/progress.py)."""
    with concurrent.futures.ThreadPoolExecutor(UPLOADS_AT_ONCE) as pool:
        futures = [pool.submit(contextvars.copy_context().run, work, item) for item in items]
        return [f.result() for f in futures]


class ObjectStore:
    """One bucket of an S3-compatible store."""

    def __init__(self, settings: S3Settings, outage_s: float = 1.0, read_timeout_s: float = 120.0) -> None:
        """``outage_s``: how long a request keeps retrying an unreachable store (workers: ``WORKER_OUTAGE_S``);
        ``read_timeout_s``: how long a request waits for an answer (a trainer gang's records: seconds)."""
        self.settings = settings
        self.bucket = settings.bucket
        endpoint = settings.endpoint.removeprefix("http://").removeprefix("https://").rstrip("/")
        self.endpoint = endpoint
        secure = settings.secure or settings.endpoint.startswith("https://")
        self.client = Minio(
            endpoint,
            access_key=settings.access_key,
            secret_key=settings.secret_key.get_secret_value(),
            secure=secure,
            region="us-east-1",  # skips the bucket-location round trip; SeaweedFS and MinIO accept it
            http_client=_http_client(outage_s, read_timeout_s),
        )

    @classmethod
    def from_env(cls, outage_s: float = 1.0) -> ObjectStore:
        """Built from ``DGRPO_S3_*`` (see schemas/settings.py)."""
        return cls(S3Settings.from_env(), outage_s)

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def key(self, key_or_uri: str) -> str:
        """Accept a key or an ``s3://`` URI of this bucket; return the key. Any other URI (``file://``, another
        bucket) raises ``ForeignObjectError``: whatever a workflow input names, a worker reads only its store."""
        if "://" not in key_or_uri:
            return key_or_uri
        try:
            bucket, key = parse_uri(key_or_uri)
        except ValueError:
            bucket, key = "", ""
        if bucket != self.bucket or not key:
            raise ForeignObjectError(
                f"{key_or_uri[:200]} is not in this worker's object store (s3://{self.bucket}/): a worker reads "
                "only its own store's objects; upload the file there (model.train and "
                "trajectory_store.upload_groups do) and pass the s3:// URI they return"
            )
        return key

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """Translate client and network errors into our typed errors."""
        try:
            yield
        except S3Error as err:
            if err.code in AUTH_CODES:
                raise StoreAuthError(
                    f"the S3 store at {self.endpoint} refused access key {self.settings.access_key!r} "
                    f"({err.code}) while trying to {what}; check {env_names.ENV_S3_ACCESS_KEY} and "
                    f'{env_names.ENV_S3_SECRET_KEY} (`eval "$(dgrpo env)"` for the embedded stack)'
                ) from err
            raise StoreError(f"S3 {what} failed at {self.endpoint}: {err.code}: {err.message}") from err
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise StoreError(
                f"cannot reach the S3 store at {self.endpoint} ({type(err).__name__}) while trying to "
                f"{what}; is it running? (`dgrpo up`, or check {env_names.ENV_S3_ENDPOINT})"
            ) from err

    # ---- buckets and single objects -------------------------------------------------------------
    def ensure_bucket(self) -> None:
        """Create the bucket if it does not exist."""
        with self._errors(f"create bucket {self.bucket}"):
            if not self.client.bucket_exists(self.bucket):
                try:
                    self.client.make_bucket(self.bucket)
                except S3Error as err:  # created concurrently by another worker
                    if err.code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                        raise

    def _put_stream(self, key: str, data: BinaryIO, size: int, sha256: str) -> ObjectRef:
        with self._errors(f"upload {self.uri(key)}"):
            # One PUT up to PART_SIZE (minio's default cuts 5 MiB parts: a multipart upload, each part a round trip)
            self.client.put_object(
                self.bucket,
                key,
                data,
                size,
                metadata={"sha256": sha256},
                part_size=PART_SIZE,
            )
        return ObjectRef(uri=self.uri(key), size=size, sha256=sha256)

    def put_bytes(self, key: str, data: bytes, sha256: str | None = None) -> ObjectRef:
        """Upload ``data`` to ``key``; ``sha256``: its digest where the caller has it (not computed again)."""
        key = self.key(key)
        return self._put_stream(key, io.BytesIO(data), len(data), sha256 or hashlib.sha256(data).hexdigest())

    def put_file(self, local: str | Path, key: str) -> ObjectRef:
        key = self.key(key)
        sha256, size = sha256_file(local)
        with open(local, "rb") as f:
            return self._put_stream(key, f, size, sha256)

    def get_bytes(self, key: str) -> bytes:
        key = self.key(key)
        with self._errors(f"download {self.uri(key)}"):
            response = self.client.get_object(self.bucket, key)
            try:
                return b"".join(_advancing(response.stream(_CHUNK)))
            finally:
                response.close()
                response.release_conn()

    def get_file(self, key: str, local: str | Path) -> Path:
        """Download to ``local`` atomically (a temp file renamed into place); returns the path."""
        key = self.key(key)
        target = Path(local)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        os.close(fd)
        try:
            with self._errors(f"download {self.uri(key)}"):
                response = self.client.get_object(self.bucket, key)
                try:
                    with open(tmp, "wb") as f:
                        for chunk in _advancing(response.stream(_CHUNK)):
                            f.write(chunk)
                finally:
                    response.close()
                    response.release_conn()
            os.replace(tmp, target)
        finally:
            Path(tmp).unlink(missing_ok=True)
        return target

    def exists(self, key: str) -> bool:
        key = self.key(key)
        try:
            with self._errors(f"stat {self.uri(key)}"):
                self.client.stat_object(self.bucket, key)
        except StoreError as err:
            if isinstance(err.__cause__, S3Error) and err.__cause__.code in MISSING_CODES:
                return False
            raise
        return True

    def list(self, prefix: str = "", recursive: bool = True) -> list[str]:
        """Keys under ``prefix`` (with ``recursive=False``, also the immediate sub-prefixes, ending in /)."""
        prefix = self.key(prefix)
        with self._errors(f"list {self.uri(prefix)}"):
            return sorted(
                str(o.object_name)
                for o in self.client.list_objects(self.bucket, prefix=prefix, recursive=recursive)
            )

    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under ``prefix``; returns how many there were."""
        keys = self.list(prefix)
        with self._errors(f"delete {self.uri(prefix)}"):
            errors = list(self.client.remove_objects(self.bucket, (DeleteObject(k) for k in keys)))
        if errors:
            raise StoreError(
                f"could not delete {len(errors)} object(s) under {self.uri(prefix)}: {errors[0]}"
            )
        return len(keys)

    def remove_bucket(self) -> None:
        """Delete every object and then the bucket itself (test fixtures, throwaway runs)."""
        self.delete_prefix("")
        with self._errors(f"remove bucket {self.bucket}"):
            self.client.remove_bucket(self.bucket)

    # ---- directories with manifests (checkpoints) -------------------------------------------------
    def put_dir(
        self,
        local_dir: str | Path,
        prefix: str,
        metadata: ManifestMetadata | None = None,
        sha256: dict[str, str] | None = None,
        *,
        only: Callable[[str], bool] | None = None,
        present: Mapping[str, ManifestEntry] | None = None,
        manifest_name: str = layout.MANIFEST_NAME,
    ) -> ObjectRef:
        """Upload every file under ``local_dir`` (several at once), then the manifest LAST; returns the manifest's
        ref. Hidden files (a name starting with ``.``) are local bookkeeping and stay behind. ``sha256``: the
        files' digests where the caller has them (computed as it wrote them), so they are not read twice.
        ``only``: the files (paths under ``local_dir``) to upload, default all; ``present``: files already in
        place under ``prefix`` (listed in the manifest, not uploaded again); ``manifest_name``: the manifest's.

        A reader that finds the manifest knows every file listed in it is already in place.
        """
        root = Path(local_dir)
        prefix = self.key(prefix).rstrip("/") + "/"
        if not root.is_dir():
            raise FileNotFoundError(f"{root} is not a directory")
        manifests = (layout.MANIFEST_NAME, layout.ADAPTER_MANIFEST_NAME)
        files = [
            (path, rel)
            for path in sorted(p for p in root.rglob("*") if p.is_file())
            if not path.name.startswith(".")
            and (rel := path.relative_to(root).as_posix()) not in manifests
            and (only is None or only(rel))
        ]  # a manifest from an earlier download is not uploaded: a fresh one is written below
        known = sha256 or {}
        present = present or {}

        def put(path: Path, rel: str) -> ManifestEntry:
            digest = known.get(rel)
            if digest is None:
                ref = self.put_file(path, prefix + rel)
            else:
                with open(path, "rb") as f:
                    ref = self._put_stream(prefix + rel, f, os.fstat(f.fileno()).st_size, digest)
            return ManifestEntry(path=rel, size=ref.size, sha256=ref.sha256)

        entries = in_threads(lambda file: present.get(file[1]) or put(*file), files)
        manifest = Manifest(files=entries, metadata=dict(metadata or {}))
        return self.put_bytes(prefix + manifest_name, manifest.model_dump_json(indent=2).encode())

    def read_manifest(self, prefix: str, name: str = layout.MANIFEST_NAME) -> tuple[Manifest, str]:
        """The manifest under ``prefix`` (``name``: the adapter's, for a servable checkpoint) and its sha256;
        CorruptCheckpointError when missing or invalid."""
        prefix = self.key(prefix).rstrip("/") + "/"
        key = prefix + name
        try:
            raw = self.get_bytes(key)
        except StoreError as err:
            if isinstance(err.__cause__, S3Error) and err.__cause__.code in MISSING_CODES:
                raise CorruptCheckpointError(
                    f"{self.uri(prefix)} has no {name}: the upload is incomplete "
                    "(interrupted before its manifest was written) or the prefix is wrong"
                ) from None
            raise
        try:
            manifest = Manifest.model_validate_json(raw)
        except ValueError as err:
            raise CorruptCheckpointError(f"{self.uri(key)} is not a valid manifest: {err}") from None
        return manifest, hashlib.sha256(raw).hexdigest()

    def get_dir(
        self,
        prefix: str,
        local_dir: str | Path,
        manifest: Manifest | None = None,
        only: Callable[[str], bool] | None = None,
    ) -> Manifest:
        """Download a manifested upload into ``local_dir`` (several files at once), verifying every file's size
        and sha256 as it arrives. ``manifest``: the one already read; ``only``: the files (manifest paths) to
        download, default all."""
        prefix = self.key(prefix).rstrip("/") + "/"
        if manifest is None:
            manifest, _ = self.read_manifest(prefix)
        root = Path(local_dir)
        root.mkdir(parents=True, exist_ok=True)
        entries = [e for e in manifest.files if only is None or only(e.path)]
        places: dict[str, Path] = {}
        for entry in entries:
            place = inside(root, entry.path)
            if place is None:
                raise CorruptCheckpointError(
                    f"{self.uri(prefix)}: manifest path {entry.path!r} would be written outside {root}"
                )
            places[entry.path] = place

        def get(entry: ManifestEntry) -> None:
            sha256, size = self._get_verified(prefix + entry.path, places[entry.path])
            if size != entry.size or sha256 != entry.sha256:
                places[entry.path].unlink()
                raise CorruptCheckpointError(
                    f"{self.uri(prefix + entry.path)} does not match its manifest: size {size} vs {entry.size}, "
                    f"sha256 {sha256[:12]}… vs {entry.sha256[:12]}…; the checkpoint is corrupt or was overwritten"
                )

        in_threads(get, entries)
        return manifest

    def _get_verified(self, key: str, local: Path) -> tuple[str, int]:
        """Download ``key`` to ``local`` atomically, hashing it as it arrives; its sha256 and size."""
        local.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=local.parent, prefix=f".{local.name}.")
        digest, size = hashlib.sha256(), 0
        try:
            with self._errors(f"download {self.uri(key)}"), os.fdopen(fd, "wb") as out:
                response = self.client.get_object(self.bucket, key)
                try:
                    for chunk in _advancing(response.stream(_CHUNK)):
                        digest.update(chunk)
                        out.write(chunk)
                        size += len(chunk)
                finally:
                    response.close()
                    response.release_conn()
            os.replace(tmp, local)
        finally:
            Path(tmp).unlink(missing_ok=True)
        return digest.hexdigest(), size

    def get_checkpoint(
        self, ref: CheckpointRef, local_dir: str | Path, only: Callable[[str], bool] | None = None
    ) -> Manifest:
        """Download a published checkpoint (``only`` some of its files), refusing it if its manifest is not the
        one published."""
        prefix = self.key(ref.uri).rstrip("/") + "/"
        manifest, sha256 = self.read_manifest(prefix)
        if sha256 != ref.manifest_sha256:
            raise CorruptCheckpointError(
                f"{ref.uri}: its manifest changed since step {ref.step} was published "
                f"(sha256 {sha256[:12]}… vs {ref.manifest_sha256[:12]}…); it was overwritten"
            )
        return self.get_dir(prefix, local_dir, manifest, only)

    def is_complete(self, prefix: str) -> bool:
        """True when the prefix has its manifest (the upload finished)."""
        return self.exists(self.key(prefix).rstrip("/") + "/" + layout.MANIFEST_NAME)

    # ---- checkpoints of a run -----------------------------------------------------------------------
    def publish_checkpoint(
        self,
        local_dir: str | Path,
        run_id: str,
        step: int,
        metadata: ManifestMetadata | None = None,
        sha256: dict[str, str] | None = None,
        present: Mapping[str, ManifestEntry] | None = None,
    ) -> CheckpointRef:
        """Upload ``local_dir`` as the run's checkpoint of ``step`` (manifest last; ``sha256`` and ``present`` as
        in ``put_dir``)."""
        prefix = layout.checkpoint_prefix(run_id, step)
        meta: ManifestMetadata = {"run_id": run_id, "step": step, **(metadata or {})}
        ref = self.put_dir(local_dir, prefix, meta, sha256, present=present)
        return CheckpointRef(run_id=run_id, step=step, uri=self.uri(prefix), manifest_sha256=ref.sha256)

    def checkpoint_steps(self, run_id: str) -> builtins.list[int]:
        """Steps that have a checkpoint prefix (complete or not), ascending."""
        base = layout.checkpoints_prefix(run_id)
        steps: builtins.list[int] = []  # `list` is a method of this class
        for name in self.list(base, recursive=False):
            match = _STEP_DIR.match(name[len(base) :])
            if match:
                steps.append(int(match.group(1)))
        return sorted(steps)

    def checkpoint_ref(self, run_id: str, step: int) -> CheckpointRef:
        """The run's checkpoint of ``step`` as its manifest names it; CorruptCheckpointError when it has none (not
        resumable) or an invalid one."""
        prefix = layout.checkpoint_prefix(run_id, step)
        _, sha256 = self.read_manifest(prefix)
        return CheckpointRef(run_id=run_id, step=step, uri=self.uri(prefix), manifest_sha256=sha256)

    def latest_checkpoint(self, run_id: str) -> CheckpointRef | None:
        """The newest checkpoint of the run that has a manifest; incomplete ones are skipped."""
        for step in reversed(self.checkpoint_steps(run_id)):
            try:
                return self.checkpoint_ref(run_id, step)
            except CorruptCheckpointError:
                log.warning(
                    "skipping checkpoint %s: no valid manifest",
                    self.uri(layout.checkpoint_prefix(run_id, step)),
                )
        return None
