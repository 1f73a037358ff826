"""ART's ``art.dev.train``: the training calls' ``_config`` dicts."""

from __future__ import annotations

from pydantic import with_config
from typing_extensions import TypedDict

from dgrpo.dev.engine import ART_DICT


@with_config(ART_DICT)
class TrainConfig(TypedDict, total=False):
    """ART's ``model.train(_config=...)``: the same keywords as ``backend.train``."""

    epsilon: float
    epsilon_high: float
    scale_rewards: bool
    importance_sampling_level: str
    ppo: bool


@with_config(ART_DICT)
class TrainSFTConfig(TypedDict, total=False):
    """ART's ``train_sft(_config=...)``, experimental options of ART's own trainer: none has a dgrpo
    equivalent, so a key given is refused (``dgrpo.types.TrainSFTConfig`` holds the options that map)."""
