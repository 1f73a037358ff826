"""A run's step-0 adapter for a gang's worker, without loading the base's weights.

A gang's worker holds no model (its ranks do, each a shard of it), yet it publishes a run's first checkpoint. The
fresh adapter depends only on the model's layout, the LoRA shape and the seed: the model is built on the ``meta``
device (no weights), wrapped in the run's LoRA, its adapter alone made real on the CPU and initialised from the
seed in the order a ``Trainer`` initialises it (``Trainer.init_adapter``; the same values as a CPU trainer's,
bit for bit). A warm-start adapter (``base_model`` an adapter directory) is its own file's weights.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from peft import PeftConfig, get_peft_model
from peft.tuners.lora import LoraLayer
from peft.utils import get_peft_model_state_dict, set_peft_model_state_dict
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM

from activities.state_files import ADAPTER_CONFIG, ADAPTER_WEIGHTS, Snapshot
from activities.trainer import peft_config
from base_models.resolve import resolve_base_model
from schemas.config import ModelSpec
from schemas.settings import model_roots


def initial_adapter(model: ModelSpec, seed: int) -> Snapshot:
    """The step-0 adapter of a run of ``model`` from ``seed`` (no optimizer state yet), ready to write."""
    resolved = resolve_base_model(model.base_model, roots=model_roots())
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(resolved.base_path))
    if resolved.adapter_path is not None:
        config = PeftConfig.from_pretrained(resolved.adapter_path)
        config.inference_mode = False  # as PeftModel.from_pretrained(..., is_trainable=True) leaves it
        peft_model = get_peft_model(skeleton, config)
    else:
        peft_model = get_peft_model(skeleton, peft_config(model, skeleton))
    layers = [module for module in peft_model.modules() if isinstance(module, LoraLayer)]
    for layer in layers:
        for name in layer.lora_A:
            layer.lora_A[name].to_empty(device="cpu")
            layer.lora_B[name].to_empty(device="cpu")
    if resolved.adapter_path is not None:
        set_peft_model_state_dict(peft_model, load_file(str(Path(resolved.adapter_path) / ADAPTER_WEIGHTS)))
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for layer in layers:
                layer.reset_lora_parameters("default", True)
    with tempfile.TemporaryDirectory() as written:
        peft_model.save_pretrained(written)
        adapter_config = (Path(written) / ADAPTER_CONFIG).read_text()
    adapter = {
        name: tensor.detach().clone() for name, tensor in get_peft_model_state_dict(peft_model).items()
    }
    return Snapshot(adapter, adapter_config, None, torch.get_rng_state())
