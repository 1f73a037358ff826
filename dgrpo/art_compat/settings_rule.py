"""The rule for ART's settings sections (``_internal_config``'s ``init_args``, ``engine_args``, ``trainer_args``):
a setting that changes **what is trained** is mapped where dgrpo has it, and refused (saying why) where it
has not; a setting of ART's own engine or hardware changes no result, so it is accepted with one warning
naming what sets it here (the worker's operator owns the engine and the hardware: ARCHITECTURE.md).

A key not named in these tables is refused: it may change what is trained.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dgrpo.errors import ArtSettingIgnored, UnsupportedArtOption

INFERENCE = "`dgrpo worker inference"
ENGINE_HELP = f"{INFERENCE} --help`"
TRAINER_PRECISION = "the trainer's TrainConfig.precision (fp32 or bf16)"

INIT_ARGS_MAPPED = {"max_seq_length": "max_seq_len"}
"""``init_args`` -> the model's default ``TrainConfig`` fields."""

INIT_ARGS_IGNORED = {
    "gpu_memory_utilization": f"{INFERENCE} --gpu-memory-utilization`",
    "max_lora_rank": f"{INFERENCE} --max-lora-rank`",
    "enable_prefix_caching": f"{INFERENCE} --prefix-cache-mb`",
    "dtype": f"{INFERENCE} --dtype` and {TRAINER_PRECISION}",
    "load_in_4bit": TRAINER_PRECISION,
    "load_in_8bit": TRAINER_PRECISION,
    "fast_inference": ENGINE_HELP,
    "disable_log_stats": ENGINE_HELP,
    "use_async": ENGINE_HELP,
    "use_gradient_checkpointing": "the trainer (it splits a step by TrainConfig.micro_batch_size)",
    "device_map": "the workers' operator (`CUDA_VISIBLE_DEVICES` per worker)",
    "use_exact_model_name": "the workers (they load base_model as given)",
    "random_state": "TrainConfig.seed",
}
"""``init_args`` of ART's engine and hardware (Unsloth's loader): accepted, with what sets it in dgrpo."""

INIT_ARGS_REFUSED = {
    "model_name": "the base model is TrainableModel(base_model=...)",
    "full_finetuning": "dgrpo trains a LoRA adapter (lora=..., lora_config=...)",
    "rope_scaling": "it changes the base model the adapter trains on; give a base_model directory with it",
    "revision": "the workers load base_model as given; name a directory of that revision",
    "resize_model_vocab": "it changes the base model's vocabulary the adapter trains on",
    "fix_tokenizer": "the tokenizer is the base model's (or the model's own chat_template)",
    "trust_remote_code": "whether a worker runs a model's code is its operator's decision, not a run's",
    "token": "the workers use their own HF_TOKEN; a run never ships a secret",
}

ENGINE_FLAGS = {
    "gpu_memory_utilization": f"{INFERENCE} --gpu-memory-utilization`",
    "enable_sleep_mode": f"{INFERENCE} --sleep-mode`",
    "max_lora_rank": f"{INFERENCE} --max-lora-rank`",
    "max_loras": f"{INFERENCE} --max-loras`",
    "dtype": f"{INFERENCE} --dtype`",
    "enable_prefix_caching": f"{INFERENCE} --prefix-cache-mb`",
    "tool_call_parser": f"{INFERENCE} --tool-call-parser`",
    "enable_auto_tool_choice": f"{INFERENCE} --tool-call-parser`",
    "tensor_parallel_size": f"{INFERENCE} --engine vllm --tensor-parallel-size`",
    "data_parallel_size": f"{INFERENCE} --engine vllm --data-parallel-size`",
    "distributed_executor_backend": f"{INFERENCE} --engine vllm --distributed-executor-backend`",
}
"""vLLM ``engine_args`` with a flag of their own; any other one (not refused below) is the engine's
``ENGINE_HELP``."""

