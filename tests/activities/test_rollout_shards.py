"""Rollout shards against the real S3 store: a shard's own key, slots shared by a run's shards, the merge."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import rollout_stubs
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.object_store import ObjectStore
from activities.rollout_shards import merge_shards
from activities.rollouts import RolloutActivities
from activities.trajectory_store import download_groups, upload_groups
from schemas import layout
from schemas.activities import MergeRolloutsInput, RolloutsInput
from schemas.config import TaskSpec
from schemas.errors import ROLLOUT_FAILED, RunSpecError
from schemas.refs import TrajectoriesRef
from schemas.trajectory import ExceptionRecord, Trajectory, TrajectoryGroup

STUBS = "rollout_stubs"


def shard_input(rollout: str, shard: int, shards: int, **task: object) -> RolloutsInput:
    return RolloutsInput(
        run_id="r1",
        step=2,
        model_name="agent-001",
        task=TaskSpec(rollout=rollout, scenarios=f"{STUBS}:scenarios", **task),  # type: ignore[arg-type]
        groups_per_step=2,
        group_size=2,
        scenario_offset=2 * shard,
        seed=7,
        shard=shard,
        shards=shards,
    )


def activities(store: ObjectStore) -> RolloutActivities:
    return RolloutActivities("http://127.0.0.1:9", store, base_served_name="base", task_modules=(STUBS,))


async def test_a_shard_goes_to_its_own_key_and_the_steps_table_is_left_alone(
    object_store: ObjectStore,
) -> None:
    ref = await ActivityEnvironment().run(activities(object_store).rollouts, shard_input(f"{STUBS}:ok", 1, 3))
    assert ref.ref.uri == object_store.uri(layout.rollout_shard_key("r1", 2, 1, attempt=1))
    assert (ref.n_groups, ref.n_trajectories) == (2, 4)
    assert not object_store.exists(layout.trajectories_key("r1", 2))


async def test_a_runs_shards_on_one_worker_share_its_rollout_concurrency(object_store: ObjectStore) -> None:
    acts = activities(object_store)
    rollout_stubs.RUNNING[:] = [0, 0]
    await asyncio.gather(
        *(
            ActivityEnvironment().run(
                acts.rollouts, shard_input(f"{STUBS}:counted", k, 2, rollout_concurrency=2)
            )
            for k in range(2)
        )
    )
    assert rollout_stubs.RUNNING == [0, 2]  # two shards of 4 rollouts each, never more than 2 at once


async def test_a_late_attempt_never_changes_the_shard_the_merge_reads(object_store: ObjectStore) -> None:
    """Shard 1's retry (attempt 2) succeeded and the workflow recorded its ref; the attempt it replaced then
    finishes and writes other rows. The merge reads the recorded attempt: it succeeds, with the retry's rows."""
    acts = activities(object_store)
    shard0 = await ActivityEnvironment().run(acts.rollouts, shard_input(f"{STUBS}:ok", 0, 2))
    retry = ActivityEnvironment()
    retry.info = dataclasses.replace(retry.info, attempt=2)
    retried = await retry.run(acts.rollouts, shard_input(f"{STUBS}:stale_first_attempt", 1, 2))
    late = await ActivityEnvironment().run(acts.rollouts, shard_input(f"{STUBS}:stale_first_attempt", 1, 2))
    assert late.ref.sha256 != retried.ref.sha256  # the late attempt did write other rows
    merged = merge_shards(
        object_store, MergeRolloutsInput(run_id="r1", step=2, shards=[shard0, retried], max_exceptions=0)
    )
    expected = [download_groups(object_store, ref.ref.uri) for ref in (shard0, retried)]
    rewards = [t.reward for g in download_groups(object_store, merged.ref.uri) for t in g.trajectories]
    assert rewards == [t.reward for shard in expected for g in shard for t in g.trajectories]
    assert len(rewards) == 8 and -1.0 not in rewards


