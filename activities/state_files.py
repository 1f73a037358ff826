"""A trainer's state as checkpoint files: copied out of the live model at once, written (and hashed) later.

``Snapshot`` holds copies of the adapter's tensors, the optimizer's state and torch's RNG state, so the model
may train on while the copy is written (activities/training.py writes it beside the next step). ``write`` puts
the files of a checkpoint directory (activities/checkpoints.py) and returns each one's sha256, computed from
the bytes it wrote: publishing never hashes them again.

The optimizer's state is a safetensors file (``optimizer.safetensors``: ``state.<index>.<name>`` tensors, the
param groups as JSON in its metadata), which writes and reads several times faster than ``torch.save``'s
pickle; checkpoints written before it hold ``optimizer.pt``, which ``read_optimizer_state`` still reads.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
OPTIMIZER_FILE = "optimizer.safetensors"
LEGACY_OPTIMIZER_FILE = "optimizer.pt"
"""The optimizer state as checkpoints before ``OPTIMIZER_FILE`` hold it (``torch.save`` of its state dict)."""
RNG_STATE_FILE = "rng_state.pt"
PARAM_GROUPS = "param_groups"


@dataclass(frozen=True)
class Snapshot:
    """A trainer's state at one moment, independent of the live model."""

    adapter: dict[str, torch.Tensor]
    """The adapter's tensors under PEFT's names (``get_peft_model_state_dict``)."""
    adapter_config: str
    """``adapter_config.json`` as PEFT writes it."""
    optimizer: dict[str, Any] | None
    """The optimizer's state dict, its tensors copied (None before the first step)."""
    rng: torch.Tensor

    @classmethod
    def take(
        cls, adapter: dict[str, torch.Tensor], adapter_config: str, optimizer: torch.optim.Optimizer | None
    ) -> Snapshot:
        """Copy ``adapter`` (live tensors) and ``optimizer``'s state now."""
        state = None
        if optimizer is not None:
            state = optimizer.state_dict()
            state["state"] = {
                index: {name: value.detach().clone() for name, value in entry.items()}
                for index, entry in state["state"].items()
            }
        copied = {name: tensor.detach().clone() for name, tensor in adapter.items()}
        return cls(copied, adapter_config, state, torch.get_rng_state())

    def adapter_files(self) -> dict[str, tuple[bytes, str]]:
        """The adapter's files (what the servers load) serialized, with their sha256: made first, so they can go
        up before the rest is written."""
        files = {
            ADAPTER_WEIGHTS: save(self.adapter, metadata={"format": "pt"}),
            ADAPTER_CONFIG: self.adapter_config.encode(),
        }
        return {name: (data, hashlib.sha256(data).hexdigest()) for name, data in files.items()}

    def write(
        self, directory: str | Path, adapter: dict[str, tuple[bytes, str]] | None = None
    ) -> dict[str, str]:
        """Write the files into ``directory`` (``adapter``: its files as ``adapter_files`` made them); their sha256
        by file name."""
        adapter = self.adapter_files() if adapter is None else adapter
        for name, (data, _) in adapter.items():
            (Path(directory) / name).write_bytes(data)
        files = {RNG_STATE_FILE: _torch_bytes(self.rng)}
        if self.optimizer is not None:
            tensors = {
                f"state.{index}.{name}": value
                for index, entry in self.optimizer["state"].items()
                for name, value in entry.items()
            }
            files[OPTIMIZER_FILE] = save(
                tensors, metadata={PARAM_GROUPS: json.dumps(self.optimizer[PARAM_GROUPS])}
            )
        hashes = {name: sha for name, (_, sha) in adapter.items()}
        for name, data in files.items():
            (Path(directory) / name).write_bytes(data)
            hashes[name] = hashlib.sha256(data).hexdigest()
        return hashes


def _torch_bytes(value: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def read_optimizer_state(directory: str | Path) -> dict[str, Any] | None:
    """The optimizer state dict a checkpoint directory holds (either format), or None (step 0 has none)."""
    directory = Path(directory)
    if (directory / OPTIMIZER_FILE).is_file():
        state: dict[int, dict[str, torch.Tensor]] = {}
        with safe_open(str(directory / OPTIMIZER_FILE), framework="pt") as f:
            groups = json.loads((f.metadata() or {})[PARAM_GROUPS])
            for key in f.keys():  # safe_open is not a mapping
                _, index, name = key.split(".", 2)
                state.setdefault(int(index), {})[name] = f.get_tensor(key)
        for group in groups:  # JSON made AdamW's betas a list
            if isinstance(group.get("betas"), list):
                group["betas"] = tuple(group["betas"])
        return {"state": state, PARAM_GROUPS: groups}
    if (directory / LEGACY_OPTIMIZER_FILE).is_file():
        loaded: dict[str, Any] = torch.load(directory / LEGACY_OPTIMIZER_FILE, weights_only=True)
        return loaded
    return None
