"""ART's backend API (``art run``, ART's ``src/art/cli.py``), each endpoint what ART's server does with its
``LocalBackend``, here with dgrpo's durable backend: the request bodies as ART's clients send them (NeMo Agent
Toolkit's ``RemoteBackend``), errors as ``{"detail": ...}`` with a status that says whose they are (400/409: the
request's; 503: the backend's).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, ValidationError

from dgrpo.art_server.models import ArtModelJson, ServedModels
from dgrpo.art_server.training import TrainModelRequest, train_rows
from dgrpo.client.backup_bucket import BUCKET_ENV, BackupBucketUnset, backup_bucket_name
from dgrpo.errors import BackendError, ModelConflictError, UnsupportedArtFeature
from dgrpo.model import Model
from schemas.errors import DgrpoError, RunSpecError
from serving.vllm_plugin.dgrpo_key_guard import require_key

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/healthcheck"})


class ArtRequest(BaseModel):
    """A request body of ART's protocol: the model, and the call's own keys (an unknown key is an error)."""

    model_config = ConfigDict(extra="forbid")

    model: ArtModelJson


class DeleteCheckpointFiles(ArtRequest):
    steps_to_keep: list[int]


class PrepareForTraining(ArtRequest):
    config: dict[str, Any] | None = None
    """ART's ``dev.OpenAIServerConfig`` (``register(..., _openai_client_config=...)``)."""


class PushToS3(ArtRequest):
    s3_bucket: str | None = None
    prefix: str | None = None
    verbose: bool = False
    delete: bool = False


class PullFromS3(PushToS3):
    only_step: int | Literal["latest"] | None = None
    """ART 0.4's: one step (or the newest) only."""


def status_of(err: Exception) -> int:
    """The HTTP status of an error: the request's fault (4xx) or the backend's (5xx)."""
    if isinstance(err, ModelConflictError):
        return 409
    if isinstance(err, RunSpecError | UnsupportedArtFeature | ValidationError | ValueError):
        return 400
    if isinstance(err, BackendError):
        return 503
    return 500


def art_app(models: ServedModels, openai_port: int, api_key: str | None) -> FastAPI:
    """ART's API over ``models``; ``/_prepare_backend_for_training`` points clients at the OpenAI endpoint on
    ``openai_port`` of the address they reached this one at."""
    app = FastAPI(title="dgrpo art-server: ART's backend API")
    require_key(app, api_key, OPEN_PATHS)

    async def error(request: Request, err: Exception) -> JSONResponse:
        status = status_of(err)
        # Said here too: a client may show only the status (NeMo Agent Toolkit logs "500 Internal Server Error").
        log.log(logging.ERROR if status >= 500 else logging.WARNING, "%s %s: %d %s: %s", request.method,
                request.url.path, status, type(err).__name__, err)  # fmt: skip
        return JSONResponse({"detail": f"{type(err).__name__}: {err}"}, status_code=status)

    # Errors that say what to fix (anything else is a bug: FastAPI's plain 500, its traceback in the log).
    for kind in (DgrpoError, UnsupportedArtFeature, ValueError):
        app.add_exception_handler(kind, error)

    @app.get("/healthcheck")
    async def healthcheck() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/close")
    async def close() -> None:
        """ART's server closes its backend here (its vLLM, its trainer); this backend is shared by the server's
        clients and durable, so it stays up: stop the server to stop it."""

    @app.post("/register")
    async def register(model: ArtModelJson) -> None:
        """A ``TrainableModel`` is recorded under its run and its newest step served; a ``Model`` (not trained)
        needs nothing here (its ``log`` writes on the client)."""
        if model.trainable:
            await models.model(model)

    @app.post("/_get_step")
    async def get_step(model: ArtModelJson) -> int:
        if not model.trainable:
            return 0
        return await (await models.model(model)).get_step()

    @app.post("/_delete_checkpoint_files")
    async def delete_checkpoint_files(body: DeleteCheckpointFiles) -> None:
        """Delete the model's checkpoints but ``steps_to_keep`` and the one being served (the next step trains
        from it)."""
        trained = await models.model(body.model)
        await models.backend._delete_checkpoint_files(trained, body.steps_to_keep)

    @app.post("/_prepare_backend_for_training")
    async def prepare_backend_for_training(request: Request, body: PrepareForTraining) -> tuple[str, str]:
        """The OpenAI base URL and API key the model's requests go to: this server's endpoint, which serves the
        model's newest step under its name. ART's server settings (``config``) are checked by the settings rule:
        the endpoint's address and key are this server's operator's, the engine's the workers' operator's."""
        trained = await models.model(body.model)
        await models.backend._prepare_backend_for_training(trained, body.config)
        host = request.url.hostname or "127.0.0.1"
        return f"http://{host}:{openai_port}/v1", api_key or "default"

    @app.post("/_train_model")
    async def train_model(body: TrainModelRequest) -> StreamingResponse:
        """One durable ``TrainStep``; its metric rows as ART streams them, one JSON object per line. The step
        has trained (or failed, answered as an error) before the first line is sent."""
        rows = await train_rows(models, body)

        async def lines() -> AsyncIterator[str]:
            for row in rows:
                yield json.dumps(row) + "\n"

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    @app.post("/_experimental_pull_from_s3")
    async def pull_from_s3(body: PullFromS3) -> None:
        """Restore the model from its backup in the server operator's bucket (``$BACKUP_BUCKET``)."""
        model = await backup_model(models, body.model, body.s3_bucket)
        await models.backend._experimental_pull_from_s3(
            model,
            s3_bucket=operator_bucket(body.s3_bucket),
            prefix=body.prefix,
            verbose=body.verbose,
            delete=body.delete,
            only_step=body.only_step,
        )

    @app.post("/_experimental_push_to_s3")
    async def push_to_s3(body: PushToS3) -> None:
        """Back the model up to the server operator's bucket (``$BACKUP_BUCKET``)."""
        model = await backup_model(models, body.model, body.s3_bucket)
        await models.backend._experimental_push_to_s3(
            model, s3_bucket=operator_bucket(body.s3_bucket), prefix=body.prefix, verbose=body.verbose,
            delete=body.delete,
        )  # fmt: skip

    return app


def operator_bucket(s3_bucket: str | None) -> str:
    """The backup bucket of the server's operator (``$BACKUP_BUCKET``): a client may name it, not another one,
    since the server reaches it with the operator's credentials."""
    try:
        mine = backup_bucket_name(None)
    except BackupBucketUnset:
        raise UnsupportedArtFeature(
            f"this server backs models up to its operator's bucket, and its operator set none (${BUCKET_ENV})"
        ) from None
    if s3_bucket is not None and s3_bucket != mine:
        raise UnsupportedArtFeature(
            f"s3_bucket={s3_bucket!r}: this server backs models up only to its operator's bucket "
            f"(${BUCKET_ENV}, {mine!r}), reached with the operator's credentials; leave s3_bucket out"
        )
    return mine


async def backup_model(models: ServedModels, model: ArtModelJson, s3_bucket: str | None) -> Model:
    """The model a backup call is about: a registered ``TrainableModel``, or a ``Model`` (its local files only),
    whose local files are the server's (under its ``art_path``)."""
    operator_bucket(s3_bucket)  # refused before anything is registered
    if model.trainable:
        return await models.model(model)
    local = Model(name=model.name, project=model.project, base_path=models.art_path)
    _ = local.run_id  # a name that cannot name a run is refused: the local files are the server's (``../..``)
    return local
