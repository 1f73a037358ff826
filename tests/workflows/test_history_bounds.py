"""RunSpec's bounds hold what they claim: the largest allowed runs, played on the real Temporal dev server with
scripted activities at the seams and every resample taken, record histories under the estimates of
``schemas/history_bounds.py``, and those under a fifth of Temporal's limits; one more is refused."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError
from test_training_run_logic import make_spec, running, start
from workflow_stubs import ScriptedActivities

from dgrpo.client import run_control
from schemas import layout
from schemas.activities import JudgeInput, ReloadInput, RolloutsInput, TrainInput
from schemas.config import (
    MAX_MODULE_NAME_CHARS,
    MAX_NAME_CHARS,
    MAX_PATH_CHARS,
    MAX_TARGET_MODULES,
    MAX_TASK_QUEUE_CHARS,
    MAX_URL_CHARS,
    RunSpec,
    parse_run_spec,
)
from schemas.errors import CONFIG_ERROR, RunSpecError
from schemas.history_bounds import (
    GRPC_MESSAGE_BYTES_LIMIT,
    HISTORY_BYTES_BUDGET,
    HISTORY_BYTES_LIMIT,
    HISTORY_EVENTS_BUDGET,
    HISTORY_EVENTS_LIMIT,
    JSON_BYTES_PER_CHAR,
    MAX_ACTIVITY_INPUT_BYTES,
    MAX_INLINE_SCENARIOS_BYTES,
    MAX_RUN_TEXT_CHARS,
    MAX_SHARDS_PER_STEP,
    MAX_SPEC_BYTES,
    PAYLOAD_BYTES_LIMIT,
    PENDING_ACTIVITIES_LIMIT,
    RESAMPLES_WITHOUT_SIGNAL,
    RUN_STATE_BYTES,
    run_history_bytes,
    run_history_events,
)
from schemas.refs import CheckpointRef, ObjectRef, TrajectoriesRef

# The worst a step can do in these stubs: judged (one more activity per round), shared (sleep and wake),
# retention on, every resample taken, and the run's own chat template and rubric at their largest (each run
# stores them once; its activities carry refs).
WORST = {
    "model": {
        "name": "agent-001",
        "base_model": "smollm2-135m-instruct",
        "chat_template": "t" * MAX_RUN_TEXT_CHARS,
    },
    "judge": {"kind": "ruler", "rubric": "r" * MAX_RUN_TEXT_CHARS},
    "mode": "shared",
    "checkpoints": {"keep_last": 1},
}


def allowed(task_queue: str, run_id: str, **overrides: Any) -> bool:
    return make_spec(task_queue, run_id, **WORST, **overrides).history_bounds_error() is None


def largest(task_queue: str, field: str, **overrides: Any) -> int:
    """The largest value of ``field`` (from 1 up) that RunSpec accepts with ``overrides``."""
    value = 1
    while allowed(task_queue, "probe", **overrides, **{field: value + 1}):
        value += 1
    return value


async def measured_runs(client: Client, spec: RunSpec, stubs: ScriptedActivities) -> list[tuple[int, int]]:
    """Play ``spec`` to the end; (events, bytes) of each of its workflow runs, following continue-as-new."""
    handle = await start(client, spec)
    await handle.result()
    runs, run_id = [], handle.first_execution_run_id
    while run_id:
        history = await client.get_workflow_handle(spec.run_id, run_id=run_id).fetch_history()
        runs.append((len(history.events), sum(event.ByteSize() for event in history.events)))
        last = history.events[-1]
        run_id = (
            last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
            if last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
            else ""
        )
    return runs


async def test_the_largest_allowed_step_fan_out_stays_under_its_history_estimate(
    client: Client, task_queue: str
) -> None:
    shape = {"groups_per_step": MAX_SHARDS_PER_STEP, "groups_per_shard": 1}
    every = largest(task_queue, "continue_as_new_every", **shape)
    assert not allowed(
        task_queue, "one-more-shard", groups_per_step=MAX_SHARDS_PER_STEP + 1, groups_per_shard=1
    )
    assert not allowed(task_queue, "one-more-step", **shape, continue_as_new_every=every + 1)
    spec = make_spec(
        task_queue, f"fan-{task_queue}", **WORST, **shape, steps=every, continue_as_new_every=every
    )
    stubs = ScriptedActivities(no_signal={step: RESAMPLES_WITHOUT_SIGNAL for step in range(1, every + 1)})
    async with running(stubs, client, task_queue):
        runs = await measured_runs(client, spec, stubs)
    assert len(runs) == 1
    assert len(stubs.names("rollouts")) == every * (RESAMPLES_WITHOUT_SIGNAL + 1) * MAX_SHARDS_PER_STEP
    assert stubs.names("store_run_texts") == [-1]  # the template and the rubric, once
    events_bound = run_history_events(MAX_SHARDS_PER_STEP, every)
    bytes_bound = run_history_bytes(
        MAX_SHARDS_PER_STEP, every, 0, len(spec.model_dump_json()), spec.texts_bytes(), spec.carried_bytes()
    )
    for events, size in runs:
        assert events <= events_bound <= HISTORY_EVENTS_BUDGET, (events, events_bound)
        assert size <= bytes_bound <= HISTORY_BYTES_BUDGET, (size, bytes_bound)


async def test_the_largest_allowed_inline_scenarios_stay_under_their_history_estimate(
    client: Client, task_queue: str
) -> None:
    # One scenario of just under the inline limit, as many shards per step as the budgets allow (the shards
    # carry the stored list's ref, so the list is in the history twice: the run's input and the store's).
    item_bytes = len('[{"prompt":""}]')
    scenarios = [{"prompt": "x" * (MAX_INLINE_SCENARIOS_BYTES - item_bytes)}]
    task = {"rollout": "examples.arithmetic:rollout", "scenarios": scenarios}
    assert not allowed(
        task_queue, "one-more-byte", task={**task, "scenarios": [{"prompt": scenarios[0]["prompt"] + "x"}]}
    )
    groups = largest(task_queue, "groups_per_step", task=task, groups_per_shard=1, continue_as_new_every=1)
    spec = make_spec(
        task_queue, f"inline-{task_queue}", **WORST, task=task, steps=1, continue_as_new_every=1,
        groups_per_step=groups, groups_per_shard=1,
    )  # fmt: skip
    assert spec.inline_scenarios_bytes() == MAX_INLINE_SCENARIOS_BYTES
    stubs = ScriptedActivities(no_signal={1: RESAMPLES_WITHOUT_SIGNAL})
    async with running(stubs, client, task_queue):
        [(events, size)] = await measured_runs(client, spec, stubs)
    assert len(stubs.names("rollouts")) == (RESAMPLES_WITHOUT_SIGNAL + 1) * groups
    assert stubs.names("store_scenarios") == [-1]
    bytes_bound = run_history_bytes(
        groups,
        1,
        MAX_INLINE_SCENARIOS_BYTES,
        len(spec.model_dump_json()),
        spec.texts_bytes(),
        spec.carried_bytes(),
    )
    assert size <= bytes_bound <= HISTORY_BYTES_BUDGET, (size, bytes_bound)
    assert events <= run_history_events(groups, 1) <= HISTORY_EVENTS_BUDGET


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        (
            {"groups_per_step": 1000, "groups_per_shard": 7},
            ["groups_per_shard to at least 8", "2,000 pending"],
        ),
        (
            {"groups_per_step": 128, "groups_per_shard": 1, "continue_as_new_every": 5},
            ["continue_as_new_every to at most"],
        ),
        ({"continue_as_new_every": 51}, ["continue_as_new_every 51 is over 50"]),
        (
            {"task": {"rollout": "m:f", "scenarios": [{"q": "x" * MAX_INLINE_SCENARIOS_BYTES}]}},
            ["task.scenarios", ".jsonl", "2,097,152-byte payload limit"],
        ),
    ],
)
def test_a_spec_over_a_bound_is_refused_naming_the_field_and_the_limit(
    overrides: dict[str, Any], names: list[str]
) -> None:
    data = make_spec("q", "over").model_dump(mode="json") | overrides
    with pytest.raises(RunSpecError) as refused:
        parse_run_spec(data, "over.toml")  # what `dgrpo train` and the demo read a spec with
    for name in names:
        assert name in str(refused.value)


async def test_a_new_run_over_a_bound_is_refused_however_it_is_started(
    client: Client, task_queue: str
) -> None:
    """The client refuses it before starting anything; started on Temporal directly (``temporal workflow
    start``), the run fails at once, non-retryably, naming the bound. A spec over the bounds still decodes, so a
    run started under looser bounds keeps running and replaying."""
    spec = make_spec(task_queue, f"over-{task_queue}", groups_per_step=1000, groups_per_shard=7)
    with pytest.raises(RunSpecError, match="groups_per_shard to at least 8"):
        await run_control.start_run(client, spec)
    async with running(ScriptedActivities(), client, task_queue):
        handle = await start(client, spec)
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and cause.non_retryable and cause.type == CONFIG_ERROR
    assert "groups_per_shard to at least 8" in cause.message


def largest_inputs() -> list[BaseModel]:
    """The largest input a spec within its bounds makes for each activity that carries its strings: every
    name, path, endpoint and module list at its longest (the texts and an inline list go by reference)."""
    ref = ObjectRef(uri="s3://" + "b" * 63 + "/" + layout.run_text_key("r" * 128, "chat_template", "0" * 64),
                    size=5 * 2**40, sha256="0" * 64)  # fmt: skip
    spec = make_spec(
        "q" * MAX_TASK_QUEUE_CHARS,
        "r" * 128,
        model={"name": "m" * 128, "project": "p" * 128, "base_model": "b" * MAX_PATH_CHARS,
               "lora": {"target_modules": ["t" * MAX_MODULE_NAME_CHARS] * MAX_TARGET_MODULES}},
        task={"rollout": "a" * (MAX_NAME_CHARS - 2) + ":f", "scenarios": "s" * (MAX_PATH_CHARS - 6) + ".jsonl"},
        judge={"kind": "ruler", "model": "j" * MAX_NAME_CHARS, "base_url": "h" * MAX_URL_CHARS,
               "api_key_env": "K" * MAX_NAME_CHARS},
    )  # fmt: skip
    checkpoint = CheckpointRef(run_id=spec.run_id, step=10**6, uri=ref.uri + "/", manifest_sha256="0" * 64)
    scored = TrajectoriesRef(run_id=spec.run_id, step=10**6, ref=ref, n_groups=10**5, n_trajectories=10**6)
    return [
        RolloutsInput(run_id=spec.run_id, step=10**6, model_name=spec.model.name, adapter=f"{spec.run_id}@1000000",
                      policy_step=10**6, task=spec.task, groups_per_step=10**5, group_size=4096,
                      scenario_offset=10**11, seed=2**40, shard=127, shards=128, chat_template_ref=ref),
        JudgeInput(run_id=spec.run_id, step=10**6, trajectories=scored, judge=spec.judge,
                   base_model_name=spec.model.base_model, rubric_ref=ref),
        TrainInput(run_id=spec.run_id, step=10**6, model=spec.model, advantages=ref, train=spec.train,
                   start_from=checkpoint, chat_template_ref=ref),
        ReloadInput(model_name=spec.model.name, checkpoint=checkpoint, serving=spec.serving, lora_rank=1024),
    ]  # fmt: skip


def test_every_bound_follows_from_temporals_limits() -> None:
    """The arithmetic behind RunSpec's bounds (``schemas/history_bounds.py``), against Temporal's limits."""
    # A run may use a fifth of the history limits; the rest is margin for what a spec cannot see.
    assert (HISTORY_EVENTS_BUDGET, HISTORY_BYTES_BUDGET) == (
        HISTORY_EVENTS_LIMIT // 5,
        HISTORY_BYTES_LIMIT // 5,
    )
    # A step's shards are pending together: far below Temporal's cap on pending activities.
    assert MAX_SHARDS_PER_STEP * 10 <= PENDING_ACTIVITIES_LIMIT
    # ... and scheduled in one workflow task, whose commands share one gRPC message.
    inputs = {type(i).__name__: len(i.model_dump_json()) for i in largest_inputs()}
    assert max(inputs.values()) <= MAX_ACTIVITY_INPUT_BYTES, inputs
    assert MAX_SHARDS_PER_STEP * MAX_ACTIVITY_INPUT_BYTES <= GRPC_MESSAGE_BYTES_LIMIT // 2
    # The spec travels with the run's state in one payload when the run continues as new.
    assert MAX_SPEC_BYTES + RUN_STATE_BYTES < PAYLOAD_BYTES_LIMIT
    # The largest inline list and both texts at their caps (plain ASCII) fit that spec payload ...
    item = len('[{"prompt":""}]')
    biggest = make_spec(
        "q", "big", **WORST,
        task={"rollout": "m:f", "scenarios": [{"prompt": "x" * (MAX_INLINE_SCENARIOS_BYTES - item)}]},
    )  # fmt: skip
    assert biggest.history_bounds_error() is None and len(biggest.model_dump_json()) <= MAX_SPEC_BYTES
    # ... and texts that escape to JSON_BYTES_PER_CHAR a character are refused by the spec, not by Temporal.
    escaped = "\x1f" * MAX_RUN_TEXT_CHARS
    assert len(json.dumps(escaped)) - 2 == JSON_BYTES_PER_CHAR * MAX_RUN_TEXT_CHARS
    over = biggest.model_copy(update={
        "model": biggest.model.model_copy(update={"chat_template": escaped}),
        "judge": biggest.judge.model_copy(update={"rubric": escaped}),
    })  # fmt: skip
    refused = over.history_bounds_error() or ""
    assert "model.chat_template" in refused and "judge.rubric" in refused and "payload limit" in refused
    # The texts are stored once per run, so the largest template and rubric cost a run their size, not
    # their size per shard and per step: the largest fan-out with them stays within the budget.
    with_texts = make_spec("q", "fan", **WORST, groups_per_step=MAX_SHARDS_PER_STEP, groups_per_shard=1,
                           continue_as_new_every=1)  # fmt: skip
    assert with_texts.history_bounds_error() is None
