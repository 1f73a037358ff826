"""Pipelined mode (workflows/pipeline.py) on a real Temporal dev server, with scripted activities at the seams:
the trainer never waits for a publish or a reload, and each invariant of sync mode still holds."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from datetime import timedelta

import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.worker import UnsandboxedWorkflowRunner
from test_training_run_logic import eventually, make_spec, running, start
from workflow_stubs import WORKER_ID, Failure, ScriptedActivities

from schemas.errors import CONFIG_ERROR, STORE_UNAVAILABLE
from workflows import beside, pipeline, step_chain
from workflows.stages import PUBLISH, PUBLISH_ADAPTER, TRAIN_BESIDE
from workflows.training_run import TrainingRun


async def test_the_next_step_trains_while_the_last_one_publishes_and_the_counter_waits_for_its_reload(
    client: Client, task_queue: str
) -> None:
    stubs = ScriptedActivities()
    stubs.publish_adapter_gates[1], stubs.reload_gates[1] = asyncio.Event(), asyncio.Event()
    stubs.publish_gates[1] = asyncio.Event()
    spec = make_spec(task_queue, f"beside-{task_queue}", mode="pipelined", steps=4, continue_as_new_every=3)
    async with running(stubs, client, task_queue):
        handle = await start(client, spec)
        # Step 2 trains while step 1's adapter is being published ...
        await asyncio.wait_for(stubs.train_started[2].wait(), 20)
        await eventually(lambda: asyncio.sleep(0, result=stubs.names("publish_adapter")[:1] == [1]))
        assert stubs.names("reload") == [0]
        stubs.publish_adapter_gates[1].set()
        # ... and while its adapter is being loaded (servable: its optimizer state goes up once it is served) ...
        await asyncio.wait_for(stubs.reload_started[1].wait(), 20)
        await eventually(lambda: asyncio.sleep(0, result=stubs.names("publish_adapter") == [1, 2]))
        assert stubs.names("publish") == []
        [trained_2] = stubs.train_inputs[2]
        assert trained_2.start_from is None and trained_2.continue_from is not None
        assert (trained_2.continue_from.step, trained_2.continue_from.worker_id) == (1, WORKER_ID)
        # ... but the step counter waits for step 1's reload, step 2's reload waits for it, and the trainer
        # goes no further than one step ahead of what is served.
        await asyncio.sleep(1.0)
        status = await handle.query(TrainingRun.status)
        assert status.step == 0 and status.adapter == f"{spec.run_id}@0"
        assert stubs.names("reload") == [0, 1] and stubs.names("train") == [1, 2]
        stubs.reload_gates[1].set()
        await eventually(lambda: asyncio.sleep(0, result=stubs.names("publish") == [1]))
        await asyncio.sleep(0.5)
        assert stubs.names("publish") == [1]  # step 2's rest waits for step 1's: in step order
        served = await handle.query(TrainingRun.status)
        assert served.step >= 2 and served.last_checkpoint is not None and served.last_checkpoint.step == 0
        assert served.history[0].checkpoint is None  # served, not resumable yet
        stubs.publish_gates[1].set()
        final = await handle.result()
    assert final.step == 4 and [h.step for h in final.history] == [1, 2, 3, 4]
    assert stubs.names("reload") == [0, 1, 2, 3, 4]
    assert stubs.names("train") == [1, 2, 3, 4] and sorted(s for _, s in stubs.published) == [0, 1, 2, 3, 4]
    assert stubs.names("publish") == [1, 2, 3, 4] and stubs.names("publish_adapter") == [1, 2, 3, 4]
    # Continued as new after step 3 once it was served: step 4 continues from step 3's staging on its trainer, while
    # the continued run writes the rest of checkpoint 3 (tests/workflows/test_pipeline_continue_as_new.py).
    [trained_4] = stubs.train_inputs[4]
    assert trained_4.start_from is None and trained_4.continue_from is not None
    assert (trained_4.continue_from.step, trained_4.continue_from.worker_id) == (3, WORKER_ID)
    assert [h.checkpoint for h in final.history] == [stubs.checkpoints[spec.run_id][n] for n in (1, 2, 3, 4)]
    assert all({"train", "publish", "reload", "step"} <= h.seconds.keys() for h in final.history)


@pytest.mark.parametrize("max_staleness", [0, 1])
async def test_no_rollout_is_sampled_by_a_policy_staler_than_max_staleness(
    client: Client, task_queue: str, max_staleness: int
) -> None:
    stubs = ScriptedActivities()
    spec = make_spec(task_queue, f"fresh-{max_staleness}-{task_queue}", mode="pipelined", steps=4,
                     max_staleness=max_staleness)  # fmt: skip
    async with running(stubs, client, task_queue):
        final = await (await start(client, spec)).result()
    assert final.step == 4 and final.dropped_stale_groups == 0
    for step, policies in stubs.rollout_policies.items():
        assert all(policy >= step - 1 - max_staleness for policy in policies), (step, policies)
    assert [h.policy_step for h in final.history] == [max(0, n - 1 - max_staleness) for n in (1, 2, 3, 4)]


async def test_a_trainer_lost_mid_pipeline_is_replaced_from_the_published_checkpoints(
    client: Client, task_queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step 1's trainer vanishes after training: its publish and step 2's training (sent to it) never start.
    Step 1 is trained again from checkpoint 0 and published; step 2 trains from that checkpoint, elsewhere."""
    quick = timedelta(seconds=2)
    monkeypatch.setattr(step_chain, "PUBLISH", dataclasses.replace(PUBLISH, schedule_to_start=quick))
    monkeypatch.setattr(
        beside, "PUBLISH_ADAPTER", dataclasses.replace(PUBLISH_ADAPTER, schedule_to_start=quick)
    )
    monkeypatch.setattr(pipeline, "TRAIN_BESIDE", dataclasses.replace(TRAIN_BESIDE, schedule_to_start=quick))
    stubs = ScriptedActivities(lost_workers=1)
    stubs.reload_gates[1] = asyncio.Event()
    spec = make_spec(task_queue, f"lost-{task_queue}", mode="pipelined")
    async with contextlib.AsyncExitStack() as stack:
        for worker in stubs.workers(client, task_queue, workflow_runner=UnsandboxedWorkflowRunner()):
            await stack.enter_async_context(worker)
        handle = await start(client, spec)
        # Step 2 trains from checkpoint 1 as soon as it is manifested, not once it is served.
        await asyncio.wait_for(stubs.train_started[2].wait(), 30)
        assert stubs.names("reload") == [0, 1]
        stubs.reload_gates[1].set()
        final = await asyncio.wait_for(handle.result(), 30)
    assert final.step == 3 and [h.step for h in final.history] == [1, 2, 3]
    assert stubs.names("train") == [1, 1, 2, 3]  # step 1 again; step 2 sent to the lost trainer never started
    assert [s for _, s in stubs.published] == [0, 1, 2, 3]  # nothing lost, nothing published twice
    [again] = stubs.train_inputs[1][1:]
    assert again.start_from == stubs.checkpoints[spec.run_id][0]
    [second] = stubs.train_inputs[2]
    assert second.continue_from is None and second.start_from == final.history[0].checkpoint
    # Once checkpoint 1 is manifested:
    assert stubs.calls.index(("train", 2)) > stubs.calls.index(("publish", 1))


async def test_a_failing_publish_is_retried_and_a_failing_reload_fails_the_run_as_in_sync_mode(
    client: Client, task_queue: str
) -> None:
    stubs = ScriptedActivities()
    stubs.publish_failures[1] = [Failure("the store is restarting", STORE_UNAVAILABLE)]
    stubs.reload_failures[2] = [Failure("the server refused the adapter", CONFIG_ERROR, non_retryable=True)]
    spec = make_spec(task_queue, f"fails-{task_queue}", mode="pipelined", steps=4)
    async with running(stubs, client, task_queue):
        handle = await start(client, spec)
        with pytest.raises(WorkflowFailureError) as err:
            await asyncio.wait_for(handle.result(), 60)
        status = await handle.query(TrainingRun.status)
    cause = err.value.cause
    assert isinstance(cause, ApplicationError) and "step 2: reload failed" in cause.message
    assert "refused the adapter" in cause.message and status.error == cause.message
    assert stubs.names("publish").count(1) == 2  # retried
    assert status.step == 1 and status.phase == "failed" and stubs.names("reload") == [0, 1, 2]
    assert 4 not in stubs.names("train")  # never more than one step ahead of what is served
