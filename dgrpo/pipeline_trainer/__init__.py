"""``dgrpo.pipeline_trainer``: ART's ``art.pipeline_trainer``, its asynchronous trainer as a durable, pipelined
``TrainingRun`` (dgrpo/pipeline_trainer/trainer.py, where ``art.pipeline_trainer.trainer`` points)."""

from __future__ import annotations

from dgrpo.pipeline_trainer.checkpoint_retention import (
    CheckpointInfo,
    CheckpointRetentionContext,
    CheckpointRetentionStrategy,
    keep_recent_and_top,
)
from dgrpo.pipeline_trainer.trainer import PipelineTrainer, make_group_rollout_fn

__all__ = [
    "CheckpointInfo",
    "CheckpointRetentionContext",
    "CheckpointRetentionStrategy",
    "PipelineTrainer",
    "keep_recent_and_top",
    "make_group_rollout_fn",
]
