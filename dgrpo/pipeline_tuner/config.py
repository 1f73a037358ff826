"""ART 0.5.23's pipeline settings objects: ``PipelineTrainer(..., pipeline=PipelineRuntimeConfig(...),
autotune=PipelineAutotuneConfig(...))``.

``PipelineRuntimeConfig`` holds the four sizes ``PipelineTrainer`` took as keywords before 0.5.23 (and still
does, deprecated), plus the two sizes of ART's score metrics. ``PipelineAutotuneConfig`` says whether ART's
autotuner sets those sizes while the run goes: dgrpo has no autotuner, so only ``mode="off"`` (the default)
trains; its tuning fields (window sizes, thresholds, ...) are kept as given, since with the autotuner off ART
reads none of them.
"""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator


class PipelineRuntimeConfig(BaseModel):
    """How a ``PipelineTrainer`` batches: rollouts at once, groups per step, groups ready ahead."""

    model_config = ConfigDict(extra="forbid")

    num_rollout_workers: int = Field(16, ge=1)
    """Scenarios rolled out at once (a ``TrainingRun``: ``task.rollout_concurrency`` = this × group size)."""
    min_batch_size: int = Field(4, ge=1)
    """Groups a step trains on at least."""
    max_batch_size: int | None = Field(None, ge=1)
    """Groups a step trains on at most (None: ten times ``min_batch_size`` in this process, ART's)."""
    queue_maxsize: int | None = Field(None, ge=1)
    """Groups the rollouts may have ready ahead of training (None: from the batch size and the lag)."""
    score_reference_groups_per_step: float | None = Field(8.0, gt=0.0)
    """ART's score metrics' reference size; dgrpo logs no score metrics (accepted, changes nothing)."""
    score_reference_rollouts_per_group: float | None = Field(None, gt=0.0)
    """As ``score_reference_groups_per_step``."""

    @model_validator(mode="after")
    def _batch_bounds(self) -> Self:
        if self.max_batch_size is not None and self.max_batch_size < self.min_batch_size:
            raise ValueError("max_batch_size must be >= min_batch_size")
        return self


class PipelineAutotuneConfig(BaseModel):
    """Whether ART's autotuner owns the pipeline's sizes: ``"off"`` (they are the ``PipelineRuntimeConfig``'s),
    ``"online"`` or ``"profile"`` (refused by ``PipelineTrainer``: dgrpo has no autotuner)."""

    model_config = ConfigDict(extra="allow")

    mode: Literal["off", "online", "profile"] = "off"
    """``"off"``: the sizes stay as given."""
    profile: str | None = None
    """A saved autotuner profile (read only by ART's autotuner)."""
    output_name: str = "latest"
    """Where ART's autotuner writes its profile."""
