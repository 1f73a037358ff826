"""ART's ``art.utils.sft``: SFT data as JSONL chats, learning-rate schedules, and a dataset cut into
``train_sft`` calls.

A line of an SFT file is one chat, ``{"messages": [...], "tools": [...]}`` (``tools`` optional), the format
``model.train_sft`` uploads for the trainer (``dgrpo.client.sft.examples_jsonl``). A schedule gives one learning rate
per batch, so a dataset trained in several ``train_sft`` calls (``create_sft_dataset_iterator``,
``train_sft_from_file``) follows one warmup and one decay across all of them.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import random
from collections.abc import Iterator, Sequence
from typing import Any, Literal, NamedTuple, Protocol

from tqdm.auto import tqdm

from dgrpo.types import TrainResult, TrainSFTConfig
from schemas.trajectory import Trajectory

log = logging.getLogger(__name__)

ScheduleMethod = Literal["cosine", "linear", "constant"]


class SFTChunk(NamedTuple):
    """One ``train_sft`` call's share of a dataset: its chats, their config, and where it starts."""

    trajectories: list[Trajectory]
    config: TrainSFTConfig
    step: int
    """The first batch's index over all epochs."""
    epoch: int
    epoch_step: int
    """The first batch's index within its epoch."""


class SFTModel(Protocol):
    """What ``train_sft_from_file`` needs of a model: ``TrainableModel.train_sft``."""

    async def train_sft(
        self,
        trajectories: list[Trajectory],
        config: TrainSFTConfig | None = None,
        _config: dict[str, Any] | None = None,
        verbose: bool = False,
        log_metrics: bool = True,
    ) -> TrainResult | None: ...


def resolve_sft_batch_size(*, batch_size: int | Literal["auto"], default_batch_size: int) -> int:
    """A ``TrainSFTConfig.batch_size``, with ``"auto"`` meaning the backend's default."""
    return default_batch_size if batch_size == "auto" else batch_size


def example_line(trajectory: Trajectory) -> str:
    """A trajectory's chat as one SFT JSONL line (choices as their assistant messages)."""
    return json.dumps({"messages": trajectory.messages(), "tools": trajectory.tools}, default=str)


def trajectory_from_line(line: str) -> Trajectory:
    """The trajectory of one SFT JSONL line."""
    row = json.loads(line)
    return Trajectory(messages_and_choices=row.get("messages") or [], tools=row.get("tools"))


def _require_jsonl(file_path: str) -> None:
    if not file_path.endswith(".jsonl"):
        raise ValueError(f"SFT data must be a .jsonl file (one chat per line), got {file_path}")


def _example_lines(file_path: str) -> Iterator[str]:
    with open(file_path, encoding="utf-8") as f:
        yield from (line for line in f if line.strip())


def get_file_row_count(file_path: str) -> int:
    """How many chats (non-blank lines) a JSONL file holds."""
    _require_jsonl(file_path)
    return sum(1 for _ in _example_lines(file_path))


def create_lr_schedule(
    total_steps: int,
    peak_lr: float,
    method: ScheduleMethod = "linear",
    warmup_steps: int = 0,
    min_lr: float = 0.0,
) -> list[float]:
    """One learning rate per step: a linear warmup from ``min_lr`` that reaches ``peak_lr`` on its last
    step (so the first is never ``min_lr``), then ``method``'s decay from ``peak_lr`` down to ``min_lr`` on
    the last step (``constant`` stays at ``peak_lr``)."""
    if method not in ("cosine", "linear", "constant"):
        raise ValueError(f"unknown learning-rate schedule {method!r}: use cosine, linear or constant")
    span = peak_lr - min_lr
    rates = [min_lr + span * (i + 1) / warmup_steps for i in range(min(warmup_steps, total_steps))]
    decay_steps = total_steps - len(rates)
    for i in range(decay_steps):
        done = i / (decay_steps - 1) if decay_steps > 1 else 0.0  # 0 at the first decay step, 1 at the last
        if method == "linear":
            rates.append(peak_lr - span * done)
        elif method == "cosine":
            rates.append(min_lr + span * (1 + math.cos(math.pi * done)) / 2)
        else:
            rates.append(peak_lr)
    return rates


def _schedule(n_batches: int, peak_lr: float, method: ScheduleMethod, warmup_ratio: float) -> list[float]:
    """The schedule over ``n_batches``, warming up on ``warmup_ratio`` of them."""
    return create_lr_schedule(n_batches, peak_lr, method, warmup_steps=int(n_batches * warmup_ratio))


