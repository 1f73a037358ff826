"""ART's ``art.dev.engine``: vLLM's engine options as a typed dict, and how every ``art.dev`` dict validates."""

from __future__ import annotations

from pydantic import ConfigDict, with_config
from typing_extensions import TypedDict

ART_DICT = ConfigDict(extra="allow")
"""How pydantic validates an ``art.dev`` dict (a program's own config, e.g. NeMo Agent Toolkit's, has fields of
these types): every key is kept, so each one reaches dgrpo's settings rule, which maps, warns about or refuses it
(dgrpo/art_compat/settings_rule.py), instead of being dropped unseen."""


@with_config(ART_DICT)
class EngineArgs(TypedDict, total=False):
    """vLLM engine options: the inference worker operator's settings in dgrpo, accepted on a model with one
    warning naming the worker's flag (those that change the model or its sampling are refused)."""

    gpu_memory_utilization: float
    enforce_eager: bool
    max_model_len: int
    tensor_parallel_size: int
