"""Servable before resumable (workflows/servable.py, workflows/beside.py) with scripted activities at the seams:
a step is served from its adapter while the rest of its checkpoint goes up beside what follows, and a trainer
lost in between means the step is trained again from the checkpoint before it, served again, and the rollouts
its lost adapter sampled are dropped and rolled out again (kept when it came out bit for bit the same).

The scripted trainer refuses a training from anything but the newest published checkpoint of the step before,
or a continuation of a staging it no longer holds: each training below resumed exactly. The real run is
tests/workflows/test_servable_real.py."""

from __future__ import annotations

import asyncio

import pytest
from temporalio.client import Client
from test_training_run_logic import eventually, make_spec, running, start
from workflow_stubs import ScriptedActivities

from schemas.run_state import RunStatus


def trained_on(stubs: ScriptedActivities, step: int) -> list[str]:
    """The adapters that sampled what step ``step``'s last training trained on."""
    return stubs.advantages_inputs[step][-1].trajectories.policy_adapters


def assert_step_1_trained_again(stubs: ScriptedActivities, final: RunStatus, run_id: str, same: bool) -> None:
    lost, again = (sha for step, sha in stubs.reloaded if step == 1)
    assert (lost == again) == same
    assert stubs.train_inputs[1][-1].start_from == stubs.checkpoints[run_id][0]  # from checkpoint 0, exactly
    first = final.history[0]
    assert first.trained_again and first.adapter_sha256 == again == stubs.adapters[(run_id, 1)]
    assert first.checkpoint == stubs.checkpoints[run_id][1]
    assert final.dropped_lost_adapter_groups == (0 if same else 2)
    for step in range(2, final.step + 1):  # nothing trained on what the lost adapter sampled
        assert lost == again or lost not in trained_on(stubs, step), step
    assert [h.adapter_sha256 for h in final.history] == [stubs.adapters[(run_id, n)] for n in (1, 2, 3)]
    stubs.assert_each_checkpoint_trained_from_the_one_before(run_id, 3)


@pytest.mark.parametrize("same", [False, True], ids=["another-adapter", "same-adapter"])
async def test_sync_step_served_then_its_trainer_lost_is_trained_again(
    client: Client, task_queue: str, same: bool
) -> None:
    stubs = ScriptedActivities(lost_after_adapter={1}, same_adapter_when_trained_again=same)
    spec = make_spec(task_queue, f"sv-sync-{same}-{task_queue}", steps=3)
    async with running(stubs, client, task_queue):
        final = await (await start(client, spec)).result()
    assert final.phase == "done" and final.step == 3
    assert stubs.names("train") == [1, 1, 2, 3]
    # Step 2's rollouts were sampled by step 1's first adapter, beside its optimizer state going up; when the
    # trainer is lost and step 1 trained again into another adapter, they are rolled out again with that one.
    assert stubs.rollout_policies[2] == ([1] if same else [1, 1])
    assert trained_on(stubs, 2) == [stubs.adapters[(spec.run_id, 1)]]
    assert stubs.train_inputs[2][0].start_from == stubs.checkpoints[spec.run_id][1]
    assert_step_1_trained_again(stubs, final, spec.run_id, same)


@pytest.mark.parametrize("same", [False, True], ids=["another-adapter", "same-adapter"])
async def test_pipelined_step_served_then_its_trainer_lost_is_trained_again(
    client: Client, task_queue: str, same: bool
) -> None:
    """Step 1's trainer is started again without its disk once step 1's adapter is up: step 2, sent to it, finds
    step 1's staging gone and trains from checkpoint 1 once it is resumable, which it is once step 1 is trained
    again; step 3's rollouts, sampled by step 1's first adapter, are rolled out again."""
    stubs = ScriptedActivities(lost_after_adapter={1}, same_adapter_when_trained_again=same)
    stubs.train_entry_gates[2] = asyncio.Event()
    spec = make_spec(task_queue, f"sv-pipe-{same}-{task_queue}", mode="pipelined", steps=3)
    async with running(stubs, client, task_queue):
        handle = await start(client, spec)
        await eventually(lambda: asyncio.sleep(0, result=bool(stubs.lost_stagings)))
        stubs.train_entry_gates[2].set()
        final = await handle.result()
    assert final.phase == "done" and final.step == 3
    # Step 2's first attempt found step 1's staging gone.
    assert sorted(stubs.names("train")) == [1, 1, 2, 2, 3]
    [beside, again] = stubs.train_inputs[2]
    assert beside.continue_from is not None and again.start_from == stubs.checkpoints[spec.run_id][1]
    assert stubs.rollout_policies[3][0] == 1 and len(stubs.rollout_policies[3]) == (1 if same else 2)
    assert_step_1_trained_again(stubs, final, spec.run_id, same)


async def test_pipelined_steps_become_resumable_in_step_order(client: Client, task_queue: str) -> None:
    """Step 2 trains on step 1's trainer, and its adapter goes up, while step 1's optimizer state is still going up;
    then that trainer is lost. Step 2's checkpoint is not made resumable before step 1's: trained from step 1's
    lost adapter, it is trained again from step 1 trained again."""
    stubs = ScriptedActivities(lost_after_adapter={1})
    stubs.publish_gates[1] = asyncio.Event()
    spec = make_spec(task_queue, f"sv-order-{task_queue}", mode="pipelined", steps=3)
    async with running(stubs, client, task_queue):
        handle = await start(client, spec)
        await eventually(lambda: asyncio.sleep(0, result=stubs.names("publish_adapter")[:2] == [1, 2]))
        await asyncio.sleep(0.5)  # step 2's rest would go up now if it did not wait for step 1's
        stubs.publish_gates[1].set()
        final = await handle.result()
    assert final.phase == "done" and final.step == 3
    trains = stubs.names("train")
    assert trains.count(1) == trains.count(2) == 2  # (step 3 too, when it trained on the lost trainer first)
    [beside, again] = stubs.train_inputs[2]
    assert beside.continue_from is not None and again.start_from == stubs.checkpoints[spec.run_id][1]
    assert [h.trained_again for h in final.history][:2] == [True, True]
    stubs.assert_each_checkpoint_trained_from_the_one_before(spec.run_id, 3)
