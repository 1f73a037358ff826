"""durable-grpo's public facade: ART's client API, with every training step a durable Temporal workflow.

    import dgrpo
    backend = dgrpo.LocalBackend()
    model = dgrpo.TrainableModel(name="agent-001", project="demo", base_model="smollm2-135m-instruct")
    await model.register(backend)
    groups = await dgrpo.gather_trajectory_groups(
        (dgrpo.TrajectoryGroup(rollout(model, s) for _ in range(8)) for s in scenarios)
    )
    await model.train(groups, config=dgrpo.TrainConfig(learning_rate=1e-5))

Names load on first use, so ``import dgrpo`` (and the ``dgrpo`` command) stays light. ART programs run
with ``import dgrpo as art`` (docs/art-compat.md lists every ART name and how it maps).
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

from dgrpo.art_compat.refusals import HOSTED, MEGATRON, TOKENIZING, install

if TYPE_CHECKING:
    from activities.judge import ruler_score_group
    from dgrpo import costs, dev, local, metrics, model, pipeline_trainer, rewards, trajectories, types, utils
    from dgrpo.batches import trajectory_group_batches
    from dgrpo.capture.chat_completions import (
        auto_trajectory,
        capture_auto_trajectory,
        capture_yielded_trajectory,
        yield_trajectory,
    )
    from dgrpo.client.backends import Backend
    from dgrpo.client.temporal_backend import TemporalBackend
    from dgrpo.client.train_step import TrainStepFailed
    from dgrpo.dev import LoRAConfig
    from dgrpo.errors import (
        BackendError,
        EmptyGroupsError,
        LocalServingUnavailableError,
        ModelConflictError,
        NoTrainableChoiceError,
        NotRegisteredError,
        TooManyRolloutErrors,
        UnsupportedArtOption,
    )
    from dgrpo.gather import gather_trajectories, gather_trajectory_groups
    from dgrpo.local import LocalBackend
    from dgrpo.model import Model, TrainableModel
    from dgrpo.pipeline_trainer import PipelineTrainer, make_group_rollout_fn
    from dgrpo.pipeline_tuner import PipelineAutotuneConfig, PipelineRuntimeConfig
    from dgrpo.trajectories import (
        History,
        Trajectory,
        TrajectoryGroup,
        current_trajectory,
        no_capture,
        trajectory,
        trajectory_group,
    )
    from dgrpo.types import (
        LocalTrainResult,
        Messages,
        MessagesAndChoices,
        Tools,
        TrainConfig,
        TrainResult,
        TrainSFTConfig,
    )
    from dgrpo.utils.retry import retry
    from schemas.config import LoraConfig, RunSpec
    from schemas.trajectory import Choice

_EXPORTS = {
    "Backend": "dgrpo.client.backends",
    "LocalBackend": "dgrpo.local",
    "TemporalBackend": "dgrpo.client.temporal_backend",
    "Model": "dgrpo.model",
    "TrainableModel": "dgrpo.model",
    "TrainStepFailed": "dgrpo.client.train_step",
    "PipelineTrainer": "dgrpo.pipeline_trainer",
    "make_group_rollout_fn": "dgrpo.pipeline_trainer",
    "gather_trajectory_groups": "dgrpo.gather",
    "gather_trajectories": "dgrpo.gather",
    "trajectory_group_batches": "dgrpo.batches",
    "retry": "dgrpo.utils.retry",
    "ruler_score_group": "activities.judge",
    "BackendError": "dgrpo.errors",
    "EmptyGroupsError": "dgrpo.errors",
    "ModelConflictError": "dgrpo.errors",
    "NoTrainableChoiceError": "dgrpo.errors",
    "NotRegisteredError": "dgrpo.errors",
    "TooManyRolloutErrors": "dgrpo.errors",
    "UnsupportedArtOption": "dgrpo.errors",
    "LocalServingUnavailableError": "dgrpo.errors",
    "PipelineAutotuneConfig": "dgrpo.pipeline_tuner",
    "PipelineRuntimeConfig": "dgrpo.pipeline_tuner",
    "LoraConfig": "schemas.config",
    "LoRAConfig": "dgrpo.dev",
    "RunSpec": "schemas.config",
    "TrainConfig": "dgrpo.types",
    "TrainResult": "dgrpo.types",
    "TrainSFTConfig": "dgrpo.types",
    "LocalTrainResult": "dgrpo.types",
    "Messages": "dgrpo.types",
    "MessagesAndChoices": "dgrpo.types",
    "Tools": "dgrpo.types",
    "auto_trajectory": "dgrpo.capture.chat_completions",
    "capture_auto_trajectory": "dgrpo.capture.chat_completions",
    "capture_yielded_trajectory": "dgrpo.capture.chat_completions",
    "yield_trajectory": "dgrpo.capture.chat_completions",
    "Choice": "schemas.trajectory",
    # From dgrpo.trajectories (the same classes as schemas.trajectory's): importing it installs the capture.
    "History": "dgrpo.trajectories",
    "Trajectory": "dgrpo.trajectories",
    "TrajectoryGroup": "dgrpo.trajectories",
    "current_trajectory": "dgrpo.trajectories",
    "no_capture": "dgrpo.trajectories",
    "trajectory": "dgrpo.trajectories",
    "trajectory_group": "dgrpo.trajectories",
}

METRIC_DEFINITIONS = (
    "ART's metric definitions (its PipelineTrainer's dashboard and score metrics) are not supported: log numbers "
    "with model.log(metrics=...)"
)

UNSUPPORTED = {
    "train_sft": "a top-level train_sft is not supported: call model.train_sft(trajectories, "
    "art.TrainSFTConfig(...)) or backend.train_sft(model, trajectories, config)",
    "MegatronTopologyConfig": MEGATRON,
    "ServerlessBackend": HOSTED,
    "ServerlessTrainResult": HOSTED,
    "TinkerBackend": HOSTED,
    "SkyPilotBackend": HOSTED,
    "MetricDefinition": METRIC_DEFINITIONS,
    "PIPELINE_RL_DASHBOARD_DEFAULT_METRICS": METRIC_DEFINITIONS,
    "PIPELINE_RL_METRIC_DEFINITIONS": METRIC_DEFINITIONS,
    "PIPELINE_RL_SCORE_METRICS": METRIC_DEFINITIONS,
    "MegatronRuntimeConfig": MEGATRON,
    "get_megatron_runtime_config": MEGATRON,
    "init_megatron_runtime_config": MEGATRON,
    "get_tokenizer": TOKENIZING,
    "tokenize": TOKENIZING,
    "tensorize": TOKENIZING,
}
"""Public names of ART 0.5 (its ``__all__`` and main-branch additions) dgrpo refuses, with the reason."""

_SUBMODULES = (
    "costs",
    "dev",
    "local",
    "metrics",
    "model",
    "pipeline_trainer",
    "rewards",
    "trajectories",
    "types",
    "utils",
)
"""ART's submodules a program reaches as attributes (``art.dev.InternalModelConfig``, ``art.utils...``)."""

