"""What a trainer worker and its rank processes say to each other, over the authenticated local connection
each rank opens to its worker (``multiprocessing.connection``, a random key per worker).

Worker to rank: ``Load`` (build the model), ``Join`` (join a world, shard the model), ``Train`` (one step). Rank
to worker: ``Hello`` once connected, ``Beat`` every second from a thread of its own (a stopped or frozen rank goes
silent), ``Loaded``, ``Joined``, ``Progress`` after each micro-batch, ``Trained``, or ``Failed``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from activities.checkpoints import TrainerState
from activities.tokenize import TrainSequence
from schemas.activities import SftConfig
from schemas.config import ModelSpec, TrainConfig
from schemas.settings import Sharding


@dataclass(frozen=True)
class Load:
    model: ModelSpec
    precision: str
    device: str
    threads: int
    """torch threads of this rank (a CPU's cores shared by its ranks)."""
    per_device: int
    """Ranks sharing this rank's device's memory (the memory planner's share)."""


@dataclass(frozen=True)
class Join:
    address: str
    port: int
    rank: int
    world_size: int
    sharding: Sharding
    timeout_s: float


@dataclass(frozen=True)
class Stage:
    """Where rank 0 writes the trained step, and what goes with it."""

    directory: Path
    state: TrainerState
    """``trainer_state.json`` but the micro-batch the step finished with, which rank 0 fills in."""
    metrics: dict[str, float]
    """The step's numbers known before it trained (sequences dropped, ...): its own are added."""


@dataclass(frozen=True)
class Train:
    """One step: restore (``restore_from``: a checkpoint directory every rank reads; None: keep what the ranks
    hold), train a GRPO step on ``sequences`` or, with ``sft_batches``, one update per batch, gather, stage."""

    step: int
    micro_batch: int
    restore_from: Path | None
    stage: Stage | None
    """The leader's first rank's; None on every other rank."""
    world_size: int
    """The world the step trains in: a rank in another (or none) refuses it rather than train alone."""
    config: TrainConfig | None = None
    sequences: list[TrainSequence] = field(default_factory=list)
    sft: SftConfig | None = None
    sft_batches: list[tuple[float, list[TrainSequence]]] = field(default_factory=list)


@dataclass(frozen=True)
class Hello:
    local_rank: int
    pid: int


@dataclass(frozen=True)
class Beat:
    pass


@dataclass(frozen=True)
class Loaded:
    pass


@dataclass(frozen=True)
class Joined:
    base_fraction: float
    """The share of the frozen base's weights this rank holds (1 replicated, ~1/world under FSDP)."""


@dataclass(frozen=True)
class Progress:
    done: int
    of: int
    micro_batch: int


@dataclass(frozen=True)
class Trained:
    """A step done: its stats summed over the ranks (the same on every rank)."""

    stats: dict[str, float]
    micro_batch: int
    gradient_checkpointing: bool
    seconds: float
    """The forward, backward and optimizer passes alone."""
    peak_bytes: int = 0
    """This rank's peak memory: on a GPU, torch's allocated peak; on a CPU, the process's resident peak."""
    sft_losses: list[float] = field(default_factory=list)
    sft_grad_norms: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class Failed:
    kind: Literal["out_of_memory", "non_finite", "bad_input", "error"]
    message: str
    micro_batch: int = 0


ToRank = Load | Join | Train
FromRank = Hello | Beat | Loaded | Joined | Progress | Trained | Failed
