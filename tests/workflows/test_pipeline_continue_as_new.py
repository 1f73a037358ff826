"""A pipelined run continuing as new (workflows/pipeline.py, ``RunState.unsettled``), with scripted activities at
the seams on a real Temporal dev server: the run continues once its last step is served, and the continued run
trains on from that step's staging while the rest of its checkpoint goes up; a trainer lost in between means the
step is trained again from the checkpoint before it, in the continued run. The scripted trainer refuses a
training from anything but the newest published checkpoint of the step before, or a continuation of a staging it
no longer holds."""

from __future__ import annotations

import asyncio

import pytest
from temporalio.client import Client, WorkflowFailureError
from test_training_run_logic import eventually, make_spec, running, start
from workflow_stubs import WORKER_ID, ScriptedActivities

from schemas.history_bounds import RESAMPLES_WITHOUT_SIGNAL


async def executions(client: Client, run_id: str) -> int:
    """How many executions the run's continue-as-new chain has."""
    count, handle = 0, client.get_workflow_handle(run_id)
    run: str | None = (await handle.describe()).raw_description.workflow_execution_info.first_run_id
    while run:
        count, next_run = count + 1, None
        async for event in client.get_workflow_handle(run_id, run_id=run).fetch_history_events():
            if event.HasField("workflow_execution_continued_as_new_event_attributes"):
                next_run = event.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
        run = next_run
    return count


async def test_a_continued_run_trains_on_while_the_last_steps_optimizer_state_goes_up(
    client: Client, task_queue: str
) -> None:
    """Step 2's rest is held back: step 3, in the continued run, trains from step 2's staging on its trainer all the
    same, and with the advantages computed before the run continued; step 2 becomes resumable there, once."""
    stubs = ScriptedActivities()
    stubs.publish_gates[2] = asyncio.Event()
    spec = make_spec(task_queue, f"carry-{task_queue}", mode="pipelined", steps=4, continue_as_new_every=2)
    async with running(stubs, client, task_queue):
        handle = await start(client, spec)
        await asyncio.wait_for(stubs.train_started[3].wait(), 20)
        assert (await executions(client, spec.run_id)) == 2  # continued as new, step 2 not yet resumable
        assert stubs.checkpoints[spec.run_id].get(2) is None
        stubs.publish_gates[2].set()
        final = await handle.result()
    assert final.phase == "done" and final.step == 4
    [third] = stubs.train_inputs[3]
    assert third.continue_from is not None and third.start_from is None
    assert (third.continue_from.step, third.continue_from.worker_id) == (2, WORKER_ID)
    assert stubs.names("publish").count(2) == 1
    assert stubs.names("compute_advantages").count(3) == 1  # carried over, not computed again
    assert [h.checkpoint for h in final.history] == [stubs.checkpoints[spec.run_id][n] for n in (1, 2, 3, 4)]
    assert final.last_checkpoint == stubs.checkpoints[spec.run_id][4]
    stubs.assert_each_checkpoint_trained_from_the_one_before(spec.run_id, 4)


async def test_the_carried_steps_trainer_lost_before_its_rest_is_written_trains_it_again_in_the_continued_run(
    client: Client, task_queue: str
) -> None:
    """Step 2's trainer comes back without its disk when the continued run writes step 2's rest: step 2 is trained
    again there from checkpoint 1 and served again, and step 3, sent to the lost staging first, trains from
    checkpoint 2 as trained again."""
    stubs = ScriptedActivities(lost_after_adapter={2})
    stubs.train_entry_gates[3] = asyncio.Event()
    spec = make_spec(
        task_queue, f"carry-lost-{task_queue}", mode="pipelined", steps=4, continue_as_new_every=2
    )
    async with running(stubs, client, task_queue):
        handle = await start(client, spec)
        await eventually(lambda: asyncio.sleep(0, result=bool(stubs.lost_stagings)))
        stubs.train_entry_gates[3].set()
        final = await handle.result()
    assert final.phase == "done" and final.step == 4
    assert (await executions(client, spec.run_id)) == 2
    assert sorted(stubs.names("train")) == [1, 2, 2, 3, 3, 4]
    [beside, again] = stubs.train_inputs[3]
    assert beside.continue_from is not None and again.start_from == stubs.checkpoints[spec.run_id][2]
    assert stubs.train_inputs[2][-1].start_from == stubs.checkpoints[spec.run_id][1]
    second = final.history[1]
    assert second.trained_again and second.checkpoint == stubs.checkpoints[spec.run_id][2]
    assert second.adapter_sha256 == stubs.adapters[(spec.run_id, 2)]
    assert [h.checkpoint for h in final.history] == [stubs.checkpoints[spec.run_id][n] for n in (1, 2, 3, 4)]
    stubs.assert_each_checkpoint_trained_from_the_one_before(spec.run_id, 4)


async def test_a_run_that_fails_as_it_continues_as_new_still_writes_its_last_steps_checkpoint(
    client: Client, task_queue: str
) -> None:
    """Step 3's rollouts, awaited as the run continues as new after step 2, never have a learning signal: the run
    fails there, and step 2's rest, which a continued run would have written, is written before it does."""
    stubs = ScriptedActivities(no_signal={3: RESAMPLES_WITHOUT_SIGNAL + 1})
    spec = make_spec(
        task_queue, f"carry-fail-{task_queue}", mode="pipelined", steps=4, continue_as_new_every=2
    )
    async with running(stubs, client, task_queue):
        handle = await start(client, spec)
        with pytest.raises(WorkflowFailureError):
            await asyncio.wait_for(handle.result(), 60)
    assert (await executions(client, spec.run_id)) == 1
    assert stubs.names("publish") == [1, 2]
    assert 2 in stubs.checkpoints[spec.run_id]
