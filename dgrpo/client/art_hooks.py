"""A model's training calls on a backend of ART's own (NeMo Agent Toolkit's ``RemoteBackend``, a client of ART's
``art run`` server), as ART's model makes them through the backend's hooks; dgrpo's own backends run a durable
``TrainStep`` instead (dgrpo/model.py tells them apart by the ``Backend`` protocol)."""

from __future__ import annotations

import time
from typing import Any

from dgrpo.client.backends import ArtBackend
from dgrpo.client.model_base import ModelBase
from dgrpo.metrics_taxonomy import average_metric_samples
from dgrpo.types import TrainResult
from schemas.trajectory import TrajectoryGroup


async def train_by_hooks(
    model: ModelBase[Any, Any],
    backend: ArtBackend,
    groups: list[TrajectoryGroup],
    config: Any,
    dev_config: dict[str, Any],
    verbose: bool,
) -> TrainResult:
    """ART 0.5.17's ``model.train``: the rows ``backend._train_model`` yields averaged (the call's time unless
    a row gives the trainer's), logged with the groups by ``model.log`` at the step the backend then says."""
    started = time.monotonic()
    rows = [m async for m in backend._train_model(model, groups, config, dev_config, verbose)]
    metrics = average_metric_samples(rows)
    metrics.setdefault("time/step_trainer_s", time.monotonic() - started)
    step = await model.get_step()
    await model.log(groups, split="train", metrics=metrics, step=step)
    return TrainResult(step=step, metrics=metrics)


async def delete_by_hooks(
    model: ModelBase[Any, Any], backend: ArtBackend, best_checkpoint_metric: str
) -> None:
    """ART's ``model.delete_checkpoints``: the backend's ``_delete_checkpoint_files`` keeps the newest step and
    the best by ``best_checkpoint_metric`` in the model's ``history.jsonl`` (the newest alone without it)."""
    keep = [await model.get_step()]
    best = model.local_log().best_step(best_checkpoint_metric)
    if best is not None:
        keep.append(best)
    await backend._delete_checkpoint_files(model, keep)
