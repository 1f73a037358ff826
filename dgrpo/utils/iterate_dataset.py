"""ART's ``art.utils.iterate_dataset``: a training loop's batches of scenarios, step by step.

    for batch in iterate_dataset(scenarios, groups_per_step=4, num_epochs=2, initial_step=await model.get_step()):
        ...  # batch.items, batch.step, batch.epoch, batch.epoch_step

A batch also unpacks as ART 0.3's tuple: ``for items, epoch, step, epoch_step in iterate_dataset(...)``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")


@dataclass
class DatasetBatch(Generic[T]):
    """One training step's items, and where the step sits in the run."""

    items: list[T]
    """The step's scenarios (``groups_per_step`` of them; the epoch's last step may have fewer)."""
    step: int
    """The global step number, counted across epochs from 0."""
    epoch: int
    """The epoch, from 0."""
    epoch_step: int
    """The step within its epoch, from 0."""

    def __iter__(self) -> Iterator[Any]:
        """ART 0.3's tuple order: ``items, epoch, step, epoch_step``."""
        return iter((self.items, self.epoch, self.step, self.epoch_step))


def epoch_order(size: int, epoch: int) -> list[int]:
    """The item order of ``epoch``: a shuffle seeded by the epoch alone, so a resumed run sees the same order."""
    order = list(range(size))
    random.Random(epoch).shuffle(order)
    return order


def iterate_dataset(
    dataset: Sequence[T],
    groups_per_step: int = 1,
    num_epochs: int = 1,
    initial_step: int = 0,
    use_tqdm: bool = True,
) -> Iterator[DatasetBatch[T]]:
    """Batches of ``groups_per_step`` items over ``num_epochs`` shuffled epochs, from ``initial_step`` on.

    Steps before ``initial_step`` are skipped (resuming at ``await model.get_step()``), with the same
    batches as an uninterrupted run would have had.
    """
    if groups_per_step < 1 or num_epochs < 0 or initial_step < 0:
        raise ValueError(
            f"iterate_dataset(groups_per_step={groups_per_step}, num_epochs={num_epochs}, "
            f"initial_step={initial_step}): groups_per_step must be >= 1, the others >= 0"
        )
    if not dataset:
        return
    steps_per_epoch = math.ceil(len(dataset) / groups_per_step)
    bar = tqdm(
        initial=initial_step,
        total=steps_per_epoch * num_epochs,
        desc="Iterating dataset",
        unit="batch",
        disable=not use_tqdm,
    )
    try:
        for epoch in range(num_epochs):
            order = epoch_order(len(dataset), epoch)
            for epoch_step in range(steps_per_epoch):
                step = epoch * steps_per_epoch + epoch_step
                if step < initial_step:
                    continue
                chosen = order[epoch_step * groups_per_step : (epoch_step + 1) * groups_per_step]
                yield DatasetBatch([dataset[i] for i in chosen], step, epoch, epoch_step)
                bar.update(1)
    finally:
        bar.close()


__all__ = ["DatasetBatch", "epoch_order", "iterate_dataset"]
