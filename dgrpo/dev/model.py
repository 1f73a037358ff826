"""ART's ``art.dev.model``: the model configuration dicts, so ``art.dev.InternalModelConfig(...)`` reads the
same here. They are plain typed dicts; ``dgrpo.art_compat.options`` maps each key dgrpo has an equivalent for and
refuses the others with the reason (docs/art-compat.md lists them).
"""

from __future__ import annotations

from typing import Literal

from pydantic import with_config
from typing_extensions import TypedDict

from dgrpo.dev.engine import ART_DICT, EngineArgs


@with_config(ART_DICT)
class InitArgs(TypedDict, total=False):
    """Model loading options; dgrpo maps ``max_seq_length`` (the default ``TrainConfig.max_seq_len``), accepts
    the engine and hardware ones with one warning (``gpu_memory_utilization``, ``load_in_4bit``, ...) and
    refuses those that change what is trained (dgrpo/art_compat/settings_rule.py)."""

    max_seq_length: int
    gpu_memory_utilization: float
    load_in_4bit: bool
    load_in_8bit: bool
    fast_inference: bool
    max_lora_rank: int
    enable_prefix_caching: bool


@with_config(ART_DICT)
class PeftArgs(TypedDict, total=False):
    """The LoRA adapter's shape: ``r``, ``lora_alpha``, ``lora_dropout``, ``target_modules``."""

    r: int
    lora_alpha: float
    lora_dropout: float
    target_modules: list[str]


@with_config(ART_DICT)
class LoRAConfig(TypedDict, total=False):
    """ART 0.5's ``TrainableModel(lora_config=...)``: ``rank``, ``alpha``, ``dropout``, ``target_modules``."""

    rank: int
    alpha: float
    dropout: float
    target_modules: list[str]


@with_config(ART_DICT)
class InternalModelConfig(TypedDict, total=False):
    """ART's ``TrainableModel(_internal_config=...)``. Of ART 0.5's dedicated-mode keys,
    ``rollout_weights_mode="lora"`` is what dgrpo does; GPU ids are refused (the workers' operator places them)."""

    init_args: InitArgs | None
    peft_args: PeftArgs | None
    engine_args: EngineArgs | None
    trainer_args: TrainerArgs | None
    trainer_gpu_ids: list[int]
    inference_gpu_ids: list[int]
    rollout_weights_mode: Literal["lora", "merged"]
    chat_template_kwargs: dict[str, object]
    chat_template: str
    chat_template_path: str
    tinker_args: TinkerArgs | None
    tinker_native_args: TinkerNativeArgs | None


@with_config(ART_DICT)
class BackendModelConfig(InternalModelConfig, total=False):
    """ART 0.5's model configuration as a backend sees it: ``InternalModelConfig`` and ``lora_config``."""

    lora_config: LoRAConfig


@with_config(ART_DICT)
class TinkerTrainingClientArgs(TypedDict, total=False):
    """Tinker's training client options: refused with ``tinker_args`` (a hosted training service)."""

    rank: int
    seed: int | None


@with_config(ART_DICT)
class TinkerArgs(TypedDict, total=False):
    """ART's Tinker backend options: refused on a model (Tinker is a hosted training service)."""

    renderer_name: str
    training_client_args: TinkerTrainingClientArgs


@with_config(ART_DICT)
class TinkerNativeArgs(TinkerArgs, total=False):
    """ART's native Tinker options: refused on a model, as ``tinker_args``."""


@with_config(ART_DICT)
class TrainerArgs(TypedDict, total=False):
    """ART's Hugging Face trainer arguments (``_internal_config["trainer_args"]``): ``max_grad_norm``,
    ``weight_decay``, ``seed`` and ``bf16`` become the steps' default ``TrainConfig``; those that only tune speed,
    memory or output are accepted with one warning; the optimizer's and schedule's are refused
    (dgrpo/art_compat/settings_rule.py)."""

    learning_rate: float
    max_grad_norm: float
    weight_decay: float
