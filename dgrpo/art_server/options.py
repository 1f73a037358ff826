"""How ``dgrpo art-server`` runs: where it listens, its key, and the durable backend behind it."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

from schemas.config import TaskQueues
from schemas.errors import DgrpoError
from schemas.settings import ENV_ART_SERVER_API_KEY
from serving.options import is_loopback


class ArtServerError(DgrpoError, RuntimeError):
    """The server cannot start as asked (exposed without a key, a port taken); the message says what to change."""


ART_PORT = 7999
"""``art run``'s default port."""
OPENAI_PORT = 8000
"""The port ART's vLLM server answers on, and where NeMo Agent Toolkit's ART adapter checks ``/v1/models``."""


class ArtServerOptions(BaseModel):
    """The server's settings (its operator's), one ``--flag`` each."""

    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    """The address both listeners bind; beyond loopback only with an API key."""
    port: int = Field(ART_PORT, ge=0, le=65535)
    """ART's API (``art run --port``)."""
    openai_port: int = Field(OPENAI_PORT, ge=0, le=65535)
    """The OpenAI-compatible endpoint that serves each registered model's newest step under its name."""
    api_key: SecretStr | None = None
    """Bearer token both listeners require on every path but ``/healthcheck`` and ``/health``; required when
    ``host`` is not a loopback address. Default ``$DGRPO_ART_SERVER_API_KEY``."""
    backend: Literal["local", "temporal"] = "local"
    """``local``: ``LocalBackend(path)``, the embedded stack and workers here (reused when running); ``temporal``:
    ``TemporalBackend``, a cluster's (``DGRPO_TEMPORAL_ADDRESS``, ``DGRPO_S3_*``, ``DGRPO_INFERENCE_URL``)."""
    path: str = "./.dgrpo"
    """The ``LocalBackend``'s directory (``backend = "local"``)."""
    task_queues: TaskQueues = Field(default_factory=TaskQueues)
    """The workers' task queues (``dgrpo worker --control-queue ...``)."""
    art_path: str = "./.art"
    """Where the server keeps its models' local files (ART's ``LocalBackend`` path): a client's ``base_path`` is
    its own machine's and is not used here."""

    @model_validator(mode="after")
    def _check_exposure(self) -> ArtServerOptions:
        if self.api_key is None and not is_loopback(self.host):
            raise ValueError(
                f"--host {self.host} serves beyond this machine, so the server needs an API key: pass "
                f"--api-key or set {ENV_ART_SERVER_API_KEY} (or bind --host 127.0.0.1)"
            )
        if self.port == self.openai_port and self.port != 0:
            raise ValueError(f"--port and --openai-port are both {self.port}: give them different ports")
        return self


def api_key_from_env() -> str | None:
    """``$DGRPO_ART_SERVER_API_KEY``, if set."""
    return os.environ.get(ENV_ART_SERVER_API_KEY) or None


def art_server_options(**flags: object) -> ArtServerOptions:
    """The options from the command's flags; a refusal (``ArtServerError``) says what to change."""
    try:
        return ArtServerOptions.model_validate(flags)
    except ValidationError as err:
        raise ArtServerError(
            "; ".join(e["msg"].removeprefix("Value error, ") for e in err.errors())
        ) from None
