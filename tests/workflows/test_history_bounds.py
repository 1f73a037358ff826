"""RunSpec's bounds hold what they claim: the largest allowed runs, played on the real Temporal dev server with
scripted activities at the seams and every resample taken, record histories under the estimates of
``schemas/history_bounds.py``, and those under a fifth of Temporal's limits; one more is refused."""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError
from test_training_run_logic import make_spec, running, start
from workflow_stubs import ScriptedActivities

from dgrpo.client import run_control
from schemas.config import RunSpec, parse_run_spec
from schemas.errors import CONFIG_ERROR, RunSpecError
from schemas.history_bounds import (
    HISTORY_BYTES_BUDGET,
    HISTORY_EVENTS_BUDGET,
    MAX_INLINE_SCENARIOS_BYTES,
    MAX_SHARDS_PER_STEP,
    RESAMPLES_WITHOUT_SIGNAL,
    run_history_bytes,
    run_history_events,
)

# The worst a step can do in these stubs: judged (one more activity per round), shared (sleep and wake),
# retention on, and every resample taken.
WORST = {"judge": {"kind": "ruler"}, "mode": "shared", "checkpoints": {"keep_last": 1}}


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
    events_bound = run_history_events(MAX_SHARDS_PER_STEP, every)
    bytes_bound = run_history_bytes(MAX_SHARDS_PER_STEP, every, 0, len(spec.model_dump_json()))
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
    bytes_bound = run_history_bytes(groups, 1, MAX_INLINE_SCENARIOS_BYTES, len(spec.model_dump_json()))
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
