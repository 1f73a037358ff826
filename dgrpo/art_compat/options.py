"""ART's configuration dicts (``_internal_config``, ``model.train(_config=...)``, ``backend.train(**options)``)
translated to ours: each key that has an equivalent is mapped; a setting of ART's own engine or hardware is
accepted with one warning naming what sets it here (settings_rule.py); any other is refused, saying why.

Refusing is deliberate: a setting ART would honour and dgrpo silently ignored would train differently
from what the program says.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dgrpo.art_compat.defaults import ART_LORA
from dgrpo.art_compat.settings_rule import (
    InternalSettings,
    check_engine_args,
    check_init_args,
    check_trainer_args,
)
from dgrpo.errors import UnsupportedArtOption
from schemas.config import LoraConfig

PEFT_ARGS = {
    "r": "rank",
    "lora_alpha": "alpha",
    "lora_dropout": "dropout",
    "target_modules": "target_modules",
}
"""ART ``_internal_config["peft_args"]`` keys -> ``LoraConfig`` fields."""

LORA_CONFIG = {"rank": "rank", "alpha": "alpha", "dropout": "dropout", "target_modules": "target_modules"}
"""ART 0.5 ``TrainableModel(lora_config=...)`` keys -> ``LoraConfig`` fields."""

TRAIN_OPTIONS = {
    "learning_rate": "learning_rate",
    "beta": "kl_coef",
    "epsilon": "epsilon",
    "epsilon_high": "epsilon_high",
    "scale_rewards": "scale_rewards",
}
"""ART ``backend.train`` keywords (and ``dev.TrainConfig`` keys) -> ``TrainConfig`` fields."""

LOSS_FNS = {"cispo": "cispo", "ppo": "ppo_clip"}
"""ART 0.5's ``loss_fn`` -> ``TrainConfig.importance_sampling``."""

ART_TRAIN_DEFAULTS: dict[str, Any] = {
    "ppo": False,
    "advantage_balance": 0.0,
    "importance_sampling_level": "token",
    "max_negative_advantage_importance_sampling_weight": None,
    "mask_prob_ratio": False,
    "kimi_k2_tau": None,
    "precalculate_logprobs": False,
    "allow_training_without_logprobs": False,
    "plot_tensors": False,
    "truncated_importance_sampling": None,
    "scale_learning_rate_by_reward_std_dev": False,
    "logprob_calculation_chunk_size": 1024,
    "num_trajectories_learning_rate_multiplier_power": 0.0,
    "save_checkpoint": True,
    "verbose": False,
    "loss_fn_config": None,
    "adam_params": None,
    "kl_penalty_coef": 0.0,
    "kl_penalty_reference_step": None,
    "kl_ref_adapter_path": None,
    "packed_sequence_length": None,
    "megatron_topology": None,
}
"""ART ``backend.train`` options with no dgrpo equivalent: accepted at ART's default value only."""

CHECKPOINT_CADENCE = ("optimizer_save_interval", "final_training_step")
"""ART 0.5.23 ``backend.train`` keywords that say when ART saves the optimizer state with a checkpoint."""

GPU_IDS_WHY = (
    "which GPUs train and which serve is the workers' operator's, per process (e.g. `CUDA_VISIBLE_DEVICES=0 dgrpo "
    "worker trainer` and `CUDA_VISIBLE_DEVICES=1 dgrpo worker inference`), not a model's; backend.train and "
    "PipelineTrainer already train while the server keeps serving (ART's dedicated mode), so leave them out"
)

WHY_NOT = {
    "save_checkpoint": "every dgrpo step publishes its checkpoint: the next step and a resumed run start from it",
    "ppo": "say loss_fn='ppo' (TrainConfig.importance_sampling 'ppo_clip')",
    "loss_fn": "dgrpo trains with loss_fn='cispo' or 'ppo'",
    "allow_training_without_logprobs": "the trainer needs the sampled token ids and logprobs of every choice",
    "kl_penalty_source": "it matters only with kl_penalty_coef > 0, a KL penalty dgrpo does not have (its KL "
    "term is backend.train(beta=...))",
    "grad_accumulation_sequences": "dgrpo takes one optimizer step per TrainConfig.epochs over the step's batch "
    "(TrainConfig.micro_batch_size only splits it for memory)",
    "trainer_gpu_ids": GPU_IDS_WHY,
    "inference_gpu_ids": GPU_IDS_WHY,
    "chat_template_content_format": "dgrpo's servers render message content as the template receives it "
    "(text, with content parts joined); vLLM's content format is its operator's",
    "chat_template_tool_schema_format": "tools go to the chat template as the request gives them (vLLM's "
    "OpenAI schema)",
    "tinker_args": "Tinker is a hosted training service; dgrpo trains on your own workers",
    "tinker_native_args": "Tinker is a hosted training service; dgrpo trains on your own workers",
    "rollout_weights_mode": "dgrpo serves each step as a LoRA adapter (ART's 'lora', which may be given); it "
    "does not push merged weights to the server",
}


GPU_IDS = ("trainer_gpu_ids", "inference_gpu_ids")
CHAT_TEMPLATE_KEYS = ("chat_template", "chat_template_path")


def chat_template_of(internal: Mapping[str, Any]) -> str | None:
    """The model's own chat template, as ART reads it: ``chat_template`` (the text) or ``chat_template_path``
    (a file, read here, on the client: the workers get the text in the model's spec); None: the base model's."""
    text, path = internal.get("chat_template"), internal.get("chat_template_path")
    if text is not None and path is not None:
        raise ValueError("Set only one of chat_template or chat_template_path.")
    if path is None:
        return None if text is None else str(text)
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise ValueError(f"_internal_config['chat_template_path']: cannot read {path}: {err}") from err


