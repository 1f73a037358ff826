"""A run's inline scenario list stored once in the real S3 store and rolled out by reference: the stored
copy, what the rollouts activity reads of it (verified, the run's own only, kept per worker), its errors."""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.object_store import ObjectStore
from activities.rollouts import RolloutActivities
from activities.run_texts import RunTextActivities, read_run_text
from activities.scenario_store import ScenarioActivities, read_scenarios
from activities.trajectory_store import read_ref_groups
from schemas import layout
from schemas.activities import RolloutsInput, StoreRunTextsInput, StoreScenariosInput
from schemas.config import TaskSpec
from schemas.errors import CONFIG_ERROR, StoredRunTextError, StoredScenariosError
from schemas.refs import ObjectRef

STUBS = "rollout_stubs"
SCENARIOS: list[dict[str, Any]] = [{"x": i, "id": f"s{i}", "note": "é"} for i in range(5)]


async def stored(store: ObjectStore, run_id: str = "r1") -> ObjectRef:
    return await ActivityEnvironment().run(
        ScenarioActivities(store).store_scenarios, StoreScenariosInput(run_id=run_id, scenarios=SCENARIOS)
    )


def step_input(scenarios: list[dict[str, Any]] | ObjectRef, run_id: str = "r1") -> RolloutsInput:
    return RolloutsInput(
        run_id=run_id,
        step=1,
        model_name="agent-001",
        task=TaskSpec(rollout=f"{STUBS}:ok", scenarios=scenarios),
        groups_per_step=4,
        group_size=2,
        seed=11,
    )


def activities(store: ObjectStore) -> RolloutActivities:
    return RolloutActivities("http://127.0.0.1:9", store, base_served_name="base", task_modules=(STUBS,))


async def refused(acts: RolloutActivities, inp: RolloutsInput) -> ApplicationError:
    with pytest.raises(ApplicationError) as info:
        await ActivityEnvironment().run(acts.rollouts, inp)
    assert info.value.non_retryable
    return info.value


async def test_the_list_is_stored_once_by_its_content_hash_and_reads_back_as_given(
    object_store: ObjectStore,
) -> None:
    ref = await stored(object_store)
    assert ref.uri == object_store.uri(layout.scenarios_key("r1", ref.sha256))
    assert await stored(object_store) == ref  # a retry writes the same bytes to the same key
    assert object_store.list("runs/r1/scenarios/") == [layout.scenarios_key("r1", ref.sha256)]
    back = read_scenarios(object_store, "r1", ref)
    assert back == SCENARIOS and [list(s) for s in back] == [["x", "id", "note"]] * 5  # key order kept


async def test_rollouts_of_the_stored_list_are_the_rollouts_of_the_inline_list(
    object_store: ObjectStore,
) -> None:
    ref = await stored(object_store)
    acts = activities(object_store)
    by_ref = await ActivityEnvironment().run(acts.rollouts, step_input(ref))
    by_ref_groups = read_ref_groups(object_store, by_ref.ref)
    inline = await ActivityEnvironment().run(acts.rollouts, step_input(SCENARIOS))
    inline_groups = read_ref_groups(object_store, inline.ref)
    assert [g.metadata for g in by_ref_groups] == [g.metadata for g in inline_groups]
    assert [t.reward for g in by_ref_groups for t in g.trajectories] == [
        t.reward for g in inline_groups for t in g.trajectories
    ]
    assert by_ref.n_trajectories == 8


async def test_a_worker_reads_the_stored_list_once_and_keeps_it(object_store: ObjectStore) -> None:
    ref = await stored(object_store)
    acts = activities(object_store)
    await ActivityEnvironment().run(acts.rollouts, step_input(ref))
    object_store.delete_prefix("runs/r1/scenarios/")
    again = await ActivityEnvironment().run(acts.rollouts, step_input(ref))  # kept: the store is not read
    assert again.n_trajectories == 8
    err = await refused(activities(object_store), step_input(ref))  # another worker reads the store
    assert err.type == CONFIG_ERROR
    assert "missing from the object store" in err.message and ref.uri in err.message


async def test_a_changed_stored_list_is_refused_naming_it(object_store: ObjectStore) -> None:
    ref = await stored(object_store)
    object_store.put_bytes(layout.scenarios_key("r1", ref.sha256), b'[{"x": 99}]')
    err = await refused(activities(object_store), step_input(ref))
    assert "is not the one the run stored" in err.message and ref.uri in err.message
    with pytest.raises(StoredScenariosError, match="sha256"):
        read_scenarios(object_store, "r1", ref)


async def test_a_run_reads_only_the_list_it_stored(object_store: ObjectStore) -> None:
    ref = await stored(object_store, run_id="other-run")
    acts = activities(object_store)
    await ActivityEnvironment().run(acts.rollouts, step_input(ref, run_id="other-run"))  # its run: kept
    err = await refused(acts, step_input(ref, run_id="r1"))
    assert "is not a scenario list run 'r1' stored" in err.message
    for uri in (f"s3://someone-elses/{layout.scenarios_key('r1', ref.sha256)}", "file:///etc/passwd"):
        err = await refused(acts, step_input(ref.model_copy(update={"uri": uri})))
        assert f"{uri} is not in this worker's object store" in err.message


async def test_a_runs_chat_template_and_rubric_are_stored_once_and_read_only_by_their_run(
    object_store: ObjectStore,
) -> None:
    """The texts ``TrainingRun`` stores once (activities/run_texts.py): read back verified, by the run's rollouts
    (the template a worker keeps) and by nobody else's; a changed copy is refused."""
    texts = {"chat_template": "{{ messages[0]['content'] }}é", "rubric": "Prefer short answers."}
    store_input = StoreRunTextsInput(run_id="r1", texts=texts)  # type: ignore[arg-type]
    refs = await ActivityEnvironment().run(RunTextActivities(object_store).store_run_texts, store_input)
    assert refs.chat_template is not None and refs.rubric is not None
    assert refs.chat_template.uri == object_store.uri(
        layout.run_text_key("r1", "chat_template", refs.chat_template.sha256)
    )
    assert read_run_text(object_store, "r1", "rubric", refs.rubric) == texts["rubric"]
    acts = activities(object_store)
    by_ref = step_input(SCENARIOS).model_copy(update={"chat_template_ref": refs.chat_template})
    assert acts.chat_template(by_ref) == texts["chat_template"]
    with pytest.raises(StoredRunTextError, match="is not a chat template run 'r2' stored"):
        acts.chat_template(by_ref.model_copy(update={"run_id": "r2"}))
    with pytest.raises(StoredRunTextError, match="is not a rubric run 'r1' stored"):
        read_run_text(object_store, "r1", "rubric", refs.chat_template)  # a ref of another kind
    object_store.put_bytes(object_store.key(refs.rubric.uri), b"Prefer long answers.")
    with pytest.raises(StoredRunTextError, match="is not the one the run stored"):
        read_run_text(object_store, "r1", "rubric", refs.rubric)
