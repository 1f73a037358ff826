"""``gather_trajectory_groups``: run many groups of rollouts at once, with a progress bar, as ART does; and
ART's gather context (``GatherContext``, ``set_gather_context``, ``wrap_group_awaitable``, ``record_metrics``),
the pieces ART's programs build their own gathers from (self-play's by-index gather).

dgrpo's own gathers keep their bar (running reward, exceptions) and cancel the rest once too many rollouts
raised; the context API is ART's, for programs that use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import math
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tqdm.auto import tqdm

from dgrpo.errors import TooManyRolloutErrors
from schemas.trajectory import ROLLOUT_DONE, Choice, Trajectory, TrajectoryGroup

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


# ---- ART's gather context ------------------------------------------------------------------------
@dataclass
class GatherContext:
    """ART's running numbers of a gather: the bar, each metric's sum and count, and the exceptions allowed."""

    pbar: Any = None
    """A ``tqdm`` bar (or None), read when updated: a program may set it after its awaitables exist."""
    metric_sums: Counter[str] = field(default_factory=Counter)
    metric_divisors: Counter[str] = field(default_factory=Counter)
    max_metrics: int | None = None
    max_exceptions: int | float = 0
    """A count, or a fraction of the bar's total when a number between 0 and 1, as in ART."""
    increment_pbar: bool = True

    def update_pbar(self, n: int) -> None:
        """Advance the bar by ``n`` and show each metric's running mean (``completion_tokens`` last)."""
        if self.pbar is None:
            return
        if self.increment_pbar:
            self.pbar.update(n)
        names = (
            list(self.metric_sums)[: self.max_metrics] if self.max_metrics is not None else self.metric_sums
        )
        postfix = {name: self.metric_sums[name] / max(1, self.metric_divisors[name]) for name in names}
        if "completion_tokens" in postfix:
            postfix["completion_tokens"] = postfix.pop("completion_tokens")
        self.pbar.set_postfix(postfix)

    def too_many_exceptions(self) -> bool:
        raised = self.metric_sums["exceptions"]
        total = getattr(self.pbar, "total", None)
        if 0 < self.max_exceptions < 1 and total:
            return raised / total > self.max_exceptions
        return raised > self.max_exceptions

    def reset(self) -> None:
        """Forget the bar and the numbers (``max_exceptions`` goes back to 0, as ART's)."""
        self.pbar = None
        self.metric_sums = Counter()
        self.metric_divisors = Counter()
        self.max_exceptions = 0

    def rollout_done(self, result: Trajectory | BaseException) -> None:
        """A rollout of a pending ``TrajectoryGroup`` finished: its numbers, or one more exception."""
        if isinstance(result, Trajectory):
            record_metrics(self, result)
            self.update_pbar(n=1)
        else:
            self.metric_sums["exceptions"] += 1
            self.update_pbar(n=0)


gather_context_var: contextvars.ContextVar[GatherContext] = contextvars.ContextVar(
    "gather_context",
    default=GatherContext(),  # noqa: B039  # ART's: one context for awaitables wrapped outside any gather
)


@contextlib.contextmanager
def set_gather_context(context: GatherContext) -> Iterator[None]:
    """Make ``context`` the gather context of the awaitables started inside the block."""
    token = gather_context_var.set(context)
    try:
        yield
    finally:
        gather_context_var.reset(token)


def get_gather_context() -> GatherContext:
    return gather_context_var.get()


def completion_tokens(choice: Choice) -> int | None:
    """How many tokens ``choice`` sampled (its token ids, else its logprobs); None when it does not say."""
    if choice.token_ids is not None:
        return len(choice.token_ids)
    logprobs = choice.logprobs
    if logprobs is not None and (logprobs.content or logprobs.refusal):
        return len(logprobs.content or logprobs.refusal or [])
    return None


def record_metrics(context: GatherContext, trajectory: Trajectory) -> None:
    """Add ``trajectory``'s reward and metrics to ``context``; first set its ``completion_tokens`` metric, the
    tokens its choices sampled (ART 0.5.23's sum over every choice; 0.5.18 took their mean)."""
    choices = [
        item
        for history in (
            trajectory.messages_and_choices,
            *(h.messages_and_choices for h in trajectory.additional_histories),
        )
        for item in history
        if isinstance(item, Choice)
    ]
    counts = [completion_tokens(choice) for choice in choices]
    if choices and all(count for count in counts):
        trajectory.metrics["completion_tokens"] = sum(count or 0 for count in counts)
    context.metric_sums["reward"] += trajectory.reward  # type: ignore[assignment]  # float sums, as ART
    context.metric_divisors["reward"] += 1
    context.metric_sums.update(trajectory.metrics)
    context.metric_divisors.update(trajectory.metrics.keys())


async def wrap_group_awaitable(awaitable: Awaitable[Any]) -> Any:
    """Await ``awaitable`` within the current gather context, as ART's: a pending ``TrajectoryGroup`` reports each
    rollout as it finishes; any other awaitable (a coroutine returning a group, or a tuple of trajectories as
    self-play's) has each trajectory of its result recorded, and the bar advanced by their number. An awaitable
    that raises counts as one exception: re-raised once there are more than ``max_exceptions``, else None."""
    context = get_gather_context()
    if isinstance(awaitable, TrajectoryGroup):
        token = ROLLOUT_DONE.set(context.rollout_done)
        try:
            group = await awaitable
        finally:
            ROLLOUT_DONE.reset(token)
        if context.too_many_exceptions():
            first = group.exceptions[0]
            raise TooManyRolloutErrors(
                f"{int(context.metric_sums['exceptions'])} rollout(s) raised, more than max_exceptions="
                f"{context.max_exceptions} allows; the first: {first.type}: {first.message}"
            )
        return group
    try:
        result = await awaitable
    except Exception:
        context.metric_sums["exceptions"] += 1
        context.update_pbar(n=0)
        if context.too_many_exceptions():
            raise
        return None
    for trajectory in result:
        record_metrics(context, trajectory)
    context.update_pbar(n=len(result))
    return result