def given_sections(internal: Mapping[str, Any]) -> dict[str, Any]:
    """The ``_internal_config`` sections a program gave: a section set to None is not given (NeMo Agent
    Toolkit builds ``InternalModelConfig(init_args=None, engine_args=None, trainer_args=None)`` from its
    defaults, which ART's client accepts without reading)."""
    return {section: values for section, values in internal.items() if values is not None}


def refuse_gpu_ids(internal: Mapping[str, Any]) -> None:
    """``register``'s check of ART's dedicated-mode GPU ids (ART checks them when the model gets its service):
    a model cannot place dgrpo's workers."""
    given = given_sections(internal)
    for key in GPU_IDS:
        if key in given:
            raise _refuse("_internal_config", key, given[key])


def _refuse(where: str, key: str, value: Any) -> UnsupportedArtOption:
    why = WHY_NOT.get(key, "dgrpo has no equivalent setting")
    return UnsupportedArtOption(
        f"{where}: {key}={value!r} is not supported: {why}. Remove it (docs/art-compat.md lists what maps)"
    )


def internal_settings(internal: Mapping[str, Any]) -> InternalSettings:
    """What an ART ``_internal_config`` asks for, checked: its LoRA, default ``TrainConfig`` fields and the
    engine and hardware settings accepted but not applied (settings_rule.py); anything else is refused."""
    settings = InternalSettings()
    for section, values in given_sections(internal).items():
        if section == "peft_args":
            for key, value in dict(values).items():
                if key not in PEFT_ARGS:
                    raise _refuse("_internal_config['peft_args']", key, value)
                settings.peft_args[PEFT_ARGS[key]] = value
        elif section == "init_args":
            check_init_args(dict(values), settings)
        elif section == "engine_args":
            check_engine_args(dict(values), settings)
        elif section == "trainer_args":
            check_trainer_args(dict(values), settings)
        elif section == "rollout_weights_mode" and values == "lora":
            continue  # ART's default, and what dgrpo does
        elif section == "chat_template_kwargs":
            continue  # sent with each chat completion of the model's client (TrainableModel)
        elif section in CHAT_TEMPLATE_KEYS:
            continue  # the model's own template: chat_template_of
        elif section in GPU_IDS:
            continue  # kept on the model: refused by register (refuse_gpu_ids), as ART checks them there
        else:
            raise _refuse("_internal_config", section, values)
    return settings


def lora_from_internal_config(internal: Mapping[str, Any]) -> tuple[LoraConfig | None, int | None]:
    """The ``LoraConfig`` and default ``max_seq_len`` an ART ``_internal_config`` asks for."""
    settings = internal_settings(internal)
    lora = (
        LoraConfig.model_validate({**ART_LORA.model_dump(), **settings.peft_args})
        if settings.peft_args
        else None
    )
    return lora, settings.train_defaults.get("max_seq_len")


def lora_from_lora_config(lora_config: Mapping[str, Any]) -> LoraConfig:
    """The ``LoraConfig`` an ART 0.5 ``lora_config`` (``art.LoRAConfig``) asks for; what it leaves out is ART's."""
    fields: dict[str, Any] = ART_LORA.model_dump()
    for key, value in lora_config.items():
        if key not in LORA_CONFIG:
            raise _refuse("lora_config", key, value)
        fields[LORA_CONFIG[key]] = value
    return LoraConfig.model_validate(fields)


def lora_of(
    lora: LoraConfig | None, lora_config: Mapping[str, Any] | None, internal: Mapping[str, Any]
) -> LoraConfig:
    """A ``TrainableModel``'s LoRA shape: dgrpo's ``lora``, ART's ``lora_config`` or
    ``_internal_config['peft_args']``, given once (equal when given more than once); else ART's (``ART_LORA``).
    A copy: the model's own objects stay its own."""
    given = [c for c in (lora, lora_from_internal_config(internal)[0]) if c is not None]
    if lora_config is not None:
        given.append(lora_from_lora_config(lora_config))
    if any(c != given[0] for c in given):
        raise UnsupportedArtOption(
            "give the LoRA shape once: lora=, lora_config= or _internal_config['peft_args']"
        )
    return (given[0] if given else ART_LORA).model_copy(deep=True)


def importance_sampling(where: str, loss_fn: str) -> str:
    """ART's ``loss_fn`` as ``TrainConfig.importance_sampling``."""
    if loss_fn not in LOSS_FNS:
        raise _refuse(where, "loss_fn", loss_fn)
    return LOSS_FNS[loss_fn]


def train_config_fields(where: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """``TrainConfig`` fields for ART training options; an option without an equivalent is refused
    unless it has ART's default value (then it changes nothing)."""
    fields: dict[str, Any] = {}
    for key, value in options.items():
        if key == "loss_fn":
            if value is not None:
                fields["importance_sampling"] = importance_sampling(where, value)
        elif key == "normalize_advantages":
            if not value:  # ART's older name for scale_rewards; False turns the scaling off
                fields["scale_rewards"] = False
        elif key in TRAIN_OPTIONS:
            if value is not None:
                fields[TRAIN_OPTIONS[key]] = value
        elif key in CHECKPOINT_CADENCE:
            continue  # dgrpo keeps the optimizer state with every checkpoint: any cadence is met
        elif key == "kl_penalty_source" and not options.get("kl_penalty_coef"):
            continue  # where the KL reference comes from matters only with a KL penalty (refused below)
        elif key == "grad_accumulation_sequences" and value is None:
            continue  # ART's default: one optimizer step for the batch, as dgrpo takes
        elif key in ART_TRAIN_DEFAULTS:
            if value != ART_TRAIN_DEFAULTS[key] and key != "verbose":
                raise _refuse(where, key, value)
        else:
            raise _refuse(where, key, value)
    return fields
