"""ART's ``/_train_model`` (0.5.17's streaming call, which NeMo Agent Toolkit's ``RemoteBackend`` makes): each
call one durable ``TrainStep`` of the model's next step, its metric rows returned as ART streams them.

A call is identified by what it asks (the model's run, the groups, the config), hashed (``request_digest``) and
recorded under the step it trains (``layout.art_request_key``) before the step starts. So a client that lost its
connection mid-train, or whose server was restarted, and calls again gets that step's result, never a second
training: while the step runs, the repeat waits for it (the workflow id names the model and step, so a restarted
server's ``register`` waits for it too, dgrpo/client/registration.py); once it is done, the repeat finds its
digest recorded at the model's newest step and gets that step's rows. The same groups sent again on purpose are
the same request: they train once.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from activities.object_store import ObjectStore
from dgrpo.art_compat.options import train_config_fields
from dgrpo.art_server.models import ArtModelJson, ServedModels
from dgrpo.client.train_step import train_step_result, train_workflow_id
from dgrpo.errors import EmptyGroupsError
from dgrpo.model import TrainableModel
from dgrpo.model_log.run_metrics import train_result_metrics
from dgrpo.types import TrainConfig as ArtTrainConfig
from schemas import layout
from schemas.run_state import TrainStepResult
from schemas.trajectory import TrajectoryGroup


class TrainModelRequest(BaseModel):
    """The body of ART's ``/_train_model``."""

    model_config = ConfigDict(extra="forbid")

    model: ArtModelJson
    trajectory_groups: list[dict[str, Any]]
    """ART's ``TrajectoryGroup.model_dump()`` each."""
    config: dict[str, Any] = Field(default_factory=dict)
    """ART's ``TrainConfig`` (``learning_rate``, ``beta``, ...), or dgrpo's, as the client's ``art`` dumps it."""
    dev_config: dict[str, Any] = Field(default_factory=dict)
    """ART's ``dev.TrainConfig``: mapped where dgrpo has the setting, refused otherwise (``_train_model``)."""
    verbose: bool = False


def request_digest(run_id: str, request: TrainModelRequest) -> str:
    """The sha256 of what the call asks: its model's run, groups, config and dev config (keys sorted)."""
    asked = {
        "run_id": run_id,
        "trajectory_groups": request.trajectory_groups,
        "config": request.config,
        "dev_config": request.dev_config,
    }
    return hashlib.sha256(json.dumps(asked, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def trajectory_groups(raw: list[dict[str, Any]]) -> list[TrajectoryGroup]:
    """The groups as dgrpo reads stored ones (strictly: a field that is not a trajectory's is an error)."""
    groups = []
    for i, group in enumerate(raw):
        try:
            groups.append(TrajectoryGroup.model_validate(group))
        except ValidationError as err:
            raise EmptyGroupsError(f"trajectory_groups[{i}] is not a TrajectoryGroup: {err}") from None
    return groups


OURS = frozenset(ArtTrainConfig.model_fields) | {"beta"}
"""``config`` keys of a ``TrainConfig`` (dgrpo's fields, and ART's ``beta``); the rest are ART's options."""


def step_config(config: dict[str, Any]) -> ArtTrainConfig:
    """The step's ``TrainConfig`` from the request's ``config``: its ``TrainConfig`` fields as set there, ART's
    other options mapped as ``backend.train``'s are. ART's clients send every field of their ``TrainConfig``, so a
    field at its default counts as unset."""
    ours = {k: v for k, v in config.items() if k in OURS}
    fields = ArtTrainConfig.model_validate(ours).model_dump(exclude_defaults=True)
    fields.update(
        train_config_fields("/_train_model config", {k: v for k, v in config.items() if k not in OURS})
    )
    # Set here is what the client set: the model's defaults, then ART's, fill the rest (``model.step_config``).
    return ArtTrainConfig.model_validate(fields)


def recorded_request(store: ObjectStore, run_id: str, step: int) -> str | None:
    """The digest of the request that trained ``step``, if one of this server's calls did."""
    key = layout.art_request_key(run_id, step)
    if not store.exists(key):
        return None
    return str(json.loads(store.get_bytes(key)).get("sha256"))


def record_request(store: ObjectStore, run_id: str, step: int, digest: str) -> None:
    store.put_bytes(layout.art_request_key(run_id, step), json.dumps({"sha256": digest}).encode())


async def train_rows(models: ServedModels, request: TrainModelRequest) -> list[dict[str, float]]:
    """Train the model's next step on the request's groups (or give the step this very request trained its
    rows again); the step's rows as the backend yields them."""
    groups = trajectory_groups(request.trajectory_groups)
    config = step_config(request.config)
    # What cannot be trained is refused before anything is stored (``_train_model`` checks them again).
    config.for_step()
    train_config_fields("/_train_model dev_config", request.dev_config)
    model = await models.model(request.model)
    digest = request_digest(model.run_id, request)
    store = models.backend.object_store()
    async with models.training(model):
        newest = model.served_step
        if newest > 0 and await asyncio.to_thread(recorded_request, store, model.run_id, newest) == digest:
            return [train_result_metrics(await finished_step(models, model, newest))]
        await asyncio.to_thread(record_request, store, model.run_id, newest + 1, digest)
        backend = models.backend
        train = backend._train_model(model, groups, config, request.dev_config, request.verbose)
        return [row async for row in train]


async def finished_step(models: ServedModels, model: TrainableModel, step: int) -> TrainStepResult:
    """The result of the model's ``TrainStep`` of ``step``, from its workflow."""
    client = await models.backend.temporal_client()
    handle = client.get_workflow_handle(train_workflow_id(model.run_id, step), result_type=TrainStepResult)
    return await train_step_result(handle)
