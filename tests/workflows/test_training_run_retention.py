"""TrainingRun applies ``checkpoints.keep_last`` after every published step (scripted activities at the
seams; the real retention activity is tests/activities/test_retention.py's)."""

from __future__ import annotations

from dataclasses import dataclass, field

from temporalio import activity
from temporalio.client import Client
from temporalio.worker import Worker
from test_training_run_logic import make_spec, running, start
from workflow_stubs import WORKER_ID, ScriptedActivities

from schemas.activities import ActivityName, RetentionInput
from schemas.layout import worker_task_queue
from workers.worker import INTERCEPTORS
from workflows.train_step import TrainStep
from workflows.training_run import TrainingRun


@dataclass
class WithRetention(ScriptedActivities):
    retained: list[RetentionInput] = field(default_factory=list)

    @activity.defn(name=ActivityName.RETAIN_CHECKPOINTS)
    async def retain_checkpoints(self, inp: RetentionInput) -> list[int]:
        self.calls.append(("retain_checkpoints", max(inp.protect)))
        self.retained.append(inp)
        return []

    def workers(self, client, task_queue: str, **worker_options) -> list[Worker]:  # type: ignore[no-untyped-def]
        everything = [
            self.latest_checkpoint,
            self.publish_initial,
            self.rollouts,
            self.judge,
            self.compute_advantages,
            self.train,
            self.reload,
            self.serving_control,
            self.metrics_activity,
            self.retain_checkpoints,
        ]
        return [
            Worker(
                client,
                task_queue=task_queue,
                workflows=[TrainingRun, TrainStep],
                activities=everything,
                interceptors=INTERCEPTORS,
                **worker_options,
            ),
            Worker(
                client,
                task_queue=worker_task_queue(task_queue, WORKER_ID),
                activities=[self.publish],
                interceptors=INTERCEPTORS,
            ),
        ]


async def test_retention_runs_after_each_step_and_protects_the_served_checkpoint(
    client: Client, task_queue: str
) -> None:
    stubs = WithRetention()
    checkpoints = {"keep_last": 2, "keep_best_metric": "train/reward"}
    spec = make_spec(task_queue, f"keep-{task_queue}", steps=3, checkpoints=checkpoints)
    async with running(stubs, client, task_queue):
        final = await (await start(client, spec)).result()
    assert final.phase == "done" and final.step == 3
    per_step = [name for name, step in stubs.calls if step == 2]
    assert per_step[-2:] == [
        "metrics",
        "retain_checkpoints",
    ]  # after the step's metrics, which may pick the best
    assert [(r.keep_last, r.keep_best_metric, r.protect) for r in stubs.retained] == [
        (2, "train/reward", [1]),
        (2, "train/reward", [2]),
        (2, "train/reward", [3]),
    ]
    assert all(r.run_id == spec.run_id for r in stubs.retained)


async def test_pipelined_retention_also_protects_the_policy_still_sampling(
    client: Client, task_queue: str
) -> None:
    stubs = WithRetention()
    spec = make_spec(
        task_queue, f"keep-p-{task_queue}", steps=3, mode="pipelined", checkpoints={"keep_last": 1}
    )
    async with running(stubs, client, task_queue):
        final = await (await start(client, spec)).result()
    assert final.phase == "done" and final.step == 3
    # After step n, step n+1's rollouts are still sampling policy n-1: its checkpoint stays too.
    assert [r.protect for r in stubs.retained] == [[0, 1], [1, 2], [3]]