__all__ = [
    "Backend",
    "BackendError",
    "Choice",
    "EmptyGroupsError",
    "History",
    "LoRAConfig",
    "LocalBackend",
    "LocalServingUnavailableError",
    "LocalTrainResult",
    "LoraConfig",
    "Messages",
    "MessagesAndChoices",
    "Model",
    "ModelConflictError",
    "NoTrainableChoiceError",
    "NotRegisteredError",
    "PipelineAutotuneConfig",
    "PipelineRuntimeConfig",
    "PipelineTrainer",
    "RunSpec",
    "TemporalBackend",
    "TooManyRolloutErrors",
    "Tools",
    "TrainConfig",
    "TrainResult",
    "TrainSFTConfig",
    "TrainStepFailed",
    "TrainableModel",
    "Trajectory",
    "TrajectoryGroup",
    "UnsupportedArtOption",
    "auto_trajectory",
    "capture_auto_trajectory",
    "capture_yielded_trajectory",
    "costs",
    "current_trajectory",
    "dev",
    "gather_trajectories",
    "gather_trajectory_groups",
    "local",
    "make_group_rollout_fn",
    "metrics",
    "model",
    "no_capture",
    "pipeline_trainer",
    "retry",
    "rewards",
    "ruler_score_group",
    "trajectories",
    "trajectory",
    "trajectory_group",
    "trajectory_group_batches",
    "types",
    "utils",
    "yield_trajectory",
]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"dgrpo.{name}")
    if name in UNSUPPORTED:
        from dgrpo.errors import UnsupportedArtAttribute  # here: `import dgrpo` stays light

        raise UnsupportedArtAttribute(f"art.{name}: {UNSUPPORTED[name]}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dgrpo' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS, *_SUBMODULES])


class _Package(ModuleType):
    """``dgrpo`` itself. ART's module paths ``art.auto_trajectory`` and ``art.yield_trajectory`` are modules named
    as the functions they hold; importing one must leave ``dgrpo.<name>`` the function (ART's package imports
    the functions eagerly; this one loads names on first use), not rebind it to the module."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("auto_trajectory", "yield_trajectory") and isinstance(value, ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
install(sys.modules[__name__])  # ART's refused module paths (``import dgrpo.megatron``) raise saying why
