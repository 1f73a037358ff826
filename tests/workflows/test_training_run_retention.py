"""TrainingRun applies ``checkpoints.keep_last`` after every served step (scripted activities at the seams; the
real retention activity is tests/activities/test_retention.py's, the real run tests/workflows/test_servable_real.py's).
What it keeps is decided when the retention activity is scheduled, not when its step was served."""

from __future__ import annotations

import asyncio

from temporalio.client import Client
from test_training_run_logic import eventually, make_spec, running, start
from workflow_stubs import ScriptedActivities

from workflows.training_run import TrainingRun


async def test_retention_runs_after_each_steps_metrics_and_keeps_the_served_checkpoint(
    client: Client, task_queue: str
) -> None:
    stubs = ScriptedActivities()
    checkpoints = {"keep_last": 2, "keep_best_metric": "train/reward"}
    spec = make_spec(task_queue, f"keep-{task_queue}", steps=3, checkpoints=checkpoints)
    async with running(stubs, client, task_queue):
        final = await (await start(client, spec)).result()
    assert final.phase == "done" and final.step == 3
    names = [name for name, _ in stubs.calls if name in ("metrics", "retain_checkpoints")]
    assert names == ["metrics", "retain_checkpoints"] * 3  # after the step's metrics, which may pick the best
    assert [(r.keep_last, r.keep_best_metric, r.protect, r.keep_from) for r in stubs.retained] == [
        (2, "train/reward", [], 1),
        (2, "train/reward", [], 2),
        (2, "train/reward", [], 3),
    ]
    assert all(r.run_id == spec.run_id for r in stubs.retained)


async def test_pipelined_retention_held_behind_slow_metrics_keeps_what_is_served_when_it_runs(
    client: Client, task_queue: str
) -> None:
    """Issue 45: with a slow metrics sink, retention for step 1 ran once step 3 was served, with what to keep
    worked out when step 1 was served (steps 0 and 1: step 2, then served, went). Now it keeps from the step served
    when it runs."""
    stubs = ScriptedActivities()
    stubs.metrics_gates[1] = asyncio.Event()
    spec = make_spec(
        task_queue, f"keep-p-{task_queue}", steps=3, mode="pipelined", checkpoints={"keep_last": 1}
    )
    async with running(stubs, client, task_queue):
        handle = await start(client, spec)

        async def all_served() -> bool:
            return (await handle.query(TrainingRun.status)).step == 3

        await eventually(all_served)
        assert stubs.retained == []
        stubs.metrics_gates[1].set()
        final = await handle.result()
    assert final.phase == "done" and final.step == 3
    assert [(r.protect, r.keep_from) for r in stubs.retained] == [([], 3), ([], 3), ([], 3)]


async def test_pipelined_retention_keeps_the_policy_still_sampling(client: Client, task_queue: str) -> None:
    """Step 3's rollouts sample policy 1 (``max_staleness`` 1): while they run, step 2 is served and its
    retention keeps from step 1 (a restarted server loads policy 1 again for them)."""
    stubs = ScriptedActivities()
    stubs.rollout_gates[3] = asyncio.Event()
    spec = make_spec(
        task_queue, f"keep-s-{task_queue}", steps=3, mode="pipelined", checkpoints={"keep_last": 1}
    )
    async with running(stubs, client, task_queue):
        handle = await start(client, spec)
        await eventually(lambda: asyncio.sleep(0, result=len(stubs.retained) == 2))
        assert (await handle.query(TrainingRun.status)).step == 2 and stubs.rollout_policies[3] == [1]
        stubs.rollout_gates[3].set()
        final = await handle.result()
    assert final.phase == "done" and final.step == 3
    assert [r.keep_from for r in stubs.retained] == [0, 1, 3]
