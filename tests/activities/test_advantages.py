"""Advantages: group-normalised rewards against a float64 reference; zero-variance groups dropped."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from activities import trajectory_store
from activities.advantages import (
    ZERO_VARIANCE_TOL,
    AdvantagesActivities,
    compute_step_advantages,
    group_advantages,
)
from schemas import layout
from schemas.activities import AdvantagesInput
from schemas.config import TrainConfig
from schemas.trajectory import Trajectory, TrajectoryGroup


def reference(rewards, scale, eps):
    n = len(rewards)
    mean = sum(rewards) / n
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / n)
    return [(r - mean) / (std + eps) if scale else r - mean for r in rewards]


@settings(max_examples=200, deadline=None)
@given(
    rewards=st.lists(st.floats(-100, 100, allow_nan=False), min_size=2, max_size=16),
    scale=st.booleans(),
    eps=st.sampled_from([1e-6, 1e-4, 0.1]),
)
def test_group_advantages_match_reference(rewards, scale, eps):
    got = group_advantages(rewards, scale, eps)
    mean = sum(rewards) / len(rewards)
    if math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards)) <= ZERO_VARIANCE_TOL:
        assert got is None
        return
    want = reference(rewards, scale, eps)
    assert got is not None
    for g, w in zip(got, want, strict=True):
        assert math.isclose(g, w, rel_tol=1e-6, abs_tol=1e-9)


def group(*rewards: float) -> TrajectoryGroup:
    return TrajectoryGroup([Trajectory(reward=r, messages_and_choices=[]) for r in rewards])


def test_zero_variance_groups_are_dropped_and_counted():
    step = compute_step_advantages([group(1, 1, 1), group(0, 1), group(0.5, 0.5), group(2)], TrainConfig())
    assert step.n_groups == 4
    assert step.n_groups_zero_variance == 3
    assert step.n_trajectories == 2
    assert [round(a, 4) for a in step.advantages[0]] == [-1.0, 1.0]


def test_unscaled_advantages_are_only_centred():
    step = compute_step_advantages([group(0, 2, 4)], TrainConfig(scale_rewards=False))
    assert step.advantages == [[-2.0, 0.0, 2.0]]


async def test_activity_writes_the_steps_advantages(object_store):
    groups = [group(0, 1, 1, 0), group(3, 3, 3, 3), group(1, 2, 3, 4)]
    written = trajectory_store.upload_groups(object_store, groups, "run-a", 2)
    activities = AdvantagesActivities(object_store)
    result = await activities.compute_advantages(
        AdvantagesInput(run_id="run-a", step=2, trajectories=written, train=TrainConfig())
    )
    assert result.ref.uri == object_store.uri(layout.advantages_key("run-a", 2))
    assert (result.n_groups, result.n_groups_zero_variance, result.n_trajectories) == (3, 1, 8)
    table = trajectory_store.download_table(object_store, result.ref.uri)
    advantages = trajectory_store.advantages_of(table, result.ref.uri)
    assert [len(a) for a in advantages] == [4, 4]
    assert advantages[0] == group_advantages([0, 1, 1, 0])
