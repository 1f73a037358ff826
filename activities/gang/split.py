"""A step's sequences split over the ranks of a gang: each rank a contiguous run of them, about a world-th of the
step's tokens.

Sequences come grouped (a group's rollouts one after another, sharing their prompt), so contiguous runs keep a
group on one rank, where its prompt is forwarded once (activities/shared_prefix.py); cutting by tokens rather than
by count keeps the ranks' compute about equal, so none waits long at a collective. Every rank computes the same
split from the same sequences: nothing is exchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

from activities.tokenize import TrainSequence


def shares(sequences: Sequence[TrainSequence], world_size: int) -> list[list[int]]:
    """The indices of ``sequences`` each rank trains, in order; a rank may get none when there are fewer
    sequences than ranks."""
    if world_size < 1:
        raise ValueError(f"world_size {world_size} must be at least 1")
    total = sum(len(s.tokens) for s in sequences)
    out: list[list[int]] = [[] for _ in range(world_size)]
    done = 0
    for index, sequence in enumerate(sequences):
        # The rank whose world-th of the step's tokens holds this sequence's middle token.
        middle = done + len(sequence.tokens) / 2
        out[min(world_size - 1, int(middle * world_size / max(total, 1)))].append(index)
        done += len(sequence.tokens)
    return out