async def test_a_late_attempt_of_a_steps_only_shard_never_changes_the_table_the_workflow_recorded(
    object_store: ObjectStore,
) -> None:
    """A one-shard step that the workflow merges (``merged``): its retry (attempt 2) was recorded, then the
    attempt it replaced finishes and writes other rows. The recorded ref still reads back (sha256 checked) and
    the merge makes the step's table of the retry's rows."""
    acts = activities(object_store)
    only = shard_input(f"{STUBS}:stale_first_attempt", 0, 1).model_copy(update={"merged": True})
    retry = ActivityEnvironment()
    retry.info = dataclasses.replace(retry.info, attempt=2)
    retried = await retry.run(acts.rollouts, only)
    late = await ActivityEnvironment().run(acts.rollouts, only)
    assert late.ref.sha256 != retried.ref.sha256  # the late attempt did write other rows
    assert retried.ref.uri == object_store.uri(layout.rollout_shard_key("r1", 2, 0, attempt=2))
    merged = merge_shards(object_store, MergeRolloutsInput(run_id="r1", step=2, shards=[retried]))
    assert merged.ref.uri == object_store.uri(layout.trajectories_key("r1", 2))
    rewards = [t.reward for g in download_groups(object_store, merged.ref.uri) for t in g.trajectories]
    assert len(rewards) == 4 and -1.0 not in rewards


def stored_shard(
    store: ObjectStore, shard: int, rewards: list[float], failures: int = 0, step: int = 2
) -> TrajectoriesRef:
    group = TrajectoryGroup(
        [Trajectory(messages_and_choices=[{"role": "user", "content": "x"}], reward=r) for r in rewards],
        exceptions=[ExceptionRecord(type="ValueError", message=f"rollout failed in shard {shard}")]
        * failures,
        metadata={"scenario_id": f"s{shard}"},
    )
    return upload_groups(store, [group], "r1", step, key=layout.rollout_shard_key("r1", step, shard))


def test_merge_concatenates_the_shards_in_order(object_store: ObjectStore) -> None:
    shards = [stored_shard(object_store, k, [float(k), float(k) + 0.5]) for k in range(3)]
    merged = merge_shards(object_store, MergeRolloutsInput(run_id="r1", step=2, shards=shards))
    assert merged.ref.uri == object_store.uri(layout.trajectories_key("r1", 2))
    groups = download_groups(object_store, merged.ref.uri)
    assert [g.metadata["scenario_id"] for g in groups] == ["s0", "s1", "s2"]
    assert [t.reward for g in groups for t in g.trajectories] == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
    again = merge_shards(object_store, MergeRolloutsInput(run_id="r1", step=2, shards=shards))
    assert again.ref == merged.ref  # a retried merge writes the same bytes to the same key


def test_merge_counts_failed_rollouts_over_the_whole_step(object_store: ObjectStore) -> None:
    shards = [stored_shard(object_store, k, [1.0], failures=1) for k in range(2)]  # each shard within 1
    with pytest.raises(ApplicationError) as info:
        merge_shards(object_store, MergeRolloutsInput(run_id="r1", step=2, shards=shards, max_exceptions=1))
    assert info.value.type == ROLLOUT_FAILED and info.value.non_retryable
    assert "2 rollouts failed across 2 shards (shard 0: 1, shard 1: 1)" in info.value.message
    assert "max_exceptions=1" in info.value.message and "rollout failed in shard 0" in info.value.message
    assert not object_store.exists(layout.trajectories_key("r1", 2))
    ok = merge_shards(object_store, MergeRolloutsInput(run_id="r1", step=2, shards=shards, max_exceptions=2))
    assert (ok.n_trajectories, ok.n_exceptions) == (2, 2)


def test_merge_refuses_shards_of_another_step(object_store: ObjectStore) -> None:
    other = stored_shard(object_store, 0, [1.0], step=3)
    with pytest.raises(RunSpecError, match="shards of another run or step"):
        merge_shards(object_store, MergeRolloutsInput(run_id="r1", step=2, shards=[other]))
