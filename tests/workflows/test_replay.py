"""Runs in flight survive a change to workflow code: histories recorded from real runs (histories/, made by
histories/record.py: sync with a continue-as-new, pipelined, shared, the ART client's ServeModel and
TrainSteps, its TrainSFT, a sync run with inline scenarios recorded before ``scenarios-by-reference``, and a
judged run with its own chat template and rubric recorded before ``run-texts-by-reference``, a pipelined run
after ``durability-beside-training``, a sync and a pipelined run after ``servable-before-resumable``, and a
pipelined run after ``unsettled-step-across-continue-as-new``) are
replayed with Temporal's ``Replayer`` against today's workflows. A change that would make a
recorded run take another path (a new activity, a reordered timer, a removed step) fails here; guard such a
change with ``workflow.patched`` so old histories keep their path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

from schemas.activities import ActivityName
from schemas.config import RunSpec
from workflows.pipeline import CARRY_PATCH
from workflows.servable import SERVABLE_PATCH
from workflows.serve_model import ServeModel
from workflows.train_sft import TrainSFT
from workflows.train_step import TrainStep
from workflows.training_run import PIPELINE_PATCH, RUN_TEXTS_REF_PATCH, SCENARIOS_REF_PATCH, TrainingRun
from workflows.versioned import VERSIONED_WORKFLOWS

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))
WORKFLOWS = [TrainingRun, TrainStep, ServeModel, TrainSFT]


def load(path: Path) -> WorkflowHistory:
    return WorkflowHistory.from_json(path.stem.split("__")[0], path.read_text())


def workflow_type(history: WorkflowHistory) -> str:
    start = history.events[0].workflow_execution_started_event_attributes
    return str(start.workflow_type.name)


def test_the_recorded_histories_cover_every_workflow_and_mode() -> None:
    names = {p.stem for p in HISTORIES}
    assert {workflow_type(load(p)) for p in HISTORIES} == {w.__name__ for w in WORKFLOWS}
    expected = {
        "replay-sync__0",
        "replay-sync__1",
        "replay-pipelined__0",
        "replay-shared__0",
        "replay-inline__0",
        "replay-resample__0",
        "replay-texts__0",
        "replay-beside__0",
        "replay-beside__1",
        "replay-servable-sync__0",
        "replay-servable-sync__1",
        "replay-servable-pipelined__0",
        "replay-servable-pipelined__1",
        "replay-carry-pipelined__0",
        "replay-carry-pipelined__1",
    }
    assert expected <= names
    chain = load(Path(__file__).parent / "histories" / "replay-sync__0.json")
    assert any(e.HasField("workflow_execution_continued_as_new_event_attributes") for e in chain.events)


def test_the_resample_history_rolls_a_step_out_again_before_it_trains() -> None:
    """``record.py --only resample``: the step's first rollouts had no learning signal, so it was rolled out
    again on other scenarios before it trained."""
    history = load(Path(__file__).parent / "histories" / "replay-resample__0.json")
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    first_train = scheduled.index("train")
    assert scheduled[:first_train].count("rollouts") >= 2
    assert scheduled[:first_train].count("compute_advantages") >= 2


def test_the_beside_history_trains_a_step_while_the_one_before_it_is_published_and_reloaded() -> None:
    """``record.py --only beside``: a pipelined run after ``durability-beside-training`` (4 epochs a step, so
    training is the longer phase); the run of a pipelined history from before it (replay-pipelined) never does."""

    def overlaps(name: str) -> list[int]:
        history = load(Path(__file__).parent / "histories" / name)
        scheduled: dict[int, tuple[str, str]] = {}
        open_publishing: set[str] = set()  # steps whose publish or reload has not completed yet
        found = []
        for e in history.events:
            if e.HasField("activity_task_scheduled_event_attributes"):
                kind = e.activity_task_scheduled_event_attributes.activity_type.name
                step = json.loads(e.user_metadata.summary.data).split()[1]
                scheduled[e.event_id] = (kind, step)
                if kind in (ActivityName.PUBLISH, ActivityName.RELOAD):
                    open_publishing.add(step)
                if kind == ActivityName.TRAIN and str(int(step) - 1) in open_publishing:
                    found.append(int(step))
            elif e.HasField("activity_task_completed_event_attributes"):
                kind, step = scheduled[e.activity_task_completed_event_attributes.scheduled_event_id]
                if kind == ActivityName.RELOAD:
                    open_publishing.discard(step)
        return found

    assert overlaps("replay-beside__0.json")
    assert not overlaps("replay-pipelined__0.json")
    assert PIPELINE_PATCH in patches_of("replay-beside__0.json")
    assert PIPELINE_PATCH not in patches_of("replay-pipelined__0.json")


@pytest.mark.parametrize("name", ["replay-servable-sync__0.json", "replay-servable-pipelined__0.json"])
def test_the_servable_histories_reload_each_step_from_its_adapter_before_the_rest_is_written(
    name: str,
) -> None:
    """``record.py --only servable``: after ``servable-before-resumable`` each step's adapter is published and
    reloaded (the reload names the adapter manifest), the rest of its checkpoint written beside; the histories from
    before it (replay-sync, replay-beside) publish each step whole and reload the whole checkpoint."""

    def reloads(history_name: str) -> dict[int, tuple[list[str], str]]:
        """Step -> (the publish activities completed before its reload was scheduled, what the reload names)."""
        completed: dict[int, list[str]] = {}
        scheduled: dict[int, tuple[str, int]] = {}
        found = {}
        for e in load(Path(__file__).parent / "histories" / history_name).events:
            if e.HasField("activity_task_scheduled_event_attributes"):
                attributes = e.activity_task_scheduled_event_attributes
                kind, step = (
                    attributes.activity_type.name,
                    int(json.loads(e.user_metadata.summary.data).split()[1]),
                )
                scheduled[e.event_id] = (kind, step)
                if kind == ActivityName.RELOAD and step > 0:
                    [payload] = attributes.input.payloads
                    ref = json.loads(payload.data)["checkpoint"]
                    found[step] = (
                        list(completed.get(step, [])),
                        "adapter" if "adapter_sha256" in ref else "whole",
                    )
            elif e.HasField("activity_task_completed_event_attributes"):
                kind, step = scheduled[e.activity_task_completed_event_attributes.scheduled_event_id]
                if kind in (ActivityName.PUBLISH_ADAPTER, ActivityName.PUBLISH):
                    completed.setdefault(step, []).append(kind)
        return found

    servable = reloads(name)
    assert servable and all(seen == (["publish_adapter"], "adapter") for seen in servable.values()), servable
    assert SERVABLE_PATCH in patches_of(name)
    for before in ("replay-sync__0.json", "replay-beside__0.json"):
        assert all(seen == (["publish"], "whole") for seen in reloads(before).values())
        assert SERVABLE_PATCH not in patches_of(before)


def test_the_carry_history_continues_as_new_before_its_last_step_is_resumable() -> None:
    """``record.py --only carry``: after ``unsettled-step-across-continue-as-new`` a pipelined run continues as new
    once step 2 is served, and the continued run writes step 2's rest beside step 3's training, with step 3's
    advantages carried over; the pipelined history from before it (replay-servable-pipelined) writes its last
    step's rest first, and its continued run computes the carried rollouts' advantages again."""

    def activities(name: str) -> list[tuple[str, int]]:
        out = []
        for e in load(Path(__file__).parent / "histories" / name).events:
            if e.HasField("activity_task_scheduled_event_attributes"):
                step = int(json.loads(e.user_metadata.summary.data).split()[1])
                out.append((e.activity_task_scheduled_event_attributes.activity_type.name, step))
        return out

    first, continued = (
        activities("replay-carry-pipelined__0.json"),
        activities("replay-carry-pipelined__1.json"),
    )
    assert (ActivityName.RELOAD, 2) in first and (ActivityName.PUBLISH, 2) not in first
    assert continued.index((ActivityName.PUBLISH, 2)) < continued.index((ActivityName.TRAIN, 3))
    assert (ActivityName.ADVANTAGES, 3) not in continued
    assert CARRY_PATCH in patches_of("replay-carry-pipelined__0.json")
    before, its_continued = (activities(f"replay-servable-pipelined__{n}.json") for n in (0, 1))
    assert (ActivityName.PUBLISH, 3) in before and (ActivityName.ADVANTAGES, 4) in its_continued
    assert CARRY_PATCH not in patches_of("replay-servable-pipelined__0.json")


def patches_of(name: str) -> set[str]:
    patches = set()
    for e in load(Path(__file__).parent / "histories" / name).events:
        if e.HasField("marker_recorded_event_attributes"):
            [patch] = e.marker_recorded_event_attributes.details["patch-data"].payloads
            patches.add(json.loads(patch.data)["id"])
    return patches


def test_the_inline_scenarios_history_is_a_run_from_before_scenarios_by_reference() -> None:
    # Recorded again from today's code it would take the patched path, and the old one would go untested.
    history = load(Path(__file__).parent / "histories" / "replay-inline__0.json")
    activities = {
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    }
    assert ActivityName.ROLLOUTS in activities and ActivityName.STORE_SCENARIOS not in activities
    assert SCENARIOS_REF_PATCH not in patches_of("replay-inline__0.json")


def test_the_texts_history_is_a_run_from_before_run_texts_by_reference() -> None:
    """Its rollouts, judge and train inputs carry the chat template and the rubric themselves: the path a run
    in flight from before the patch keeps."""
    history = load(Path(__file__).parent / "histories" / "replay-texts__0.json")
    inputs: dict[str, list[dict[str, object]]] = {}
    patches: set[str] = set()
    for e in history.events:
        if e.HasField("activity_task_scheduled_event_attributes"):
            scheduled = e.activity_task_scheduled_event_attributes
            [payload] = scheduled.input.payloads
            inputs.setdefault(scheduled.activity_type.name, []).append(json.loads(payload.data))
        if e.HasField("marker_recorded_event_attributes"):
            [patch] = e.marker_recorded_event_attributes.details["patch-data"].payloads
            patches.add(json.loads(patch.data)["id"])
    assert ActivityName.STORE_RUN_TEXTS not in inputs and RUN_TEXTS_REF_PATCH not in patches
    assert all(i["chat_template"] for i in inputs[ActivityName.ROLLOUTS])
    assert all(i["judge"]["rubric"] for i in inputs[ActivityName.JUDGE])
    assert all(i["model"]["chat_template"] for i in inputs[ActivityName.TRAIN])


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
@pytest.mark.parametrize("registered", [WORKFLOWS, VERSIONED_WORKFLOWS], ids=["unversioned", "versioned"])
async def test_a_recorded_run_replays_on_todays_workflow_code(path: Path, registered: list[type]) -> None:
    """As an unversioned worker and as a worker of a Worker Deployment registers them (a TrainingRun moving
    to a new build is replayed there); every activity now carries its run's priority and fairness, which
    replay does not compare."""
    replayer = Replayer(workflows=registered, data_converter=pydantic_data_converter)
    await replayer.replay_workflow(load(path))  # raises on any nondeterminism


@workflow.defn(name="TrainingRun", sandboxed=False)  # defined in a test module
class ChangedTrainingRun:
    """A TrainingRun that would start differently: the first command is a timer, not the recorded activity."""

    @workflow.run
    async def run(self, spec: RunSpec, state: object = None) -> None:
        await workflow.sleep(1)


async def test_a_workflow_that_takes_another_path_fails_the_replay() -> None:
    replayer = Replayer(workflows=[ChangedTrainingRun], data_converter=pydantic_data_converter)
    with pytest.raises(NondeterminismError):
        await replayer.replay_workflow(load(Path(__file__).parent / "histories" / "replay-sync__0.json"))
