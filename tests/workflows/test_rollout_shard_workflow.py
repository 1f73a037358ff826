"""A step's rollouts in shards: the split, and TrainingRun fanning out (scripted activities at the seams)."""

from __future__ import annotations

import pytest
from temporalio.client import Client
from test_training_run_logic import make_spec, running, start
from workflow_stubs import ScriptedActivities

from schemas.activities import RolloutsInput
from schemas.config import TaskSpec
from workflows.rollout_shards import shard_inputs, shard_slices


@pytest.mark.parametrize(
    ("groups", "per_shard", "expected"),
    [
        (8, 8, [(0, 8)]),
        (3, 8, [(0, 3)]),
        (8, 2, [(0, 2), (2, 2), (4, 2), (6, 2)]),
        (5, 2, [(0, 2), (2, 2), (4, 1)]),
        (10, 8, [(0, 5), (5, 5)]),  # as few shards as allowed, sizes within one of each other
        (1, 1, [(0, 1)]),
    ],
)
def test_shard_slices_cover_every_group_once_in_order(
    groups: int, per_shard: int, expected: list[tuple[int, int]]
) -> None:
    slices = shard_slices(groups, per_shard)
    assert slices == expected
    covered = [first + i for first, count in slices for i in range(count)]
    assert covered == list(range(groups))


def test_shard_inputs_slice_the_steps_scenarios_and_keep_the_rest() -> None:
    step = RolloutsInput(
        run_id="r",
        step=3,
        model_name="m",
        task=TaskSpec(rollout="examples.arithmetic:rollout", scenarios="examples.arithmetic:scenarios"),
        groups_per_step=5,
        group_size=4,
        scenario_offset=10,
        seed=9,
    )
    assert shard_inputs(step, 8) == [step]  # one shard: the step's own input
    shards = shard_inputs(step, 2)
    assert [(s.shard, s.shards, s.scenario_offset, s.groups_per_step) for s in shards] == [
        (0, 3, 10, 2),
        (1, 3, 12, 2),
        (2, 3, 14, 1),
    ]
    assert {(s.step, s.seed, s.group_size, s.run_id) for s in shards} == {(3, 9, 4, "r")}


def test_a_shard_outside_its_step_is_refused() -> None:
    with pytest.raises(ValueError, match="shard 2 does not exist in a step of 2 shard"):
        RolloutsInput(
            run_id="r",
            step=1,
            model_name="m",
            task=TaskSpec(rollout="examples.arithmetic:rollout", scenarios="examples.arithmetic:scenarios"),
            groups_per_step=1,
            group_size=2,
            shard=2,
            shards=2,
        )


async def test_a_sync_run_fans_each_step_out_and_merges_the_shards_in_order(
    client: Client, task_queue: str
) -> None:
    stubs = ScriptedActivities()
    spec = make_spec(task_queue, f"shards-{task_queue}", steps=2, groups_per_step=5, groups_per_shard=2)
    async with running(stubs, client, task_queue):
        final = await (await start(client, spec)).result()
    assert final.step == 2
    for step in (1, 2):
        offset = (step - 1) * 5
        assert sorted(stubs.rollout_shards[step]) == [
            (0, 3, offset, 2),
            (1, 3, offset + 2, 2),
            (2, 3, offset + 4, 1),
        ]
        assert stubs.merges[step] == [[0, 1, 2]]
    per_step = [name for name, step in stubs.calls if step == 2]
    assert per_step[:3] == ["rollouts"] * 3  # all shards before anything else
    assert per_step[3:7] == ["merge_rollouts", "compute_advantages", "train", "publish_adapter"]
    assert per_step[7] == "reload" and sorted(per_step[8:]) == ["metrics", "publish"]
    assert [h.n_trajectories for h in final.history] == [5 * spec.group_size] * 2


async def test_a_one_shard_step_is_merged_too_so_a_late_attempt_cannot_overwrite_its_table(
    client: Client, task_queue: str
) -> None:
    stubs = ScriptedActivities()
    spec = make_spec(task_queue, f"one-shard-{task_queue}", steps=2, groups_per_step=3, groups_per_shard=8)
    async with running(stubs, client, task_queue):
        final = await (await start(client, spec)).result()
    assert final.step == 2
    for step in (1, 2):
        [inp] = stubs.rollout_inputs[step]
        assert (inp.shard, inp.shards, inp.merged, inp.groups_per_step) == (0, 1, True, 3)
        assert stubs.merges[step] == [[0]]  # the step's table is the merge's, of the attempt recorded


async def test_pipelined_fans_out_the_next_step_and_keeps_its_staleness_bound(
    client: Client, task_queue: str
) -> None:
    stubs = ScriptedActivities()
    spec = make_spec(
        task_queue, f"pipe-shards-{task_queue}", mode="pipelined", max_staleness=0, groups_per_shard=1
    )
    async with running(stubs, client, task_queue):
        final = await (await start(client, spec)).result()
    assert final.step == 3
    # With max_staleness 0, steps 2 and 3 wait for the policy just trained before they roll out: nothing is
    # sampled by a staler policy, so nothing is dropped (docs/pipelining.md).
    assert final.dropped_stale_groups == 0
    assert dict(stubs.rollout_policies) == {1: [0, 0], 2: [1, 1], 3: [2, 2]}
    assert {step: len(m) for step, m in stubs.merges.items()} == {1: 1, 2: 1, 3: 1}
    assert all(order == [0, 1] for m in stubs.merges.values() for order in m)
    assert [h.policy_step for h in final.history] == [0, 1, 2]
