"""``gather_trajectory_groups``: run many groups of rollouts at once, with a progress bar, as ART does."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from tqdm.auto import tqdm

from dgrpo.errors import TooManyRolloutErrors
from schemas.trajectory import ROLLOUT_DONE, Trajectory, TrajectoryGroup

T = TypeVar("T")

AfterEach = Callable[[TrajectoryGroup], Awaitable[TrajectoryGroup | list[TrajectoryGroup] | None]]
"""Applied to each finished group (``ruler_score_group``); None drops the group, a list replaces it."""


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

    def __call__(self, result: Trajectory | list[Trajectory] | BaseException) -> None:
        if isinstance(result, BaseException):
            self.exceptions.append(result)
            if len(self.exceptions) > self.limit:
                self.exceeded.set()
        else:
            finished = result if isinstance(result, list) else [result]
            self.rewards.extend(t.reward for t in finished if isinstance(t, Trajectory))
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


async def _one(
    group: Awaitable[TrajectoryGroup], after_each: AfterEach | None, progress: _Progress
) -> list[TrajectoryGroup]:
    try:
        finished = await group
    except Exception as err:
        if isinstance(group, TrajectoryGroup):
            raise  # not a rollout's failure: a group records those and never raises them
        # A group coroutine that raised is one failure against max_exceptions (as in ART), its group dropped.
        progress(err)
        return []
    if not isinstance(finished, TrajectoryGroup):
        raise TypeError(f"gather_trajectory_groups awaits TrajectoryGroups, got {type(finished).__name__}")
    kept = finished if after_each is None else await after_each(finished)
    if kept is None:
        return []
    return kept if isinstance(kept, list) else [kept]


async def gather_trajectory_groups(
    groups: Iterable[Awaitable[TrajectoryGroup]],
    *,
    pbar_desc: str | None = "gather",
    pbar_total_completion_tokens: bool = False,
    max_exceptions: int | float = 0,
    max_metrics: int | None = None,
    after_each: AfterEach | None = None,
) -> list[TrajectoryGroup]:
    """Await every group concurrently and return them in order (groups ``after_each`` dropped left out,
    and the groups of a list it returned in the place of the one it got).

    Rollouts that raise are recorded in their group's ``exceptions``, and a group awaitable (not a
    ``TrajectoryGroup``) that raises is dropped and counted likewise; once more than ``max_exceptions``
    have raised (a count, or a fraction of all rollouts when a float below 1), the rest are cancelled
    and ``TooManyRolloutErrors`` is raised. ``pbar_desc=None`` hides the progress bar. ART's
    ``pbar_total_completion_tokens`` and ``max_metrics`` (what its bar shows) are accepted; the bar
    here shows the running reward and the exceptions.
    """
    pending = list(groups)
    counts = [g.pending for g in pending if isinstance(g, TrajectoryGroup)]
    total = sum(counts) if len(counts) == len(pending) else None
    progress = _Progress(total, pbar_desc, max_exceptions)
    token = ROLLOUT_DONE.set(progress)
    try:
        # Tasks copy the context now, so every rollout of every group reports to this bar.
        results = await _all_unless_too_many(progress, [_one(g, after_each, progress) for g in pending])
    finally:
        ROLLOUT_DONE.reset(token)
    return [g for kept in results for g in kept]


async def _all_unless_too_many(progress: _Progress, coros: list[Awaitable[T]]) -> list[T]:
    """All results in order; once ``progress`` saw too many exceptions, cancel the rest and raise."""
    try:
        gathered = asyncio.ensure_future(asyncio.gather(*coros))
        watcher = asyncio.ensure_future(progress.exceeded.wait())
        waiters: list[asyncio.Future[Any]] = [gathered, watcher]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            if progress.exceeded.is_set():
                gathered.cancel()
                await asyncio.gather(gathered, return_exceptions=True)
                raise progress.error()
            return gathered.result()
        finally:
            watcher.cancel()
            if not gathered.done():
                gathered.cancel()
    finally:
        progress.bar.close()


async def _reported(
    rollout: Awaitable[Any], progress: _Progress
) -> Trajectory | list[Trajectory] | Exception:
    """One ``gather_trajectories`` item: its trajectory (or list of them), or the exception it raised."""
    try:
        result = await rollout
    except Exception as err:
        progress(err)
        return err
    finished = result if isinstance(result, Trajectory) else list(result)
    progress(finished)
    return finished


async def gather_trajectories(
    trajectories: Iterable[Awaitable[Trajectory]] | Iterable[Awaitable[Iterable[Trajectory]]],
    *,
    pbar_desc: str | None = "gather",
    pbar_total_completion_tokens: bool = False,
    max_exceptions: int | float = 0,
) -> list[Any]:
    """Await every rollout concurrently: ART's ungrouped ``gather_trajectories``.

    Returns, in order, each rollout's ``Trajectory`` (or list of them); a rollout that raised leaves its
    exception in its place while at most ``max_exceptions`` have (a count, or a fraction of all rollouts
    when a float below 1); one more cancels the rest and raises ``TooManyRolloutErrors``.
    """
    pending = list(trajectories)
    progress = _Progress(len(pending), pbar_desc, max_exceptions)
    return await _all_unless_too_many(progress, [_reported(r, progress) for r in pending])
