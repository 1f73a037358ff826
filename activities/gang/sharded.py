"""``ShardedTrainer``: a trainer whose model is one rank's part of a gang, its state read from and gathered to the
checkpoint format a single device writes.

``shard`` makes the loaded model one rank's: with ``fsdp``, FSDP2's ``fully_shard`` over each decoder layer and
then over the policy's forward (``PolicyHead``, the root: the embeddings and the output projection, tied in Qwen3
and SmolLM2, stay one unit), so each rank keeps about a world-th of the frozen base and of the adapter, and the
reduce-scatter sums gradients (the step's loss is already weighed against the whole step); with ``replicate``,
every rank keeps the whole model and only gradients are summed (activities/gang/collectives.py).

Loading a checkpoint, every rank reads the whole file and keeps its shard; gathering one (``snapshot``), every rank
takes part and rank 0 writes it. Both go by the parameters' order and PEFT's names, as one device's do: a checkpoint
written at any world size loads at any other, exactly.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from peft.utils import get_peft_model_state_dict
from safetensors.torch import load_file
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from activities import optimizers
from activities.gang.collectives import GangRanks
from activities.optimizers import ADAMW, PAGED_ADAMW_8BIT, runs_8bit, state_kind
from activities.state_files import ADAPTER_WEIGHTS, Snapshot, read_optimizer_state
from activities.trainer import Trainer
from schemas.config import TrainConfig
from schemas.settings import Sharding

log = logging.getLogger(__name__)


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """A CPU copy of the whole tensor: gathered from every rank when sharded (every rank must call it)."""
    full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
    return full.detach().to("cpu", copy=True)


def placed_like(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``full`` as ``like`` holds it: this rank's shard of it when ``like`` is sharded (no communication)."""
    full = full.to(device=like.device, dtype=like.dtype)
    if isinstance(like, DTensor):
        return distribute_tensor(full, like.device_mesh, like.placements, src_data_rank=None)
    return full


class ShardedTrainer(Trainer):
    """A ``Trainer`` that becomes one rank of a gang with ``shard``; until then it is a whole trainer."""

    def shard(self, sharding: Sharding, per_device: int) -> None:
        """Make the model this rank's part of the world joined (collectives.join_world)."""
        adapter_names = self._adapter_parameter_names()
        root: FSDPModule | None = None
        if sharding == "fsdp":
            world = torch.distributed.get_world_size()
            mesh = init_device_mesh(self.device.type, (world,))
            for layer in self.model.get_base_model().get_decoder().layers:
                fully_shard(layer, mesh=mesh)
            root = fully_shard(self.head, mesh=mesh)
            for module in self.head.modules():
                if isinstance(module, FSDPModule):
                    # Sum, not average: each rank's loss is already its share of the step's.
                    module.set_gradient_divide_factor(1.0)
                    if self.device.type != "cuda":  # gloo has no pre-multiplied sum (NCCL's multiplies by 1)
                        module.set_force_sum_reduction_for_comms(True)
        else:
            self.model.to(self.device)  # read on the CPU (rank.py): the whole model to this rank's device
        # fully_shard replaced the parameters (by name), on this rank's device: the adapter's names follow them.
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        by_name = dict(self.model.named_parameters())
        self._adapter = {key: by_name[name] for key, name in adapter_names.items()}
        self.optimizer = None
        self.ranks = GangRanks(per_device, root, self.device)

    def _adapter_parameter_names(self) -> dict[str, str]:
        """PEFT's state-dict name of each adapter tensor -> its parameter's name in the model."""
        names = {p.data_ptr(): name for name, p in self.model.named_parameters() if p.requires_grad}
        state = get_peft_model_state_dict(self.model)
        missing = [key for key, tensor in state.items() if tensor.data_ptr() not in names]
        if missing:
            raise ValueError(
                f"adapter tensors {missing[:3]} are not the model's parameters: a gang cannot shard them"
            )
        return {key: names[tensor.data_ptr()] for key, tensor in state.items()}

    def _live_adapter(self) -> dict[str, torch.Tensor]:
        assert self._adapter is not None, "shard() first"
        return self._adapter

    def load_state(self, directory: str | Path) -> None:
        """The adapter and (when present) the optimizer state of a checkpoint dir, each rank keeping its shard."""
        directory = Path(directory)
        adapter = self._live_adapter()
        weights = load_file(str(directory / ADAPTER_WEIGHTS))
        if weights.keys() != adapter.keys():
            unexpected = sorted(weights.keys() - adapter.keys())[:3]
            raise ValueError(f"{directory}: adapter keys differ from the model's (unexpected: {unexpected})")
        with torch.no_grad():
            for name, tensor in weights.items():
                live = adapter[name]
                shard = placed_like(tensor, live)
                (live.to_local() if isinstance(live, DTensor) else live).copy_(
                    shard.to_local() if isinstance(shard, DTensor) else shard
                )
        self.optimizer = None
        state = read_optimizer_state(directory)
        if state is None:
            return
        kind = state_kind(state)
        if kind == PAGED_ADAMW_8BIT and (self.ranks.shards_base or not runs_8bit(self.device)):
            log.warning("%s: its 8-bit AdamW state cannot run on these ranks: a fresh optimizer", directory)
            return
        for index, entry in state["state"].items():
            like = self.params[int(index)]
            for name, value in entry.items():
                if name != "step" and value.shape == like.shape:  # AdamW's moments: shaped as the param
                    entry[name] = placed_like(value, like)
        self.optimizer = optimizers.new_optimizer(self.params, TrainConfig(), kind)
        self.optimizer.load_state_dict(state)

    def optimizer_kind(self, config: TrainConfig) -> str:
        """AdamW under FSDP: bitsandbytes' 8-bit AdamW does not take sharded (DTensor) parameters."""
        kind = super().optimizer_kind(config)
        if kind == PAGED_ADAMW_8BIT and self.ranks.shards_base:
            if self.optimizer is None:  # said once a run, when its optimizer is made
                log.warning(
                    "8-bit AdamW does not take FSDP's sharded parameters: torch's AdamW, same settings"
                )
            return ADAMW
        return kind

    def snapshot(self) -> Snapshot:
        """The whole adapter and optimizer state, gathered (every rank must call it, in step)."""
        adapter = {name: whole(tensor) for name, tensor in self._live_adapter().items()}
        optimizer: dict[str, Any] | None = None
        if self.optimizer is not None:
            optimizer = self.optimizer.state_dict()
            optimizer["state"] = {
                index: {name: whole(value) for name, value in entry.items()}
                for index, entry in optimizer["state"].items()
            }
        return Snapshot(adapter, self._adapter_config, optimizer, torch.get_rng_state())

    def adapter_state(self) -> dict[str, torch.Tensor]:
        return self.snapshot().adapter
