"""durable-grpo's public facade: ART's client API, with every training step a durable Temporal workflow.

    import dgrpo
    backend = dgrpo.LocalBackend()
    model = dgrpo.TrainableModel(name="agent-001", project="demo", base_model="smollm2-135m-instruct")
    await model.register(backend)
    groups = await dgrpo.gather_trajectory_groups(
        (dgrpo.TrajectoryGroup(rollout(model, s) for _ in range(8)) for s in scenarios)
    )
    await model.train(groups, config=dgrpo.TrainConfig(learning_rate=1e-5))

Names load on first use, so ``import dgrpo`` (and the ``dgrpo`` command) stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from activities.judge import ruler_score_group
    from dgrpo.backends import Backend, TemporalBackend
    from dgrpo.errors import (
        BackendError,
        EmptyGroupsError,
        ModelConflictError,
        NoTrainableChoiceError,
        NotRegisteredError,
        TooManyRolloutErrors,
    )
    from dgrpo.gather import gather_trajectory_groups
    from dgrpo.local_backend import LocalBackend
    from dgrpo.model import Model, TrainableModel, TrainStepFailed
    from schemas.config import LoraConfig, RunSpec, TrainConfig
    from schemas.trajectory import Choice, Trajectory, TrajectoryGroup

_EXPORTS = {
    "Backend": "dgrpo.backends",
    "LocalBackend": "dgrpo.local_backend",
    "TemporalBackend": "dgrpo.backends",
    "Model": "dgrpo.model",
    "TrainableModel": "dgrpo.model",
    "TrainStepFailed": "dgrpo.model",
    "gather_trajectory_groups": "dgrpo.gather",
    "ruler_score_group": "activities.judge",
    "BackendError": "dgrpo.errors",
    "EmptyGroupsError": "dgrpo.errors",
    "ModelConflictError": "dgrpo.errors",
    "NoTrainableChoiceError": "dgrpo.errors",
    "NotRegisteredError": "dgrpo.errors",
    "TooManyRolloutErrors": "dgrpo.errors",
    "LoraConfig": "schemas.config",
    "RunSpec": "schemas.config",
    "TrainConfig": "schemas.config",
    "Choice": "schemas.trajectory",
    "Trajectory": "schemas.trajectory",
    "TrajectoryGroup": "schemas.trajectory",
}

__all__ = [
    "Backend",
    "BackendError",
    "Choice",
    "EmptyGroupsError",
    "LocalBackend",
    "LoraConfig",
    "Model",
    "ModelConflictError",
    "NoTrainableChoiceError",
    "NotRegisteredError",
    "RunSpec",
    "TemporalBackend",
    "TooManyRolloutErrors",
    "TrainConfig",
    "TrainStepFailed",
    "TrainableModel",
    "Trajectory",
    "TrajectoryGroup",
    "gather_trajectory_groups",
    "ruler_score_group",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dgrpo' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
