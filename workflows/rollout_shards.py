"""A step's rollouts fanned out: its groups split into shards, each a rollouts activity on the inference queue.

So N inference workers share a step, and a failed shard is retried alone (each activity has its own retry
policy). Shard k rolls out the k-th slice of the step's scenario picks, so the shards together pick exactly
what one activity would. A merge on the control queue concatenates them in shard order into the step's one
``trajectories.parquet``, one shard too (each attempt writes its own key, so a late attempt of a step's only
shard cannot overwrite the table the workflow recorded). Only refs pass through the history.
"""

from __future__ import annotations

import asyncio

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from schemas.activities import MergeRolloutsInput, RolloutsInput
    from schemas.config import Scheduling, TaskQueues
    from schemas.refs import TrajectoriesRef

from workflows.stages import MERGE_ROLLOUTS, ROLLOUTS, run_stage


def shard_slices(groups: int, groups_per_shard: int) -> list[tuple[int, int]]:
    """``(first group, groups)`` of each shard: as few as ``groups_per_shard`` allows, sizes within one."""
    shards = -(-groups // groups_per_shard)
    size, bigger = divmod(groups, shards)
    slices, first = [], 0
    for k in range(shards):
        count = size + (1 if k < bigger else 0)
        slices.append((first, count))
        first += count
    return slices


def shard_inputs(step: RolloutsInput, groups_per_shard: int) -> list[RolloutsInput]:
    """The rollouts activity inputs of ``step`` (a whole step's input) split into shards."""
    slices = shard_slices(step.groups_per_step, groups_per_shard)
    if len(slices) == 1:
        return [step]
    return [
        step.model_copy(
            update={
                "shard": k,
                "shards": len(slices),
                "groups_per_step": count,
                "scenario_offset": step.scenario_offset + first,
            }
        )
        for k, (first, count) in enumerate(slices)
    ]


SHARDS_PATCH = "rollout-shards"
"""Runs whose history predates shards replay one rollouts activity per step (until they continue as new)."""
SINGLE_SHARD_MERGE_PATCH = "single-shard-merge"
"""Runs whose history predates it replay a one-shard step as one rollouts activity that writes the step's
``trajectories.parquet`` itself (a late attempt could overwrite it), with no merge."""


async def roll_out_step(
    step: RolloutsInput,
    groups_per_shard: int,
    queues: TaskQueues,
    scheduling: Scheduling,
    heartbeat_s: float | None = None,
) -> TrajectoriesRef:
    """Roll out ``step`` in shards of at most ``groups_per_shard`` groups; the step's one stored table."""
    shards = shard_inputs(step, groups_per_shard)
    one = len(shards) == 1
    if not workflow.patched(SINGLE_SHARD_MERGE_PATCH if one else SHARDS_PATCH):
        return await run_stage(
            ROLLOUTS,
            step,
            task_queue=queues.inference,
            step=step.step,
            scheduling=scheduling,
            heartbeat_s=heartbeat_s,
            result_type=TrajectoriesRef,
        )
    if one:
        shards = [step.model_copy(update={"merged": True})]
    calls = [
        asyncio.create_task(
            run_stage(
                ROLLOUTS,
                shard,
                task_queue=queues.inference,
                step=step.step,
                scheduling=scheduling,
                heartbeat_s=heartbeat_s,
                result_type=TrajectoriesRef,
                summary=f"step {step.step} shard {shard.shard + 1}/{shard.shards}",
            )
        )
        for shard in shards
    ]
    try:
        refs = await asyncio.gather(*calls)
    except BaseException:  # a shard failed for good, or the caller cancelled: the others stop too
        for call in calls:
            call.cancel()
        raise
    return await run_stage(
        MERGE_ROLLOUTS,
        MergeRolloutsInput(
            run_id=step.run_id, step=step.step, shards=refs, max_exceptions=step.task.max_exceptions
        ),
        task_queue=queues.control,
        step=step.step,
        scheduling=scheduling,
        heartbeat_s=heartbeat_s,
        result_type=TrajectoriesRef,
    )