def create_sft_dataset_iterator(
    trajectories: Sequence[Trajectory],
    chunk_size: int = 10,
    epochs: int = 1,
    batch_size: int = 2,
    peak_lr: float = 2e-4,
    schedule_type: ScheduleMethod = "linear",
    warmup_ratio: float = 0.1,
    shuffle: bool = True,
    seed: int = 42,
    initial_step: int = 0,
    show_progress: bool = True,
) -> Iterator[SFTChunk]:
    """The trajectories, for ``epochs``, cut into chunks of ``chunk_size`` batches, one ``train_sft`` call
    each (``await model.train_sft(chunk.trajectories, chunk.config)``). Each chunk's config holds its
    batches' rates of the one schedule over all epochs. Every epoch is shuffled by ``seed + epoch``; a
    chunk never spans two epochs. ``initial_step`` (a batch index over all epochs) resumes at that very batch:
    the chunk holding it starts there, so no batch is trained twice."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be at least 1, got {chunk_size}")
    if not trajectories:
        return
    per_chunk = chunk_size * batch_size
    batches_per_epoch = math.ceil(len(trajectories) / batch_size)  # an epoch's last batch may be short
    schedule = _schedule(batches_per_epoch * epochs, peak_lr, schedule_type, warmup_ratio)
    bar = tqdm(total=len(schedule), initial=initial_step, desc="SFT", unit="batch", disable=not show_progress)
    for epoch in range(epochs):
        order = list(trajectories)
        if shuffle:
            random.Random(seed + epoch).shuffle(order)
        for start in range(0, len(order), per_chunk):
            step = epoch * batches_per_epoch + start // batch_size
            n_batches = math.ceil(len(order[start : start + per_chunk]) / batch_size)
            if step + n_batches <= initial_step:
                continue  # trained before the resume
            skip = max(0, initial_step - step)  # the chunk holding initial_step starts at it
            chats = order[start + skip * batch_size : start + per_chunk]
            step, epoch_step = step + skip, start // batch_size + skip
            rates = schedule[step : step + n_batches - skip]
            yield SFTChunk(
                chats, TrainSFTConfig(learning_rate=rates, batch_size=batch_size), step, epoch, epoch_step
            )
            bar.update(len(rates))
    bar.close()


def iterate_file(
    file_path: str,
    epochs: int = 1,
    shuffle_buffer_size: int = 10000,
    seed: int = 42,
    initial_skip: int = 0,
) -> Iterator[Trajectory]:
    """The chats of a JSONL file, ``epochs`` times, read as a stream: each comes out of a buffer of
    ``shuffle_buffer_size`` at random (seeded by ``seed + epoch``), so only the buffer is in memory. The
    first ``initial_skip`` of the whole sequence are left out (to resume)."""
    _require_jsonl(file_path)
    return itertools.islice(
        (t for epoch in range(epochs) for t in _shuffled(file_path, shuffle_buffer_size, seed + epoch)),
        initial_skip,
        None,
    )


def _shuffled(file_path: str, buffer_size: int, seed: int) -> Iterator[Trajectory]:
    rng = random.Random(seed)
    buffer: list[Trajectory] = []
    for line in _example_lines(file_path):
        buffer.append(trajectory_from_line(line))
        if len(buffer) >= buffer_size:
            # Move a random one to the end and take it from there: the buffer's order does not matter.
            i = rng.randrange(len(buffer))
            buffer[i], buffer[-1] = buffer[-1], buffer[i]
            yield buffer.pop()
    rng.shuffle(buffer)
    yield from buffer


async def train_sft_from_file(
    model: SFTModel,
    file_path: str,
    epochs: int = 1,
    batch_size: int = 2,
    peak_lr: float = 2e-4,
    schedule_type: ScheduleMethod = "linear",
    warmup_ratio: float = 0.1,
    initial_step: int = 0,
    final_step: int | None = None,
    megatron_topology: object = None,
    _config: dict[str, Any] | None = None,
    verbose: bool = False,
    shuffle_buffer_size: int = 10000,
    log_metrics: bool = True,
    assistant_turns: Literal["all", "last"] = "all",
) -> TrainResult | None:
    """One ``model.train_sft`` call on a JSONL file's chats (``epochs`` times, stream-shuffled), its batches
    ``initial_step`` to ``final_step`` (exclusive; None: to the end) of one schedule over the whole file, so
    a long run can be trained in segments. ``assistant_turns="last"`` trains only each chat's final assistant
    turn, and ``log_metrics=False`` leaves the step's row unlogged (ART 0.5.23's). Returns the call's result,
    or None when no batch is left."""
    n_rows = get_file_row_count(file_path)
    # The stream runs on across epochs, so only the very last batch may be short.
    schedule = _schedule(math.ceil(n_rows * epochs / batch_size), peak_lr, schedule_type, warmup_ratio)
    rates = schedule[initial_step:final_step]
    log.info(
        "%s: %d chats, training batches %d to %d", file_path, n_rows, initial_step, initial_step + len(rates)
    )
    if not rates:
        return None
    chats = itertools.islice(
        iterate_file(file_path, epochs, shuffle_buffer_size, initial_skip=initial_step * batch_size),
        len(rates) * batch_size,
    )
    config = TrainSFTConfig(
        learning_rate=rates,
        batch_size=batch_size,
        assistant_turns=assistant_turns,
        megatron_topology=megatron_topology,
    )
    return await model.train_sft(list(chats), config, _config, verbose, log_metrics=log_metrics)
