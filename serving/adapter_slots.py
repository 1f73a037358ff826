"""The engine's LoRA adapters as peft adapters ("slots"), a slot reused by the next adapter of the same shape.

peft injects an adapter by walking every module of the model and creating its A and B matrices, and deletes
one by walking them again: on SmolLM2-135M that took seconds a load on a loaded CPU, for every step an RL run
serves. Here each served adapter name lives in a slot named ``slot-<n>``; an unloaded adapter leaves its slot
spare, and the next load with the same ``adapter_config.json`` copies its weights into the spare slot's
tensors (found once, when the slot was made) instead. Routing asks ``slot(name)`` for the peft adapter.

Not thread-safe: the engine calls it from its own thread only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
SPARE_SLOTS = 1
"""Slots kept for reuse after their adapter was unloaded: a run's reload loads one and unloads one."""
_NOT_SHAPE = ("base_model_name_or_path", "revision", "inference_mode")
"""``adapter_config.json`` fields that say nothing about the adapter's tensors or how they apply."""


def shape_of(path: str | Path) -> str:
    """What two adapters must share for one's weights to fill the other's slot: their config, canonically."""
    config = json.loads((Path(path) / ADAPTER_CONFIG).read_text())
    return json.dumps({k: v for k, v in config.items() if k not in _NOT_SHAPE}, sort_keys=True)


class AdapterSlots:
    """Served adapter names -> peft adapters of ``base`` (a ``PeftModel`` made on the first load)."""

    def __init__(self, base: torch.nn.Module) -> None:
        self.base = base
        self.peft: Any = None
        self._slot: dict[str, str] = {}
        self._shape: dict[str, str] = {}
        self._params: dict[str, dict[str, torch.nn.Parameter]] = {}
        """Slot -> its parameters under the names an adapter file gives them."""
        self._spare: list[str] = []
        self._made = 0

    def slot(self, name: str) -> str:
        """The peft adapter serving ``name``."""
        return self._slot[name]

    def load(self, name: str, path: str) -> bool:
        """Serve the adapter dir ``path`` as ``name`` (a name already served is replaced); True when peft's
        modules changed (a new slot was injected)."""
        self.unload(name)
        shape = shape_of(path)
        for spare in self._spare:
            if self._shape[spare] == shape and self._fill(spare, path):
                self._spare.remove(spare)
                self._slot[name] = spare
                return False
        slot = f"slot-{self._made}"
        self._made += 1
        from peft import PeftModel

        try:
            if self.peft is None:
                self.peft = PeftModel.from_pretrained(self.base, path, adapter_name=slot).eval()
            else:
                self.peft.load_adapter(path, adapter_name=slot)
        except Exception:
            if self.peft is not None and slot in self.peft.peft_config:
                self.peft.delete_adapter(slot)  # no half-injected adapter
            raise
        marker = f".{slot}."
        self._params[slot] = {
            key.replace(marker, "."): param for key, param in self.peft.named_parameters() if marker in key
        }
        self._shape[slot], self._slot[name] = shape, slot
        return True

    def unload(self, name: str) -> bool:
        """Stop serving ``name``; its slot is kept spare (or deleted beyond ``SPARE_SLOTS``). True when peft's
        modules changed."""
        slot = self._slot.pop(name, None)
        if slot is None:
            return False
        self._spare.append(slot)
        if len(self._spare) <= SPARE_SLOTS:
            return False
        oldest = self._spare.pop(0)
        self.peft.delete_adapter(oldest)
        del self._params[oldest], self._shape[oldest]
        return True

    def _fill(self, slot: str, path: str) -> bool:
        """Copy the adapter file's tensors into ``slot``; False (nothing copied) when they do not fit it."""
        weights = load_file(str(Path(path) / ADAPTER_WEIGHTS))
        params = self._params[slot]
        if weights.keys() != params.keys() or any(t.shape != params[k].shape for k, t in weights.items()):
            return False
        with torch.no_grad():
            for key, tensor in weights.items():
                params[key].copy_(tensor)
        return True
