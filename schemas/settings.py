"""Where the workers find Temporal and the object store: the environment, never workflow inputs.

``dgrpo env`` prints these variables for the embedded stack; production sets them to a real
Temporal cluster and MinIO, and the same workers run unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, SecretStr

ENV_TEMPORAL_ADDRESS = "DGRPO_TEMPORAL_ADDRESS"
ENV_TEMPORAL_NAMESPACE = "DGRPO_TEMPORAL_NAMESPACE"
ENV_S3_ENDPOINT = "DGRPO_S3_ENDPOINT"
ENV_S3_ACCESS_KEY = "DGRPO_S3_ACCESS_KEY"
ENV_S3_SECRET_KEY = "DGRPO_S3_SECRET_KEY"
ENV_S3_BUCKET = "DGRPO_S3_BUCKET"
ENV_S3_SECURE = "DGRPO_S3_SECURE"
ENV_HOME = "DGRPO_HOME"
ENV_CACHE = "DGRPO_CACHE"


class S3Settings(BaseModel):
    """How to reach the S3-compatible store."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    endpoint: str = Field(min_length=1)
    """``host:port`` (or ``http(s)://host:port``)."""
    access_key: str = Field(min_length=1)
    secret_key: SecretStr
    bucket: str = Field("dgrpo", pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
    secure: bool = False
    """Use TLS."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> S3Settings:
        e = os.environ if env is None else env
        missing = [k for k in (ENV_S3_ENDPOINT, ENV_S3_ACCESS_KEY, ENV_S3_SECRET_KEY) if not e.get(k)]
        if missing:
            raise KeyError(
                f'{", ".join(missing)} not set; run `eval "$(dgrpo env)"` after `dgrpo up`, '
                "or export them for your MinIO/S3"
            )
        return cls(
            endpoint=e[ENV_S3_ENDPOINT],
            access_key=e[ENV_S3_ACCESS_KEY],
            secret_key=SecretStr(e[ENV_S3_SECRET_KEY]),
            bucket=e.get(ENV_S3_BUCKET) or "dgrpo",
            secure=e.get(ENV_S3_SECURE, "").lower() in ("1", "true", "yes"),
        )


class TemporalSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    address: str = "127.0.0.1:7233"
    namespace: str = "default"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TemporalSettings:
        e = os.environ if env is None else env
        return cls(
            address=e.get(ENV_TEMPORAL_ADDRESS) or "127.0.0.1:7233",
            namespace=e.get(ENV_TEMPORAL_NAMESPACE) or "default",
        )


def dgrpo_home(env: Mapping[str, str] | None = None) -> str:
    """The embedded stack's state directory (``$DGRPO_HOME``, default ``./.dgrpo``)."""
    e = os.environ if env is None else env
    return os.path.abspath(e.get(ENV_HOME) or ".dgrpo")


def dgrpo_cache(env: Mapping[str, str] | None = None) -> str:
    """Where converted models are cached (``$DGRPO_CACHE``, default ``~/.cache/dgrpo``)."""
    e = os.environ if env is None else env
    return os.path.abspath(e.get(ENV_CACHE) or os.path.expanduser("~/.cache/dgrpo"))