ENGINE_ARGS_REFUSED = {
    "model": "the base model is TrainableModel(base_model=...)",
    "tokenizer": "the tokenizer is the base model's (or the model's own chat_template)",
    "revision": "the workers load base_model as given; name a directory of that revision",
    "tokenizer_revision": "the tokenizer is the base model's",
    "code_revision": "whether a worker runs a model's code is its operator's decision, not a run's",
    "trust_remote_code": "whether a worker runs a model's code is its operator's decision, not a run's",
    "rope_scaling": "it changes the model the rollouts sample from",
    "rope_theta": "it changes the model the rollouts sample from",
    "generation_config": "it changes the default sampling of the rollouts; pass sampling settings per request",
    "override_generation_config": "it changes the default sampling of the rollouts; pass them per request",
    "enable_lora": "dgrpo serves every step as a LoRA adapter (True, which may be given)",
}

TRAINER_ARGS_MAPPED = {
    "max_grad_norm": "max_grad_norm",
    "weight_decay": "weight_decay",
    "seed": "seed",
    "adam_beta1": "adam_beta1",
    "adam_beta2": "adam_beta2",
    "adam_epsilon": "adam_epsilon",
}
"""Hugging Face ``trainer_args`` -> the model's default ``TrainConfig`` fields (``backend.train`` sets the rest)."""

TRAINER_ARGS_IGNORED = {
    "learning_rate": "backend.train(learning_rate=...) (ART's RL step sets it each step too)",
    "gradient_checkpointing": "the trainer (it splits a step by TrainConfig.micro_batch_size)",
    "gradient_checkpointing_kwargs": "the trainer",
    "torch_empty_cache_steps": "the trainer",
    "report_to": "model.log (W&B when report_metrics asks)",
    "disable_tqdm": "the workers' logs",
    "output_dir": "the object store: runs/<run id>/checkpoints/",
    "overwrite_output_dir": "the object store: runs/<run id>/checkpoints/",
    "skip_memory_metrics": "the workers' logs",
    "include_tokens_per_second": "the step's metrics",
    "include_num_input_tokens_seen": "the step's metrics",
    "use_liger_kernel": "the trainer",
    "auto_find_batch_size": "the trainer (an out-of-memory step retries with half the micro-batch)",
    "per_device_eval_batch_size": "nothing: the trainer evaluates nothing",
    "run_name": "TrainableModel(run_name=...)",
    "beta": "nothing, as in ART, whose RL loss never reads it: the KL coefficient is backend.train(beta=...) or "
    "TrainConfig(beta=...)",
}
TRAINER_ARGS_IGNORED_PREFIXES = {
    "dataloader_": "the trainer",
    "logging_": "the workers' logs",
    "log_": "the workers' logs",
    "save_": "every step publishes its checkpoint (runs/<run id>/checkpoints/)",
    "eval_": "nothing: the trainer evaluates nothing",
    "torch_compile": "the trainer",
    "ddp_": "the workers' operator (one trainer worker per GPU)",
    "fsdp": "the workers' operator (one trainer worker per GPU)",
    "push_to_hub": "nothing: checkpoints stay in the object store",
    "hub_": "nothing: checkpoints stay in the object store",
}
"""Hugging Face ``trainer_args`` that only tune speed, memory or output: accepted, with what does it here."""

OPTIMIZER_WHY = (
    "dgrpo's trainer takes one optimizer step (lr from backend.train, a constant schedule) per TrainConfig.epochs "
    "over the step's whole batch, so this would train differently from what it says"
)
OPTIMIZERS = {
    "paged_adamw_8bit": "paged_adamw_8bit",
    "adamw_torch": "adamw",
    "adamw_torch_fused": "adamw",
    "adamw_hf": "adamw",
}
"""Hugging Face's ``optim`` names -> ``TrainConfig.optimizer`` (ART's default is ``paged_adamw_8bit``)."""
TRAINER_ARGS_REFUSED = {
    "fp16": "dgrpo trains in fp32 or bf16 (trainer_args bf16=True, or TrainConfig.precision)",
}
"""``trainer_args`` refused with a reason of their own; every other key not named above gets ``OPTIMIZER_WHY``."""


