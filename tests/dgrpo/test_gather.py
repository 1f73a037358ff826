"""gather_trajectory_groups: order, exception budget (count and fraction), after_each, progress callback."""

from __future__ import annotations

import asyncio

import pytest

import dgrpo
from dgrpo.errors import TooManyRolloutErrors


async def rollout(reward: float, fail: bool = False, delay: float = 0.01) -> dgrpo.Trajectory:
    await asyncio.sleep(delay)
    if fail:
        raise ValueError(f"rollout {reward} failed")
    return dgrpo.Trajectory(reward=reward)


async def test_groups_come_back_in_order_with_their_exceptions() -> None:
    groups = await dgrpo.gather_trajectory_groups(
        (
            dgrpo.TrajectoryGroup(
                rollout(s * 10 + i, fail=(s, i) == (1, 0), delay=0.05 - 0.01 * s) for i in range(3)
            )
            for s in range(3)
        ),
        pbar_desc=None,
        max_exceptions=1,
    )
    assert [sorted(t.reward for t in g.trajectories) for g in groups] == [[0, 1, 2], [11, 12], [20, 21, 22]]
    assert [len(g.exceptions) for g in groups] == [0, 1, 0]
    assert groups[1].exceptions[0].message == "rollout 10 failed"


async def test_too_many_exceptions_raise_and_name_the_first() -> None:
    with pytest.raises(TooManyRolloutErrors, match=r"more than max_exceptions=0.*ValueError: rollout"):
        await dgrpo.gather_trajectory_groups(
            [dgrpo.TrajectoryGroup([rollout(1), rollout(2, fail=True)])], pbar_desc=None
        )


async def test_max_exceptions_as_a_fraction_of_all_rollouts() -> None:
    def groups(failing: int) -> list[dgrpo.TrajectoryGroup]:
        return [dgrpo.TrajectoryGroup(rollout(i, fail=i < failing) for i in range(4)) for _ in range(2)]

    kept = await dgrpo.gather_trajectory_groups(groups(1), pbar_desc=None, max_exceptions=0.25)  # 2 of 8
    assert sum(len(g.exceptions) for g in kept) == 2
    with pytest.raises(TooManyRolloutErrors):
        await dgrpo.gather_trajectory_groups(groups(2), pbar_desc=None, max_exceptions=0.25)  # 4 of 8


async def test_after_each_rescores_and_may_drop_groups() -> None:
    async def double_or_drop(group: dgrpo.TrajectoryGroup) -> dgrpo.TrajectoryGroup | None:
        if group.trajectories[0].reward >= 10:
            return None
        for t in group.trajectories:
            t.reward *= 2
        return group

    groups = await dgrpo.gather_trajectory_groups(
        (dgrpo.TrajectoryGroup(rollout(s * 10 + i) for i in range(2)) for s in range(3)),
        pbar_desc="gather",
        after_each=double_or_drop,
    )
    assert [[t.reward for t in g.trajectories] for g in groups] == [[0, 2]]


async def test_a_group_awaitable_that_raises_counts_against_max_exceptions() -> None:
    async def group_of(reward: float, fail: bool = False) -> dgrpo.TrajectoryGroup:
        await asyncio.sleep(0.01)
        if fail:
            raise ValueError(f"group {reward} failed to build")
        return dgrpo.TrajectoryGroup([dgrpo.Trajectory(reward=reward)])

    kept = await dgrpo.gather_trajectory_groups(
        [group_of(1.0), group_of(2.0, fail=True), group_of(3.0)], pbar_desc=None, max_exceptions=1
    )
    assert [g.trajectories[0].reward for g in kept] == [1.0, 3.0]  # the failed group is dropped
    with pytest.raises(TooManyRolloutErrors, match=r"group 2\.0 failed to build"):
        await dgrpo.gather_trajectory_groups([group_of(1.0), group_of(2.0, fail=True)], pbar_desc=None)
