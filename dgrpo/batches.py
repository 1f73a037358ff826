"""``trajectory_group_batches``: ART's streaming gather, yielding a batch as soon as enough groups finished.

    async for batch in dgrpo.trajectory_group_batches(groups, batch_size=4):
        await model.train(batch)

Up to ``batch_size * max_concurrent_batches`` groups run at once, so the next batch's rollouts are
already running while the caller trains on this one.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Awaitable, Iterable

from tqdm.auto import tqdm

from dgrpo.errors import TooManyRolloutErrors
from schemas.trajectory import TrajectoryGroup


async def _finished(group: Awaitable[TrajectoryGroup]) -> TrajectoryGroup:
    result = await group
    if not isinstance(result, TrajectoryGroup):
        raise TypeError(f"trajectory_group_batches awaits TrajectoryGroups, got {type(result).__name__}")
    return result


def _check_exceptions(batch: list[TrajectoryGroup], max_batch_exceptions: int | float) -> None:
    raised = sum(len(g.exceptions) for g in batch)
    rollouts = raised + sum(len(g.trajectories) for g in batch)
    # As in gather_trajectory_groups: a float below 1 is a fraction of the batch's rollouts.
    if isinstance(max_batch_exceptions, float) and 0 < max_batch_exceptions < 1:
        limit = math.floor(max_batch_exceptions * rollouts)
    else:
        limit = int(max_batch_exceptions)
    if raised > limit:
        first = next(e for g in batch for e in g.exceptions)
        raise TooManyRolloutErrors(
            f"{raised} rollout(s) of a batch raised, more than max_batch_exceptions={limit} allows; "
            f"the first: {first.type}: {first.message}. Fix the rollout function, or pass a larger "
            "max_batch_exceptions (a count, or a fraction of the batch's rollouts)"
        )


async def trajectory_group_batches(
    groups: Iterable[Awaitable[TrajectoryGroup]],
    *,
    batch_size: int,
    max_batch_exceptions: int | float = 0,
    max_concurrent_batches: int = 4,
    skip_batches: int = 0,
    pbar_desc: str | None = "batches",
    pbar_total_completion_tokens: bool = False,
) -> AsyncIterator[list[TrajectoryGroup]]:
    """Yield lists of ``batch_size`` finished groups, in the order they finish (the last may be shorter).

    The first ``skip_batches * batch_size`` groups are never started (resuming a run). A batch whose
    rollouts raised more than ``max_batch_exceptions`` times raises ``TooManyRolloutErrors``.
    """
    if batch_size < 1 or max_concurrent_batches < 1:
        raise ValueError(
            f"batch_size={batch_size} and max_concurrent_batches={max_concurrent_batches} must be at least 1"
        )
    unstarted = list(groups)[batch_size * skip_batches :]
    unstarted.reverse()  # pop() from the end starts them in the given order
    running: set[asyncio.Task[TrajectoryGroup]] = set()
    batch: list[TrajectoryGroup] = []
    bar = tqdm(total=batch_size, desc=pbar_desc, unit="group", disable=pbar_desc is None)
    try:
        while unstarted or running:
            while unstarted and len(running) < batch_size * max_concurrent_batches:
                running.add(asyncio.ensure_future(_finished(unstarted.pop())))
            done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            batch.extend(task.result() for task in done)
            bar.update(len(done))
            while len(batch) >= batch_size:
                ready, batch = batch[:batch_size], batch[batch_size:]
                _check_exceptions(ready, max_batch_exceptions)
                bar.reset()
                yield ready
        if batch:
            _check_exceptions(batch, max_batch_exceptions)
            yield batch
    finally:
        for task in running:
            task.cancel()
        bar.close()
