"""``dgrpo.pipeline_tuner``: where ART 0.5.23's ``art.pipeline_tuner`` points (``PipelineRuntimeConfig``,
``PipelineAutotuneConfig``, dgrpo/pipeline_tuner/config.py)."""

from __future__ import annotations

from dgrpo.pipeline_tuner.config import PipelineAutotuneConfig, PipelineRuntimeConfig

__all__ = ["PipelineAutotuneConfig", "PipelineRuntimeConfig"]
