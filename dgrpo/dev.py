"""ART's ``art.dev`` configuration dicts, so ``art.dev.InternalModelConfig(...)`` reads the same here.

They are plain typed dicts; ``dgrpo.art_config`` maps each key dgrpo has an equivalent for and refuses
the others with the reason (docs/art-compat.md lists them).
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict


class InitArgs(TypedDict, total=False):
    """Model loading options; dgrpo maps ``max_seq_length`` (the default ``TrainConfig.max_seq_len``)."""

    max_seq_length: int


class PeftArgs(TypedDict, total=False):
    """The LoRA adapter's shape: ``r``, ``lora_alpha``, ``lora_dropout``, ``target_modules``."""

    r: int
    lora_alpha: float
    lora_dropout: float
    target_modules: list[str]


class LoRAConfig(TypedDict, total=False):
    """ART 0.5's ``TrainableModel(lora_config=...)``: ``rank``, ``alpha``, ``dropout``, ``target_modules``."""

    rank: int
    alpha: float
    dropout: float
    target_modules: list[str]


class EngineArgs(TypedDict, total=False):
    """vLLM engine options: the inference worker operator's settings in dgrpo, refused on a model."""

    gpu_memory_utilization: float
    enforce_eager: bool
    max_model_len: int


class InternalModelConfig(TypedDict, total=False):
    """ART's ``TrainableModel(_internal_config=...)``. Of ART 0.5's dedicated-mode keys,
    ``rollout_weights_mode="lora"`` is what dgrpo does; GPU ids are refused (the workers' operator places them)."""

    init_args: InitArgs
    peft_args: PeftArgs
    engine_args: EngineArgs
    trainer_args: dict[str, Any]
    trainer_gpu_ids: list[int]
    inference_gpu_ids: list[int]
    rollout_weights_mode: Literal["lora", "merged"]


class TrainConfig(TypedDict, total=False):
    """ART's ``model.train(_config=...)``: the same keywords as ``backend.train``."""

    epsilon: float
    epsilon_high: float
    scale_rewards: bool
    importance_sampling_level: str
    ppo: bool
