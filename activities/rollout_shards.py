"""The merge of a step's rollout shards (control queue) into the step's one ``trajectories.parquet``.

``TrainingRun`` splits a step's groups into shards (``RunSpec.groups_per_shard``), each its own rollouts
activity, so inference workers share the step and a failed shard is retried alone. This activity reads the
shards the workflow names, in shard order, each verified against the sha256 its activity recorded, and writes
their groups (renumbered from 0) as the step's table: the same shards give the same rows in the same order,
and a retry overwrites the same key. ``task.max_exceptions`` counts per step, while each shard only sees its
own failures, so the step's total is checked here, before anything is written.
"""

from __future__ import annotations

import asyncio

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.object_store import ObjectStore
from activities.trajectory_store import read_ref_groups, upload_groups
from schemas.activities import ActivityName, MergeRolloutsInput
from schemas.errors import ROLLOUT_FAILED, RunSpecError
from schemas.refs import TrajectoriesRef


def merge_shards(store: ObjectStore, input: MergeRolloutsInput) -> TrajectoriesRef:
    """Concatenate ``input.shards`` into the step's trajectories; ``ApplicationError`` past max_exceptions."""
    strays = [s.ref.uri for s in input.shards if (s.run_id, s.step) != (input.run_id, input.step)]
    if strays:
        raise RunSpecError(
            f"merge of run {input.run_id!r} step {input.step} was given shards of another run or step: {strays}"
        )
    per_shard = [read_ref_groups(store, shard.ref) for shard in input.shards]
    groups = [group for shard in per_shard for group in shard]
    failures = [record for group in groups for record in group.exceptions]
    if len(failures) > input.max_exceptions:
        counts = ", ".join(f"shard {k}: {sum(len(g.exceptions) for g in s)}" for k, s in enumerate(per_shard))
        raise ApplicationError(
            f"{len(failures)} rollouts failed across {len(per_shard)} shards ({counts}), more than "
            f"task.max_exceptions={input.max_exceptions}; first: {failures[0].message}",
            type=ROLLOUT_FAILED,
            non_retryable=True,  # merging again finds the same failures
        )
    return upload_groups(store, groups, input.run_id, input.step)


class ShardActivities:
    """The control queue's merge activity. ``ShardActivities(store)``: the worker's ObjectStore."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    @activity.defn(name=ActivityName.MERGE_ROLLOUTS)
    async def merge_rollouts(self, input: MergeRolloutsInput) -> TrajectoriesRef:
        return await asyncio.to_thread(merge_shards, self.store, input)
