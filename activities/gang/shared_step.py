"""The step a gang's leader shares with the other members through the object store: what to train (JSON) and the
sequences (one safetensors file: no pickle crosses hosts), each member training its share of them as its own ranks'.

The members train exactly the sequences the leader tokenized: none tokenizes again (another host's tokenizer or
chat template could differ), and every rank splits the same list the same way (activities/gang/split.py).
"""

from __future__ import annotations

from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict
from safetensors.torch import load, save

from activities.gang.messages import Stage, Train
from activities.tokenize import TrainSequence
from schemas.activities import SftConfig
from schemas.config import ModelSpec, TrainConfig
from schemas.refs import CheckpointRef


class SharedStep(BaseModel):
    """``step.json``: one attempt's step as every member trains it."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    step: int
    model: ModelSpec
    precision: str
    micro_batch: int
    staged_id: str
    """The staging the leader makes of it: what every rank holds once it trained."""
    checkpoint: CheckpointRef | None = None
    """The published checkpoint the step starts from (None: a fresh adapter from ``seed``, or a staging the
    ranks hold)."""
    seed: int = 0
    config: TrainConfig | None = None
    sft: SftConfig | None = None
    sft_learning_rates: list[float] = []

    def command(
        self,
        sequences: list[TrainSequence],
        batches: list[int],
        restore: Path | None,
        stage: Stage | None,
        world_size: int,
    ) -> Train:
        """The ``Train`` a rank of a world of ``world_size`` gets (``restore``: the directory it restores, or
        None)."""
        if self.config is not None:
            return Train(self.step, self.micro_batch, restore, stage, world_size, self.config, sequences)
        grouped: list[tuple[float, list[TrainSequence]]] = [(lr, []) for lr in self.sft_learning_rates]
        for sequence, batch in zip(sequences, batches, strict=True):
            grouped[batch][1].append(sequence)
        return Train(self.step, self.micro_batch, restore, stage, world_size, sft=self.sft,
                     sft_batches=[b for b in grouped if b[1]])  # fmt: skip


def sequences_bytes(sequences: list[TrainSequence], batches: list[int] | None = None) -> bytes:
    """``sequences`` (and, for a fine-tuning step, each one's batch) as one safetensors file."""
    lengths = [len(s.tokens) for s in sequences]
    tensors = {
        "lengths": torch.tensor(lengths, dtype=torch.int64),
        "tokens": torch.tensor([t for s in sequences for t in s.tokens], dtype=torch.int64),
        "trainable": torch.tensor([t for s in sequences for t in s.trainable], dtype=torch.bool),
        "sampling_logprobs": torch.tensor(
            [v for s in sequences for v in s.sampling_logprobs], dtype=torch.float64
        ),
        "advantage": torch.tensor([s.advantage for s in sequences], dtype=torch.float64),
        "trajectory_index": torch.tensor([s.trajectory_index for s in sequences], dtype=torch.int64),
        "batch": torch.tensor(batches if batches is not None else [0] * len(sequences), dtype=torch.int64),
    }
    return save(tensors)


def sequences_from(data: bytes) -> tuple[list[TrainSequence], list[int]]:
    """The sequences and batches ``sequences_bytes`` wrote, as they were (NaN logprobs included)."""
    tensors = load(data)
    out = []
    start = 0
    tokens, trainable = tensors["tokens"].tolist(), tensors["trainable"].tolist()
    logprobs = tensors["sampling_logprobs"].tolist()
    for i, length in enumerate(tensors["lengths"].tolist()):
        end = start + length
        out.append(
            TrainSequence(
                tokens[start:end],
                trainable[start:end],
                logprobs[start:end],
                float(tensors["advantage"][i]),
                int(tensors["trajectory_index"][i]),
            )
        )
        start = end
    return out, [int(b) for b in tensors["batch"].tolist()]
