"""ART's ``art.pipeline_trainer.types``: the shapes of the functions ``PipelineTrainer`` calls."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from dgrpo.model import TrainableModel
from dgrpo.pipeline_trainer.in_process import EvalFn, GroupRollout
from schemas.trajectory import Trajectory

ScenarioT = TypeVar("ScenarioT", bound=dict)
ConfigT = TypeVar("ConfigT")
ScalarMetadataValue = float | int | str | bool | None
"""A value a scenario's metadata may hold."""

RolloutFn = GroupRollout
"""``rollout_fn(model, scenario, config)``: one scenario's ``TrajectoryGroup``."""
SingleRolloutFn = Callable[[TrainableModel, Any, Any], Awaitable[Trajectory]]
"""A rollout of one trajectory; ``make_group_rollout_fn(fn, n)`` makes it a ``RolloutFn``."""

__all__ = ["ConfigT", "EvalFn", "RolloutFn", "ScalarMetadataValue", "ScenarioT", "SingleRolloutFn"]
