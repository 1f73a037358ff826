"""What a training step asks of the other ranks of its gang, and the answer of a trainer that is alone.

A step over N ranks (activities/gang/) runs the loop a step on one device runs (``Trainer.train_step``,
``sft.sft_update``): each rank trains its share of the step's sequences, each weighted against the step's whole
token weight, so the gradients summed over the ranks are the gradient one device computes; every rank runs as many
micro-batches (FSDP's collectives pair up rank by rank: a rank with fewer runs idle ones weighing nothing); the
gradient norm clipped to is the whole step's; the loss and the metrics are summed over the ranks. ``ONE_RANK``
answers for a trainer alone: its share is everything and nothing is exchanged, so one device trains as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from activities.tokenize import TrainSequence


class Ranks(Protocol):
    """The other ranks of a step, as the training loop sees them."""

    @property
    def world_size(self) -> int: ...

    @property
    def rank(self) -> int: ...

    @property
    def shards_base(self) -> bool:
        """Whether the frozen base and the adapter are sharded over the ranks (FSDP) rather than replicated."""
        ...

    @property
    def per_device(self) -> int:
        """Ranks whose memory is this rank's device's (the CPU ranks of one host share its memory)."""
        ...

    def share(self, sequences: Sequence[TrainSequence]) -> list[int]:
        """The indices of the sequences this rank trains."""
        ...

    def most(self, count: int) -> int:
        """The largest ``count`` of all ranks."""
        ...

    def least(self, count: int) -> int:
        """The smallest ``count`` of all ranks."""
        ...

    def gradient_sync(self, on: bool) -> None:
        """Whether the next backward pass reduces gradients (FSDP's reduce-scatter); off while accumulating."""
        ...

    def reduce_gradients(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Sum the gradients the ranks accumulated (where the backward pass did not already)."""
        ...

    def clip_grad_norm(self, params: Sequence[torch.nn.Parameter], max_norm: float) -> float:
        """Clip the summed gradients to ``max_norm`` by their global norm; that norm."""
        ...

    def sum(self, values: Sequence[float]) -> list[float]:
        """Each of ``values`` summed over the ranks."""
        ...


class OneRank:
    """A trainer alone: the whole step is its share, nothing is exchanged."""

    world_size = 1
    rank = 0
    shards_base = False
    per_device = 1

    def share(self, sequences: Sequence[TrainSequence]) -> list[int]:
        return list(range(len(sequences)))

    def most(self, count: int) -> int:
        return count

    def least(self, count: int) -> int:
        return count

    def gradient_sync(self, on: bool) -> None:
        pass

    def reduce_gradients(self, params: Sequence[torch.nn.Parameter]) -> None:
        pass

    def clip_grad_norm(self, params: Sequence[torch.nn.Parameter], max_norm: float) -> float:
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))

    def sum(self, values: Sequence[float]) -> list[float]:
        return list(values)


ONE_RANK: Ranks = OneRank()
