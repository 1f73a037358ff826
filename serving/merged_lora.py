"""One LoRA adapter folded into the base weights for the forward passes whose rows all use it.

peft adds each adapted projection's ``scale * B(A x)`` to the base layer's output, which on the CPU reads
every adapted projection's input a second time and writes its output twice: a prefill ran ~45 % slower and a
decode step ~15 % slower with an adapter than without. When every row of a forward uses one adapter (an RL
run's rollouts), the engine instead points each adapted base layer at ``W + scale * B A`` (computed once and
kept for the newest adapter) and runs with peft's adapter layers disabled; afterwards each base layer points
at its own weight tensor again, which is never written, so base and mixed-adapter rows are unchanged.

Only plain LoRA on ``nn.Linear`` is folded (no DoRA or other variant, no LoRA bias); anything else keeps
peft's path. ``adapters_off`` turns peft's adapter layers into pass-throughs for one forward (folded rows, and
base-model rows) by their own flag: ``PeftModel.disable_adapter()`` does the same with bookkeeping over every
module and adapter that took ~33 ms a call here, a quarter of a decode step.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from peft.tuners.lora.layer import Linear as LoraLinear
from peft.tuners.lora.layer import LoraLayer


class FoldedAdapter:
    """Folded weights of the adapter used last, for ``model`` (a peft-injected transformers model)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.name: str | None = None
        self.weights: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
        self.layers: list[LoraLayer] = []

    def refresh(self) -> None:
        """Find the model's adapter layers again (after an adapter was loaded or deleted)."""
        self.layers = [m for m in self.model.modules() if isinstance(m, LoraLayer)]

    @contextmanager
    def adapters_off(self) -> Iterator[None]:
        """Within: every adapter layer returns its base layer's output."""
        before = [layer._disable_adapters for layer in self.layers]
        try:
            for layer in self.layers:
                layer._disable_adapters = True
            yield
        finally:
            for layer, flag in zip(self.layers, before, strict=True):
                layer._disable_adapters = flag

    def can_fold(self, name: str) -> bool:
        layers = self.layers
        return bool(layers) and all(
            isinstance(m, LoraLinear)
            and name not in m.lora_variant
            and not m.lora_bias.get(name, False)
            and not m.merged
            for m in layers
        )

    def forget(self, name: str | None = None) -> None:
        """Drop the folded weights (of ``name`` only, when given): its adapter was reloaded or deleted."""
        if name is None or name == self.name:
            self.name, self.weights = None, []

    @contextmanager
    def applied(self, name: str) -> Iterator[None]:
        """Within: every adapted base layer computes with adapter ``name`` folded in."""
        weights = self._fold(name)
        own = [(param, param.data) for param, _ in weights]
        try:
            for param, folded in weights:
                param.data = folded
            yield
        finally:
            for param, tensor in own:
                param.data = tensor

    def _fold(self, name: str) -> list[tuple[torch.nn.Parameter, torch.Tensor]]:
        if self.name != name:
            self.forget()
            weights: list[tuple[torch.nn.Parameter, torch.Tensor]] = []
            for module in self.model.modules():
                if isinstance(module, LoraLinear) and name in module.lora_A:
                    param = module.get_base_layer().weight
                    assert isinstance(param, torch.nn.Parameter)
                    weights.append((param, param.data + module.get_delta_weight(name).to(param.data.dtype)))
            self.name, self.weights = name, weights
        return self.weights