@dataclass
class InternalSettings:
    """What an ART ``_internal_config`` asks of dgrpo, once checked."""

    peft_args: dict[str, Any] = field(default_factory=dict)
    """``peft_args`` as given (``options.lora_from_internal_config`` maps them)."""
    train_defaults: dict[str, Any] = field(default_factory=dict)
    """The model's default ``TrainConfig`` fields (``init_args.max_seq_length``, ``trainer_args``)."""
    ignored: list[str] = field(default_factory=list)
    """``section.key=value (what sets it here)`` for each engine or hardware setting accepted and not applied."""


def refused(where: str, key: str, value: Any, why: str) -> UnsupportedArtOption:
    return UnsupportedArtOption(
        f"{where}: {key}={value!r} is not supported: {why}. Remove it (docs/art-examples.md lists the rule)"
    )


def check_init_args(values: Mapping[str, Any], settings: InternalSettings) -> None:
    where = "_internal_config['init_args']"
    for key, value in values.items():
        if key in INIT_ARGS_MAPPED:
            settings.train_defaults[INIT_ARGS_MAPPED[key]] = int(value)
        elif key in INIT_ARGS_IGNORED:
            settings.ignored.append(f"init_args.{key}={value!r} ({INIT_ARGS_IGNORED[key]})")
        else:
            why = INIT_ARGS_REFUSED.get(
                key, "dgrpo has no equivalent setting, and it may change what is trained"
            )
            raise refused(where, key, value, why)


def check_engine_args(values: Mapping[str, Any], settings: InternalSettings) -> None:
    for key, value in values.items():
        if key == "enable_lora" and value is True:
            continue  # what dgrpo does
        if key in ENGINE_ARGS_REFUSED:
            raise refused("_internal_config['engine_args']", key, value, ENGINE_ARGS_REFUSED[key])
        settings.ignored.append(f"engine_args.{key}={value!r} ({ENGINE_FLAGS.get(key, ENGINE_HELP)})")


def check_trainer_args(values: Mapping[str, Any], settings: InternalSettings) -> None:
    where = "_internal_config['trainer_args']"
    for key, value in values.items():
        prefix = next((p for p in TRAINER_ARGS_IGNORED_PREFIXES if key.startswith(p)), None)
        if key in TRAINER_ARGS_MAPPED:
            settings.train_defaults[TRAINER_ARGS_MAPPED[key]] = value
        elif key == "optim" and str(value) in OPTIMIZERS:
            settings.train_defaults["optimizer"] = OPTIMIZERS[str(value)]
        elif key == "lr_scheduler_type" and value == "constant":
            continue  # ART's default, and a step's rate here
        elif key == "bf16" and isinstance(value, bool):
            settings.train_defaults["precision"] = "bf16" if value else "fp32"
        elif key in TRAINER_ARGS_IGNORED:
            settings.ignored.append(f"trainer_args.{key}={value!r} ({TRAINER_ARGS_IGNORED[key]})")
        elif prefix is not None:
            settings.ignored.append(f"trainer_args.{key}={value!r} ({TRAINER_ARGS_IGNORED_PREFIXES[prefix]})")
        else:
            raise refused(where, key, value, TRAINER_ARGS_REFUSED.get(key) or OPTIMIZER_WHY)


