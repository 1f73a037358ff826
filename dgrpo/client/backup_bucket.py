"""The S3 bucket ART's ``_experimental_push_to_s3`` / ``_experimental_pull_from_s3`` back a model up to, reached
as ART's ``aws s3 sync`` reaches it: the bucket named by ``s3_bucket`` or ``$BACKUP_BUCKET``, the endpoint by
``$AWS_ENDPOINT_URL_S3`` / ``$AWS_ENDPOINT_URL`` (else AWS), the region by ``$AWS_REGION`` /
``$AWS_DEFAULT_REGION``, the credentials by the AWS chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/
``AWS_SESSION_TOKEN``, ``~/.aws/credentials``, an instance role).

This is the user's own bucket, a trust domain apart from dgrpo's store: nothing here reads ``DGRPO_S3_*``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import urllib3
from minio import Minio
from minio.credentials import AWSConfigProvider, ChainedProvider, EnvAWSProvider, IamAwsProvider
from minio.deleteobjects import DeleteObject
from minio.error import S3Error

from dgrpo.errors import BackendError

BUCKET_ENV = "BACKUP_BUCKET"
ENDPOINT_ENVS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
REGION_ENVS = ("AWS_REGION", "AWS_DEFAULT_REGION")
AWS_S3 = "https://s3.amazonaws.com"


class ForbiddenBucketCreationError(BackendError):
    """ART's: the backup bucket does not exist and cannot be created with these credentials."""


class BackupBucketUnset(KeyError):
    """Neither ``s3_bucket=`` nor ``$BACKUP_BUCKET`` names the backup bucket (a ``KeyError``, as ART's)."""

    def __str__(self) -> str:
        return str(self.args[0])


def backup_bucket_name(s3_bucket: str | None, env: Mapping[str, str] = os.environ) -> str:
    """``s3_bucket``, else ``$BACKUP_BUCKET``; neither raises as ART does (``KeyError('BACKUP_BUCKET')``)."""
    name = s3_bucket or env.get(BUCKET_ENV)
    if not name:
        raise BackupBucketUnset(
            f"{BUCKET_ENV}: no backup bucket; pass s3_bucket=... or set {BUCKET_ENV} (and AWS_ENDPOINT_URL for a "
            "store other than AWS S3), as ART needs. dgrpo's checkpoints are already durable in its own store "
            "(runs/<run id>/checkpoints/); this backup copies them, and the model's local files, to your bucket"
        )
    return name


class BackupBucket:
    """One bucket of the user's S3, with the few operations a backup needs."""

    def __init__(self, bucket: str, env: Mapping[str, str] = os.environ) -> None:
        self.bucket = bucket
        url = next((env[v] for v in ENDPOINT_ENVS if env.get(v)), AWS_S3)
        self.endpoint = url.removeprefix("http://").removeprefix("https://").rstrip("/")
        self.client = Minio(
            self.endpoint,
            secure=not url.startswith("http://"),
            region=next((env[v] for v in REGION_ENVS if env.get(v)), None),
            credentials=ChainedProvider([EnvAWSProvider(), AWSConfigProvider(), IamAwsProvider()]),
            http_client=urllib3.PoolManager(timeout=urllib3.Timeout(connect=5.0, read=120.0), maxsize=8),
        )

    def uri(self, key: str = "") -> str:
        return f"s3://{self.bucket}/{key}"

    def ensure_exists(self) -> None:
        """Create the bucket if it does not exist (ART's ``ensure_bucket_exists``)."""
        if self.client.bucket_exists(self.bucket):
            return
        try:
            self.client.make_bucket(self.bucket)
        except S3Error as err:
            if err.code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise ForbiddenBucketCreationError(
                    f"Failed to create bucket {self.bucket} at {self.endpoint} ({err.code}). It may already "
                    "exist and belong to another user, or your credentials may be insufficient to create a bucket."
                ) from err

    def keys(self, prefix: str) -> list[str]:
        """Every key under ``prefix`` (none when the bucket does not exist, as ``aws s3 sync`` finds nothing)."""
        if not self.client.bucket_exists(self.bucket):
            return []
        return sorted(
            str(o.object_name) for o in self.client.list_objects(self.bucket, prefix, recursive=True)
        )

    def etags(self, prefix: str) -> dict[str, str]:
        """Each key under ``prefix`` and its ETag (the MD5 of an object uploaded in one part)."""
        if not self.client.bucket_exists(self.bucket):
            return {}
        objects = self.client.list_objects(self.bucket, prefix, recursive=True)
        return {str(o.object_name): str(o.etag or "").strip('"') for o in objects}

    def upload(self, local: Path, key: str) -> None:
        self.client.fput_object(self.bucket, key, str(local))

    def download(self, key: str, local: Path) -> None:
        """``key`` into ``local``, atomically (a temp file renamed into place)."""
        local.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=local.parent, prefix=f".{local.name}.")
        os.close(fd)
        try:
            self.client.fget_object(self.bucket, key, tmp)
            os.replace(tmp, local)
        finally:
            Path(tmp).unlink(missing_ok=True)

    def read(self, key: str) -> bytes | None:
        """The object's bytes; None when there is no such object."""
        try:
            response = self.client.get_object(self.bucket, key)
        except S3Error as err:
            if err.code in ("NoSuchKey", "NoSuchBucket"):
                return None
            raise
        try:
            return response.read()
        finally:
            response.close()
            response.release_conn()

    def delete(self, keys: list[str]) -> None:
        errors = list(self.client.remove_objects(self.bucket, (DeleteObject(k) for k in keys)))
        if errors:
            raise BackendError(f"could not delete {len(errors)} object(s) of {self.uri()}: {errors[0]}")
