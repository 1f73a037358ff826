"""The ranks of a gang as a step's loop sees them (activities/ranks.py), over torch.distributed.

``join_world`` sets the process group up once per rank process (gloo on a CPU, NCCL on CUDA) with the gang's
collective timeout, so a collective left without its peers (a rank killed, stopped or cut off) raises instead of
waiting forever; the process is recycled after it (activities/gang/local_ranks.py), never reused.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from activities.gang.split import shares
from activities.tokenize import TrainSequence


def join_world(
    address: str, port: int, rank: int, world_size: int, device: torch.device, timeout_s: float
) -> None:
    """Join this process to the gang's world: rank 0 serves the rendezvous store at ``address:port``."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend,
        init_method=f"tcp://{address}:{port}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )


class GangRanks:
    """This rank's view of its gang: ``root`` is the FSDP-sharded model (None: replicated, plain data parallel)."""

    def __init__(self, per_device: int, root: FSDPModule | None, device: torch.device) -> None:
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.per_device = per_device
        self.root = root
        self.device = device
        """Where this rank's collectives' small tensors live (NCCL takes only device tensors)."""

    @property
    def shards_base(self) -> bool:
        return self.root is not None

    def share(self, sequences: Sequence[TrainSequence]) -> list[int]:
        return shares(sequences, self.world_size)[self.rank]

    def most(self, count: int) -> int:
        return self._reduced(count, dist.ReduceOp.MAX)

    def least(self, count: int) -> int:
        return self._reduced(count, dist.ReduceOp.MIN)

    def _reduced(self, count: int, op: dist.ReduceOp.RedOpType) -> int:
        value = torch.tensor([count], dtype=torch.int64, device=self.device)
        dist.all_reduce(value, op=op)
        return int(value.item())

    def gradient_sync(self, on: bool) -> None:
        if self.root is not None:
            self.root.set_requires_gradient_sync(on)

    def reduce_gradients(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Replicated: one all-reduce of every gradient, flattened (FSDP reduce-scattered them in backward)."""
        if self.root is not None:
            return
        for p in params:
            if p.grad is None:  # every rank must bring every gradient, zero or not
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params if p.grad is not None])
        dist.all_reduce(flat)
        offset = 0
        for p in params:
            assert p.grad is not None
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p.grad))
            offset += p.numel()

    def clip_grad_norm(self, params: Sequence[torch.nn.Parameter], max_norm: float) -> float:
        grads = [p.grad for p in params if p.grad is not None]
        total = torch.nn.utils.get_total_norm(grads, 2.0)
        if isinstance(total, DTensor):  # the norm of sharded gradients: a partial sum until gathered
            total = total.full_tensor()
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
        return float(total)

    def sum(self, values: Sequence[float]) -> list[float]:
        summed = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        dist.all_reduce(summed)
        return [float(v) for v in summed.tolist()]