SERVER = "the inference worker's operator"
SERVER_ARGS_IGNORED = {
    "api_key": f"{SERVER}: the server's key is DGRPO_SERVE_API_KEY, which register gives the model",
    "return_tokens_as_token_ids": "the model's client: it asks the server for each choice's token ids",
    "tool_call_parser": f"{INFERENCE} --tool-call-parser`",
    "enable_auto_tool_choice": f"{INFERENCE} --tool-call-parser`",
    "log_file": "the inference worker's log",
}
"""ART's ``OpenAIServerConfig["server_args"]`` of its own vLLM server that dgrpo's server has its own way."""
SERVER_ARGS_OPERATORS = frozenset(
    {
        "host", "port", "uvicorn_log_level", "allow_credentials", "allowed_origins", "allowed_methods",
        "allowed_headers", "ssl_keyfile", "ssl_certfile", "ssl_ca_certs", "enable_ssl_refresh", "ssl_cert_reqs",
        "root_path", "middleware", "disable_frontend_multiprocessing", "enable_request_id_headers",
        "max_log_len", "disable_fastapi_docs", "enable_prompt_tokens_details", "enable_server_load_tracking",
        "disable_uvicorn_access_log", "tool_parser_plugin",
    }
)  # fmt: skip
"""``server_args`` of how ART's vLLM server listens and logs: the inference worker's operator's here
(``DGRPO_SERVE_HOST``, the worker's flags)."""
SERVER_ARGS_REFUSED = {
    "lora_modules": "dgrpo's server serves the model's steps as <run id>@<step> itself and loads no other adapter",
    "prompt_adapters": "dgrpo's server serves LoRA adapters only",
    "chat_template": "give the model's own template as _internal_config['chat_template'] (dgrpo's server and "
    "trainer both use it)",
    "chat_template_content_format": "dgrpo's servers render message content as the template receives it",
    "response_role": "the server answers as 'assistant', which the trainer's chat rendering assumes",
}


def check_server_config(config: Mapping[str, Any]) -> list[str]:
    """ART's ``register(backend, _openai_client_config=...)`` (its ``dev.OpenAIServerConfig``) checked against
    dgrpo's server: ``server_args`` and ``engine_args`` of ART's own server are the inference worker
    operator's here, accepted and listed (``section.key=value (what sets it here)``), for ``warn_ignored``; what
    would change what is sampled is refused, saying why. A section set to None is not given."""
    settings = InternalSettings()
    for section, values in config.items():
        if values is None:
            continue
        if section == "log_file":
            settings.ignored.append(f"log_file={values!r} ({SERVER_ARGS_IGNORED['log_file']})")
        elif section == "engine_args":
            check_engine_args(dict(values), settings)
        elif section == "server_args":
            for key, value in dict(values).items():
                if key in SERVER_ARGS_REFUSED:
                    raise refused(
                        "_openai_client_config['server_args']", key, value, SERVER_ARGS_REFUSED[key]
                    )
                if key not in SERVER_ARGS_IGNORED and key not in SERVER_ARGS_OPERATORS:
                    raise refused(
                        "_openai_client_config['server_args']",
                        key,
                        value,
                        "dgrpo has no equivalent setting, and it may change what is sampled",
                    )
                settings.ignored.append(
                    f"server_args.{key}={value!r} ({SERVER_ARGS_IGNORED.get(key, SERVER)})"
                )
        else:
            raise refused(
                "_openai_client_config", section, values, "ART's OpenAIServerConfig has no such section"
            )
    return settings.ignored


def warn_ignored(model_name: str, ignored: list[str]) -> None:
    """One warning for all of a model's accepted engine and hardware settings, pointed at the program's line."""
    if not ignored:
        return
    warnings.warn(
        f"model {model_name!r}: ART's engine and hardware settings are accepted but not applied by the model: "
        f"{'; '.join(ignored)}. On dgrpo the workers' operator sets them (what sets each is in brackets); "
        "none changes what is trained",
        ArtSettingIgnored,
        stacklevel=_callers_level(),
    )


def _callers_level() -> int:
    """``stacklevel`` of the first frame outside dgrpo and pydantic: the program's line that set the model."""
    own = (str(Path(__file__).resolve().parents[1]), str(Path(sys.modules["pydantic"].__file__ or "").parent))
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(own):
        frame, level = frame.f_back, level + 1  # type: ignore[assignment]
    return level
