"""ART's ``art.dev.engine``: vLLM's engine options as a typed dict."""

from __future__ import annotations

from typing import TypedDict


class EngineArgs(TypedDict, total=False):
    """vLLM engine options: the inference worker operator's settings in dgrpo, accepted on a model with one
    warning naming the worker's flag (those that change the model or its sampling are refused)."""

    gpu_memory_utilization: float
    enforce_eager: bool
    max_model_len: int
