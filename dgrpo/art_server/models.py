"""The models ART clients registered with the server: each a dgrpo ``TrainableModel`` bound to the server's
backend, built from the model JSON every request of ART's protocol carries (``model.safe_model_dump()``).

Every request brings the whole model, so a model the server has not seen (the server restarted, or another
server registered it) is registered on first use: registering is idempotent, waits for a step an earlier
client left running, and serves the newest checkpoint (dgrpo/client/registration.py).
"""

from __future__ import annotations

import asyncio
import logging
import re
import warnings
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from dgrpo.client.temporal_backend import TemporalBackend
from dgrpo.errors import UnsupportedArtOption
from dgrpo.local.backend import LocalBackend
from dgrpo.model import TrainableModel
from schemas.config import LoraConfig

log = logging.getLogger(__name__)


class ArtModelJson(BaseModel):
    """The fields of an ART model's JSON (ART's ``Model``/``TrainableModel``, or dgrpo's) that the server reads.

    What is the client's own is not read: ``base_path`` (a directory on the client's machine), the inference
    fields (the client's view of the server), ``config`` (the program's settings; ART's clients send None),
    ``entity``, ``id`` and ``report_metrics`` (W&B, logged by the client's ``model.log``)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    name: str
    project: str = "default"
    trainable: bool = False
    base_model: str | None = None
    run_name: str | None = None
    """ART 0.5.23's run name."""
    run_id: str | None = None
    """ART 0.5.17's field: refused unless it is the model's run id, as dgrpo's ``TrainableModel`` refuses it."""
    lora: dict[str, Any] | None = None
    """dgrpo's LoRA shape (a dgrpo client's dump)."""
    lora_config: dict[str, Any] | None = None
    """ART 0.5's ``art.LoRAConfig``."""
    internal_config: dict[str, Any] | None = Field(None, alias="_internal_config")
    """ART's ``_internal_config``: mapped, warned about or refused as a ``TrainableModel`` does."""

    def trainable_model(self, art_path: str) -> TrainableModel:
        """This model as dgrpo trains it (its local files under the server's ``art_path``)."""
        if not self.trainable or self.base_model is None:
            raise UnsupportedArtOption(
                f"model {self.name!r} is not a TrainableModel (trainable={self.trainable}, base_model="
                f"{self.base_model!r}): only a TrainableModel trains and is served here"
            )
        return TrainableModel(
            name=self.name,
            project=self.project,
            base_model=self.base_model,
            lora=None if self.lora is None else LoraConfig.model_validate(self.lora),
            lora_config=self.lora_config,
            run_name=self.run_name,
            run_id=self.run_id,
            base_path=art_path,
            report_metrics=[],
            _internal_config=self.internal_config,
        )


ServerBackend = LocalBackend | TemporalBackend
"""The durable backends the server fronts (each with ART's ``_train_model`` and S3 backup calls)."""

STEP_SUFFIX = re.compile(r"^(?P<name>.+)@(?P<step>\d+)$")
"""``<name>@<step>``: ART's name of one step of a model."""


class ServedModels:
    """The trainable models the server's clients registered, by run id (``<project>-<run name or name>``)."""

    def __init__(self, backend: ServerBackend, art_path: str) -> None:
        self.backend = backend
        self.art_path = art_path
        self._models: dict[str, TrainableModel] = {}
        self._registering: dict[str, asyncio.Lock] = {}
        self._training: dict[str, asyncio.Lock] = {}

    async def model(self, body: ArtModelJson) -> TrainableModel:
        """The registered model ``body`` describes: the one held when it is the same model, else ``body``'s,
        registered now (``ModelConflictError`` when its base model or LoRA shape differs from the stored run's)."""
        with warnings.catch_warnings(record=True) as said:  # said once, when the model is registered
            warnings.simplefilter("always")
            wanted = body.trainable_model(self.art_path)
        run_id, spec = wanted.check_identity()
        # Concurrent first calls register once.
        async with self._registering.setdefault(run_id, asyncio.Lock()):
            held = self._models.get(run_id)
            if held is not None and held.check_identity() == (run_id, spec):
                return held
            for warning in said:
                log.warning("%s", warning.message)
            await self.backend.register(wanted)  # what ART's server does with the model of /register
            self._models[run_id] = wanted
            return wanted

    def training(self, model: TrainableModel) -> asyncio.Lock:
        """Held while one of the model's train calls runs: its steps go one at a time, in the order asked."""
        return self._training.setdefault(model.run_id, asyncio.Lock())

    def __iter__(self) -> Iterator[TrainableModel]:
        return iter(list(self._models.values()))

    def served_name(self, requested: str) -> str | None:
        """The inference server's name for ``requested``: a registered model's ``name`` is its newest step,
        ``<name>@<step>`` that step (as ART's server names them); None when no registered model has that name.
        A name registered in two projects names neither (``AmbiguousModelName``)."""
        match = STEP_SUFFIX.match(requested)
        name, step = (match["name"], int(match["step"])) if match else (requested, None)
        models = [m for m in self if m.name == name]
        if not models:
            return None
        if len(models) > 1:
            raise AmbiguousModelName(
                f"model name {name!r} is registered by {len(models)} runs ({', '.join(sorted(m.run_id for m in models))}): "
                "ask for one of them by its served name, <run id>@<step>"
            )
        return models[0].get_inference_name(step)


class AmbiguousModelName(UnsupportedArtOption):
    """Two registered models share a name (in different projects), so the name alone serves neither."""
