"""A workflow that runs only a step's fanned-out rollouts (``roll_out_step``, as TrainingRun calls it), so a
test can drive real inference workers without the trainer and reload stages around them."""

from __future__ import annotations

from pydantic import BaseModel
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from schemas.activities import RolloutsInput
    from schemas.config import Scheduling, TaskQueues
    from schemas.refs import TrajectoriesRef

from workflows.rollout_shards import roll_out_step


class ShardedStep(BaseModel):
    step: RolloutsInput
    groups_per_shard: int
    queues: TaskQueues


@workflow.defn(name="ShardedRollouts")
class ShardedRollouts:
    @workflow.run
    async def run(self, inp: ShardedStep) -> TrajectoriesRef:
        return await roll_out_step(inp.step, inp.groups_per_shard, inp.queues, Scheduling())
