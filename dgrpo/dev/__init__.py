"""ART's ``art.dev``: the configuration dicts of a model and of its training calls, and ART's local
backend's configuration helpers, each either dgrpo's check (``validate_dedicated_config``) or refused with
the reason (``get_openai_server_config``; ``art.dev.get_model_config.get_model_config``).

The dicts are plain typed dicts; ``dgrpo.art_compat.options`` maps each key dgrpo has an equivalent for and refuses
the others with the reason (docs/art-compat.md lists them).
"""

from __future__ import annotations

from dgrpo.dev.engine import EngineArgs
from dgrpo.dev.model import (
    BackendModelConfig,
    InitArgs,
    InternalModelConfig,
    LoRAConfig,
    PeftArgs,
    TinkerArgs,
    TinkerNativeArgs,
    TinkerTrainingClientArgs,
    TrainerArgs,
)
from dgrpo.dev.openai_server import OpenAIServerConfig, ServerArgs, get_openai_server_config
from dgrpo.dev.train import TrainConfig, TrainSFTConfig
from dgrpo.dev.validate import is_dedicated_mode, validate_dedicated_config

__all__ = [
    "BackendModelConfig",
    "EngineArgs",
    "InitArgs",
    "InternalModelConfig",
    "LoRAConfig",
    "OpenAIServerConfig",
    "PeftArgs",
    "ServerArgs",
    "TinkerArgs",
    "TinkerNativeArgs",
    "TinkerTrainingClientArgs",
    "TrainConfig",
    "TrainSFTConfig",
    "TrainerArgs",
    "get_openai_server_config",
    "is_dedicated_mode",
    "validate_dedicated_config",
]
