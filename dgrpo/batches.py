"""``trajectory_group_batches``: ART's streaming gather, yielding a batch as soon as enough groups finished.

    async for batch in dgrpo.trajectory_group_batches(groups, batch_size=4):
        await model.train(batch)

Up to ``batch_size * max_concurrent_batches`` groups run at once, so the next batch's rollouts are
already running while the caller trains on this one. ``max_batch_exceptions`` is each batch's own budget
(ART 0.5.23 applied it to the first batch only; ART's main fixed that): the rollouts that raised in a batch,
and the group awaitables that raised while it filled, each dropped and counted.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import AsyncIterator, Awaitable, Iterable

from tqdm.auto import tqdm

from dgrpo.errors import TooManyRolloutErrors
from schemas.trajectory import TrajectoryGroup


async def _finished(group: Awaitable[TrajectoryGroup]) -> TrajectoryGroup | Exception:
    """The finished group, or the exception of a group awaitable (not a ``TrajectoryGroup``, whose rollouts'
    exceptions it records itself) that raised."""
    try:
        result = await group
    except Exception as err:
        if isinstance(group, TrajectoryGroup):
            raise
        return err
    if not isinstance(result, TrajectoryGroup):
        raise TypeError(f"trajectory_group_batches awaits TrajectoryGroups, got {type(result).__name__}")
    return result


def _check_exceptions(
    batch: list[TrajectoryGroup], failed: list[Exception], max_batch_exceptions: int | float
) -> None:
    """Raise when the batch's rollouts and the group awaitables that failed while it filled (``failed``, each
    one rollout) raised more than ``max_batch_exceptions`` (a count, or a fraction of the batch's rollouts)."""
    raised = sum(len(g.exceptions) for g in batch) + len(failed)
    rollouts = raised + sum(len(g.trajectories) for g in batch)
    if isinstance(max_batch_exceptions, float) and 0 < max_batch_exceptions < 1:
        limit = math.floor(max_batch_exceptions * rollouts)
    else:
        limit = int(max_batch_exceptions)
    if raised > limit:
        records = [f"{e.type}: {e.message}" for g in batch for e in g.exceptions]
        first = records[0] if records else f"{type(failed[0]).__name__}: {failed[0]}"
        raise TooManyRolloutErrors(
            f"{raised} rollout(s) of a batch raised, more than max_batch_exceptions={limit} allows; "
            f"the first: {first}. Fix the rollout function, or pass a larger "
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

    The first ``skip_batches * batch_size`` groups are never started (resuming a run). A group awaitable
    that raises is dropped and counted against the batch being filled; a batch whose rollouts (and dropped
    groups) raised more than ``max_batch_exceptions`` times raises ``TooManyRolloutErrors``.
    """
    if batch_size < 1 or max_concurrent_batches < 1:
        raise ValueError(
            f"batch_size={batch_size} and max_concurrent_batches={max_concurrent_batches} must be at least 1"
        )
    unstarted = list(groups)[batch_size * skip_batches :]
    unstarted.reverse()  # pop() from the end starts them in the given order
    running: set[asyncio.Task[TrajectoryGroup | Exception]] = set()
    batch: list[TrajectoryGroup] = []
    failed: list[Exception] = []  # group awaitables that raised while this batch filled
    bar = tqdm(total=batch_size, desc=pbar_desc, unit="group", disable=pbar_desc is None)
    try:
        while unstarted or running:
            while unstarted and len(running) < batch_size * max_concurrent_batches:
                running.add(asyncio.ensure_future(_finished(unstarted.pop())))
            done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                result = task.result()
                if isinstance(result, TrajectoryGroup):
                    batch.append(result)
                else:
                    failed.append(result)
                    if not isinstance(max_batch_exceptions, float) or max_batch_exceptions >= 1:
                        _check_exceptions(
                            batch[:batch_size], failed, max_batch_exceptions
                        )  # now, not at the end
            bar.update(len(done))
            while len(batch) >= batch_size:
                ready, batch = batch[:batch_size], batch[batch_size:]
                _check_exceptions(ready, failed, max_batch_exceptions)
                failed = []  # the next batch's budget is its own
                bar.reset()
                yield ready
        if batch or failed:
            _check_exceptions(batch, failed, max_batch_exceptions)
        if batch:
            yield batch
    finally:
        for task in running:
            task.cancel()
        for never_started in unstarted:
            if inspect.iscoroutine(never_started):
                never_started.close()  # it will not run now: no "never awaited" warning for the caller's
        bar.close()
