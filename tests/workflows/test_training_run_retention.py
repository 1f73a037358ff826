"""TrainingRun applies ``checkpoints.keep_last`` after every published step (scripted activities at the
seams; the real retention activity is tests/activities/test_retention.py's)."""

from __future__ import annotations

from temporalio.client import Client
from test_training_run_logic import make_spec, running, start
from workflow_stubs import ScriptedActivities


async def test_retention_runs_after_each_step_and_protects_the_served_checkpoint(
    client: Client, task_queue: str
) -> None:
    stubs = ScriptedActivities()
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
    stubs = ScriptedActivities()
    spec = make_spec(
        task_queue, f"keep-p-{task_queue}", steps=3, mode="pipelined", checkpoints={"keep_last": 1}
    )
    async with running(stubs, client, task_queue):
        final = await (await start(client, spec)).result()
    assert final.phase == "done" and final.step == 3
    # After step n, step n+1's rollouts are still sampling policy n-1: its checkpoint stays too.
    assert [r.protect for r in stubs.retained] == [[0, 1], [1, 2], [3]]
