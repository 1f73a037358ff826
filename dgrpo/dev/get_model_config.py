"""ART's ``art.dev.get_model_config``: the Unsloth, vLLM and Hugging Face trainer arguments of ART's local
backend for a base model. No dgrpo component reads them: a run's ``ModelSpec``/``TrainConfig`` and the
workers' flags are dgrpo's configuration, so ``get_model_config`` is refused, saying so."""

from __future__ import annotations

from typing import Any

from dgrpo.dev.model import InternalModelConfig
from dgrpo.errors import UnsupportedArtFeature

WHY = (
    "it builds ART's local backend's Unsloth, vLLM and trainer arguments (4-bit loading, sleep mode, paged AdamW, "
    "per-architecture LoRA target modules), which no dgrpo component reads: a model's LoRA shape is "
    "TrainableModel(lora_config=...), a step's training is its TrainConfig, and the engines are the workers' "
    "flags (`dgrpo worker --help`)"
)


def get_model_config(*args: Any, **kwargs: Any) -> InternalModelConfig:
    """Refused: see ``WHY``."""
    raise UnsupportedArtFeature(f"art.dev.get_model_config: {WHY}")
