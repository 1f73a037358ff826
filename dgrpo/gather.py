"""``gather_trajectory_groups``: run many groups of rollouts at once, with a progress bar, as ART does."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from tqdm.auto import tqdm

from dgrpo.errors import TooManyRolloutErrors
from schemas.trajectory import ROLLOUT_DONE, Trajectory, TrajectoryGroup

AfterEach = Callable[[TrajectoryGroup], Awaitable[TrajectoryGroup | None]]
"""Applied to each finished group (``ruler_score_group``); returning None drops the group."""


class _Progress:
    """The bar over rollouts, with the running reward mean and the exceptions so far."""

    def __init__(self, total: int | None, desc: str | None, max_exceptions: int | float) -> None:
        self.bar = tqdm(total=total, desc=desc, unit="rollout", disable=desc is None)
        self.limit = self._limit(max_exceptions, total or 0)
        self.rewards: list[float] = []
        self.exceptions: list[BaseException] = []
        self.exceeded = asyncio.Event()

    @staticmethod
    def _limit(max_exceptions: int | float, total: int) -> int:
        # As in ART: a float below 1 is a fraction of all rollouts, anything else a count.
        if isinstance(max_exceptions, float) and 0 < max_exceptions < 1:
            return math.floor(max_exceptions * total)
        return int(max_exceptions)

    def __call__(self, result: Trajectory | BaseException) -> None:
        if isinstance(result, BaseException):
            self.exceptions.append(result)
            if len(self.exceptions) > self.limit:
                self.exceeded.set()
        elif isinstance(result, Trajectory):
            self.rewards.append(result.reward)
        self.bar.update(1)
        postfix: dict[str, float] = {"exceptions": len(self.exceptions)}
        if self.rewards:
            postfix["reward"] = round(sum(self.rewards) / len(self.rewards), 3)
        self.bar.set_postfix(postfix, refresh=False)

    def error(self) -> TooManyRolloutErrors:
        first = self.exceptions[0]
        return TooManyRolloutErrors(
            f"{len(self.exceptions)} rollout(s) raised, more than max_exceptions={self.limit} allows; "
            f"the first: {type(first).__name__}: {first}. Fix the rollout function, or pass a larger "
            "max_exceptions (a count, or a fraction of all rollouts) to keep the groups that finished"
        )


async def _one(group: Awaitable[TrajectoryGroup], after_each: AfterEach | None) -> TrajectoryGroup | None:
    finished = await group
    if not isinstance(finished, TrajectoryGroup):
        raise TypeError(f"gather_trajectory_groups awaits TrajectoryGroups, got {type(finished).__name__}")
    return finished if after_each is None else await after_each(finished)


async def gather_trajectory_groups(
    groups: Iterable[Awaitable[TrajectoryGroup]],
    *,
    pbar_desc: str | None = "gather",
    max_exceptions: int | float = 0,
    after_each: AfterEach | None = None,
) -> list[TrajectoryGroup]:
    """Await every group concurrently and return them in order (groups ``after_each`` dropped left out).

    Rollouts that raise are recorded in their group's ``exceptions``; once more than ``max_exceptions``
    have raised (a count, or a fraction of all rollouts when a float below 1), the rest are cancelled
    and ``TooManyRolloutErrors`` is raised. ``pbar_desc=None`` hides the progress bar.
    """
    pending = list(groups)
    counts = [g.pending for g in pending if isinstance(g, TrajectoryGroup)]
    total = sum(counts) if len(counts) == len(pending) else None
    progress = _Progress(total, pbar_desc, max_exceptions)
    token = ROLLOUT_DONE.set(progress)
    try:
        # Tasks copy the context now, so every rollout of every group reports to this bar.
        gathered = asyncio.ensure_future(asyncio.gather(*(_one(g, after_each) for g in pending)))
        watcher = asyncio.ensure_future(progress.exceeded.wait())
        waiters: list[asyncio.Future[Any]] = [gathered, watcher]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            if progress.exceeded.is_set():
                gathered.cancel()
                await asyncio.gather(gathered, return_exceptions=True)
                raise progress.error()
            results = gathered.result()
        finally:
            watcher.cancel()
            if not gathered.done():
                gathered.cancel()
    finally:
        ROLLOUT_DONE.reset(token)
        progress.bar.close()
    return [g for g in results if g is not None]
