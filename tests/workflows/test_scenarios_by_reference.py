"""TrainingRun stores an inline scenario list once and rolls it out by reference (scripted activities at the
seams; the real store and the rollouts activity reading it are tests/activities/test_scenario_store.py's)."""

from __future__ import annotations

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from test_training_run_logic import make_spec, running, start
from workflow_stubs import ScriptedActivities

from schemas.activities import ActivityName
from schemas.layout import scenarios_key
from schemas.refs import ObjectRef

MARK = "only-in-the-stored-copy"
SCENARIOS = [{"id": f"s{i}", "note": MARK} for i in range(4)]


async def test_an_inline_list_is_stored_once_per_run_and_every_shard_gets_its_ref(
    client: Client, task_queue: str
) -> None:
    stubs = ScriptedActivities()
    task = {"rollout": "examples.arithmetic:rollout", "scenarios": SCENARIOS}
    spec = make_spec(
        task_queue, f"by-ref-{task_queue}", task=task, steps=3, continue_as_new_every=1,
        groups_per_step=3, groups_per_shard=2,
    )  # fmt: skip
    async with running(stubs, client, task_queue):
        handle = await start(client, spec)
        final = await handle.result()
    assert final.step == 3
    assert stubs.names("store_scenarios") == [-1]  # once, though the run continued as new twice
    inputs = [inp for step in (1, 2, 3) for inp in stubs.rollout_inputs[step]]
    assert len(inputs) == 3 * 2
    ref = inputs[0].task.scenarios
    assert isinstance(ref, ObjectRef) and ref.uri == f"s3://stub/{scenarios_key(spec.run_id, ref.sha256)}"
    assert all(inp.task.scenarios == ref for inp in inputs)
    # The first workflow run's history: the list is in its input and in the one activity that stores it.
    carrying = []
    first_run = client.get_workflow_handle(spec.run_id, run_id=handle.first_execution_run_id)
    async for event in first_run.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            if any(MARK.encode() in p.data for p in attrs.input.payloads):
                carrying.append(attrs.activity_type.name)
    assert carrying == [ActivityName.STORE_SCENARIOS]


async def test_a_scenarios_function_is_passed_as_named_and_nothing_is_stored(
    client: Client, task_queue: str
) -> None:
    stubs = ScriptedActivities()
    spec = make_spec(task_queue, f"by-name-{task_queue}", steps=1)
    async with running(stubs, client, task_queue):
        await (await start(client, spec)).result()
    assert stubs.names("store_scenarios") == []
    assert [inp.task.scenarios for inp in stubs.rollout_inputs[1]] == ["examples.arithmetic:scenarios"]
