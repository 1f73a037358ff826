"""Training sequences that share a prompt, forwarded as one packed row: the prompt once, then each sequence's
continuation, each attending to the prompt and to itself only.

A group's rollouts share their prompt. In the demo the prompt is 58 of a sequence's ~67 tokens, so an
unpacked micro-batch forwards and back-propagates the same prompt eight times. A pack holds the shared
prefix (every token before a sequence's first trainable token; equal across its members) once, followed by
each member's continuation; a 4D attention mask lets a continuation see the prefix and its own earlier
tokens, and its tokens keep the position ids they have in their own sequence. Every trained token therefore
gets the logits it gets in its own sequence (up to float rounding), and the loss and its gradient are the same
sums as unpacked: the prefix's activations receive the gradient of all its members at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from activities.tokenize import TrainSequence


@dataclass(frozen=True)
class Pack:
    """Sequences ``members`` (indices into the step's sequences) that share their first ``prefix`` tokens."""

    prefix: int
    members: tuple[int, ...]


@dataclass
class PackedBatch:
    """One micro-batch of packs, as tensors.

    ``ids``, ``positions``: ``[rows, width]``; ``mask``: ``[rows, 1, width, width]`` (True: may attend).
    The trained tokens, flattened: the hidden state at ``(row, column)`` predicts ``target``, with the
    sampling logprob ``old``, the loss weight ``weight`` and its sequence's ``advantage``.
    """

    ids: torch.Tensor
    positions: torch.Tensor
    mask: torch.Tensor
    row: torch.Tensor
    column: torch.Tensor
    target: torch.Tensor
    old: torch.Tensor
    weight: torch.Tensor
    advantage: torch.Tensor
    n_sequences: int


def first_trainable(sequence: TrainSequence) -> int:
    """The index of the sequence's first trainable token (at least 1: token 0 is never predicted)."""
    for i, trainable in enumerate(sequence.trainable):
        if trainable and i > 0:
            return i
    return len(sequence.tokens)


def plan(sequences: Sequence[TrainSequence], micro_batch_size: int) -> list[list[Pack]]:
    """The step's micro-batches: packs of sequences with the same prefix, at most ``micro_batch_size``
    sequences per micro-batch (a larger group is split into packs that each repeat the prefix), shortest
    packs together so rows pad little. Sequences without a trainable token are left out (no loss)."""
    by_prefix: dict[tuple[int, ...], list[int]] = {}
    for i, sequence in enumerate(sequences):
        first = first_trainable(sequence)
        if first < len(sequence.tokens):
            by_prefix.setdefault(tuple(sequence.tokens[:first]), []).append(i)
    packs = [
        Pack(len(prefix), tuple(members[start : start + micro_batch_size]))
        for prefix, members in by_prefix.items()
        for start in range(0, len(members), micro_batch_size)
    ]
    packs.sort(key=lambda p: (_width(p, sequences), p.members))
    batches: list[list[Pack]] = []
    count = 0
    for pack in packs:
        if not batches or count + len(pack.members) > micro_batch_size:
            batches.append([])
            count = 0
        batches[-1].append(pack)
        count += len(pack.members)
    return batches


def _width(pack: Pack, sequences: Sequence[TrainSequence]) -> int:
    return pack.prefix + sum(len(sequences[i].tokens) - pack.prefix for i in pack.members)


def build(
    packs: Sequence[Pack],
    sequences: Sequence[TrainSequence],
    weights: Sequence[Sequence[float]],
    pad_id: int,
) -> PackedBatch:
    """The tensors of one micro-batch (``weights``: per-token loss weights aligned with each sequence)."""
    width = max(_width(pack, sequences) for pack in packs)
    ids = torch.full((len(packs), width), pad_id, dtype=torch.long)
    positions = torch.zeros((len(packs), width), dtype=torch.long)
    # Padding attends to itself only, so no row of the mask is empty (an empty row gives NaN).
    mask = torch.eye(width, dtype=torch.bool).repeat(len(packs), 1, 1)
    row: list[int] = []
    column: list[int] = []
    target: list[int] = []
    old: list[float] = []
    weight: list[float] = []
    advantage: list[float] = []
    for r, pack in enumerate(packs):
        p = pack.prefix
        prefix = sequences[pack.members[0]].tokens[:p]
        ids[r, :p] = torch.tensor(prefix, dtype=torch.long)
        positions[r, :p] = torch.arange(p)
        mask[r, :p, :p] = torch.tril(torch.ones((p, p), dtype=torch.bool))
        offset = p
        for i in pack.members:
            sequence, w = sequences[i], weights[i]
            rest = len(sequence.tokens) - p
            span = slice(offset, offset + rest)
            ids[r, span] = torch.tensor(sequence.tokens[p:], dtype=torch.long)
            positions[r, span] = torch.arange(p, p + rest)
            mask[r, span, :p] = True
            mask[r, span, span] = torch.tril(torch.ones((rest, rest), dtype=torch.bool))
            for t in range(p, len(sequence.tokens)):
                if w[t] > 0:
                    # Token t is predicted by the hidden state of token t - 1: the prefix's last for t == p.
                    row.append(r)
                    column.append(p - 1 if t == p else offset + (t - p) - 1)
                    target.append(sequence.tokens[t])
                    old.append(sequence.sampling_logprobs[t])
                    weight.append(w[t])
                    advantage.append(sequence.advantage)
            offset += rest
    return PackedBatch(
        ids=ids,
        positions=positions,
        mask=mask.unsqueeze(1),
        row=torch.tensor(row, dtype=torch.long),
        column=torch.tensor(column, dtype=torch.long),
        target=torch.tensor(target, dtype=torch.long),
        old=torch.tensor(old, dtype=torch.float32),
        weight=torch.tensor(weight, dtype=torch.float32),
        advantage=torch.tensor(advantage, dtype=torch.float32),
        n_sequences=sum(len(pack.members) for pack in packs),
    )
