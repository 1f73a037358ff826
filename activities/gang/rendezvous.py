"""Who trains a step together: the gang's world for one attempt.

A worker's own ranks form a world of their own (``local_roster``); trainer workers started with a gang name form
one over hosts, their rendezvous through the object store (below).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from activities.gang.local_ranks import LocalRanks
from host.processes import HOST, free_port
from schemas.settings import GangSettings


@dataclass(frozen=True)
class Roster:
    """One attempt's world: where rank 0 serves the rendezvous, how many ranks, this worker's first."""

    world: str
    """Names the world; the ranks of a world already joined keep it (``fresh`` False)."""
    fresh: bool
    address: str
    port: int
    world_size: int
    first_rank: int
    members: tuple[str, ...]
    """The workers of the world, in rank order."""


def local_roster(local: LocalRanks, settings: GangSettings, worker_id: str = "") -> Roster:
    """The world of this worker's ranks alone: the one they joined, or a new one on loopback."""
    if local.world is not None:
        return Roster(local.world, False, HOST, 0, settings.ranks, 0, (worker_id,))
    return Roster(uuid.uuid4().hex[:12], True, HOST, free_port(), settings.ranks, 0, (worker_id,))
