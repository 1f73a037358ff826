"""ART's gather context (``art.gather``), which ART's programs build their own gathers from (self-play's gather
by index: coroutines returning a tuple of trajectories), and ``trajectory_group_batches``' exception budget,
which is each batch's own."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import dgrpo as art
from dgrpo.errors import TooManyRolloutErrors
from dgrpo.gather import (
    GatherContext,
    get_gather_context,
    record_metrics,
    set_gather_context,
    wrap_group_awaitable,
)


class Bar:
    """What ``GatherContext`` asks of a tqdm bar."""

    def __init__(self, total: int) -> None:
        self.total, self.n, self.postfix = total, 0, {}

    def update(self, n: int) -> None:
        self.n += n

    def set_postfix(self, postfix: dict[str, float]) -> None:
        self.postfix = postfix


def sampled(reward: float, tokens: int) -> art.Trajectory:
    choice = art.Choice.model_validate(
        {
            "index": 0,
            "finish_reason": "stop",
            "message": {"role": "assistant", "content": "x"},
            "token_ids": [1] * tokens,
        }
    )
    return art.Trajectory(messages_and_choices=[{"role": "user", "content": "q"}, choice], reward=reward)


async def game(x_reward: float, o_reward: float, fail: bool = False) -> tuple[art.Trajectory, art.Trajectory]:
    await asyncio.sleep(0)
    if fail:
        raise ValueError("the game broke")
    return sampled(x_reward, 3), sampled(o_reward, 5)


async def test_tuples_of_trajectories_are_recorded_and_the_bar_is_read_when_updated() -> None:
    context = GatherContext(max_exceptions=1)
    with set_gather_context(context):
        future = asyncio.gather(
            *(wrap_group_awaitable(game(1.0, 0.0)) for _ in range(2)),
            wrap_group_awaitable(game(0, 0, fail=True)),
        )
        context.pbar = Bar(total=6)  # set after the awaitables exist, as self-play's helper does
        results: list[Any] = await future
    assert [len(r) for r in results[:2]] == [2, 2] and results[2] is None  # one failure, within the budget
    assert context.pbar.n == 4  # each trajectory of each tuple
    assert context.metric_sums["exceptions"] == 1
    assert context.pbar.postfix["reward"] == pytest.approx(0.5)
    assert list(context.pbar.postfix)[-1] == "completion_tokens"  # shown last, as in ART
    assert context.pbar.postfix["completion_tokens"] == pytest.approx(4.0)  # 3 and 5 sampled tokens
    assert results[0][1].metrics["completion_tokens"] == 5


async def test_past_max_exceptions_the_awaitables_exception_is_raised() -> None:
    context = GatherContext(max_exceptions=0)
    with set_gather_context(context), pytest.raises(ValueError, match="the game broke"):
        await wrap_group_awaitable(game(0, 0, fail=True))
    fraction = GatherContext(pbar=Bar(total=4), max_exceptions=0.5)  # a fraction of the bar's total
    with set_gather_context(fraction):
        assert await wrap_group_awaitable(game(0, 0, fail=True)) is None
        assert await wrap_group_awaitable(game(0, 0, fail=True)) is None
        with pytest.raises(ValueError):
            await wrap_group_awaitable(game(0, 0, fail=True))


async def test_a_pending_group_reports_each_rollout_to_the_context() -> None:
    async def rollout(reward: float) -> art.Trajectory:
        return sampled(reward, 2)

    context = GatherContext(pbar=Bar(total=3))
    with set_gather_context(context):
        group = await wrap_group_awaitable(art.TrajectoryGroup(rollout(r) for r in (1.0, 2.0, 3.0)))
    assert len(group.trajectories) == 3
    assert (context.pbar.n, context.metric_divisors["reward"]) == (3, 3)
    assert context.metric_sums["reward"] == pytest.approx(6.0)


async def test_contexts_are_per_task_and_reset_forgets_the_numbers() -> None:
    async def count_in(context: GatherContext, n: int) -> int:
        with set_gather_context(context):
            await asyncio.gather(*(wrap_group_awaitable(game(1, 1)) for _ in range(n)))
            return int(get_gather_context().metric_divisors["reward"])

    first, second = GatherContext(), GatherContext()
    assert await asyncio.gather(count_in(first, 1), count_in(second, 3)) == [2, 6]
    assert get_gather_context() is not first and get_gather_context() is not second
    record_metrics(first, art.Trajectory(reward=1.0, metrics={"win": 1.0}))
    assert first.metric_sums["win"] == 1.0
    first.max_exceptions = 3
    first.reset()
    assert (first.metric_sums, first.max_exceptions) == ({}, 0)


async def test_max_batch_exceptions_is_every_batchs_own_budget() -> None:
    async def group(reward: float | None) -> art.TrajectoryGroup:
        await asyncio.sleep(0)
        if reward is None:
            raise ValueError("this group's setup failed")
        return art.TrajectoryGroup([art.Trajectory(reward=reward)])

    def rewards(batches: list[list[art.TrajectoryGroup]]) -> list[list[float]]:
        return [[t.reward for g in batch for t in g] for batch in batches]

    one_at_a_time = {"batch_size": 1, "max_concurrent_batches": 1, "pbar_desc": None}
    kept = [
        b
        async for b in art.trajectory_group_batches(
            [group(1.0), group(None), group(2.0), group(None), group(3.0)],
            max_batch_exceptions=1,
            **one_at_a_time,
        )
    ]
    assert rewards(kept) == [
        [1.0],
        [2.0],
        [3.0],
    ]  # a failed group is dropped and counted, in the later batches too
    with pytest.raises(TooManyRolloutErrors, match=r"2 rollout.*this group's setup failed"):
        async for _ in art.trajectory_group_batches(
            [group(1.0), group(None), group(None), group(2.0)], max_batch_exceptions=1, **one_at_a_time
        ):
            pass
