"""TrainingRun's logic on a real Temporal dev server, with scripted activities at the seams."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker
from workflow_stubs import Failure, ScriptedActivities

from schemas.config import RunSpec
from schemas.errors import CONFIG_ERROR, ROLLOUT_FAILED, TASK_IMPORT
from schemas.run_state import RunStatus
from workflows.stages import ROLLOUTS
from workflows.training_run import TrainingRun


def make_spec(task_queue: str, run_id: str, **overrides: Any) -> RunSpec:
    data: dict[str, Any] = {
        "run_id": run_id,
        "model": {"name": "agent-001", "project": "demo", "base_model": "smollm2-135m-instruct"},
        "task": {"rollout": "examples.arithmetic:rollout", "scenarios": "examples.arithmetic:scenarios"},
        "steps": 3,
        "groups_per_step": 2,
        "group_size": 4,
        "task_queues": {"control": task_queue, "inference": task_queue, "trainer": task_queue},
        "metrics": {"wandb": False},
    }
    data.update(overrides)
    return RunSpec.model_validate(data)


@contextlib.asynccontextmanager
async def running(stubs: ScriptedActivities, client: Client, task_queue: str) -> AsyncIterator[None]:
    workers: list[Worker] = stubs.workers(client, task_queue)
    async with contextlib.AsyncExitStack() as stack:
        for worker in workers:
            await stack.enter_async_context(worker)
        yield


async def start(client: Client, spec: RunSpec) -> WorkflowHandle[TrainingRun, RunStatus]:
    return await client.start_workflow(
        TrainingRun.run, spec, id=spec.run_id, task_queue=spec.task_queues.control
    )


async def eventually(check: Callable[[], Awaitable[bool]], within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.1)


async def test_sync_run_orders_the_stages_and_answers_status(client: Client, task_queue: str) -> None:
    stubs = ScriptedActivities()
    stubs.train_gates[2] = asyncio.Event()
    spec = make_spec(task_queue, f"sync-{task_queue}", heartbeat_timeout_s=11)
    async with running(stubs, client, task_queue):
        handle = await start(client, spec)
        await asyncio.wait_for(stubs.train_started[2].wait(), 20)
        during = await handle.query(TrainingRun.status)
        assert (during.step, during.working_on, during.phase) == (1, 2, "train")
        assert during.history[0].step == 1 and during.last_checkpoint is not None
        assert during.last_checkpoint.step == 1 and during.adapter == f"{spec.run_id}@1"
        stubs.train_gates[2].set()
        final = await handle.result()
    assert final.phase == "done" and final.step == 3 and final.adapter == f"{spec.run_id}@3"
    assert [h.step for h in final.history] == [1, 2, 3]
    assert [h.policy_step for h in final.history] == [0, 1, 2]
    assert [h.reward_mean for h in final.history] == pytest.approx([0.0, 0.1, 0.2])
    assert all(h.seconds.get("train") is not None for h in final.history)
    per_step = [name for name, step in stubs.calls if step == 2]
    # Servable first: the adapter goes up and is reloaded; the rest of the checkpoint beside what follows.
    assert per_step[:6] == [
        "rollouts",
        "merge_rollouts",
        "compute_advantages",
        "train",
        "publish_adapter",
        "reload",
    ]
    assert sorted(per_step[6:]) == ["metrics", "publish"]
    # Step 1's rest went up beside step 2's rollouts, and step 2 trained from it once it was resumable.
    assert stubs.calls.index(("publish", 1)) > stubs.calls.index(("reload", 1))
    assert stubs.calls.index(("publish", 1)) < stubs.calls.index(("train", 2))
    assert stubs.train_inputs[2][0].start_from == stubs.checkpoints[spec.run_id][1]
    assert [h.checkpoint for h in final.history] == [stubs.checkpoints[spec.run_id][n] for n in (1, 2, 3)]
    assert [h.adapter_sha256 for h in final.history] == [stubs.adapters[(spec.run_id, n)] for n in (1, 2, 3)]
    assert stubs.names("publish_initial") == [0] and stubs.names("reload")[0] == 0
    assert "judge" not in per_step  # judge.kind == "rollout": the rollout's own reward is the score
    assert [m.metrics["train/reward"] for m in stubs.metrics] == pytest.approx([0.0, 0.1, 0.2])
    assert [m.metrics["offpolicy/policy_age_steps"] for m in stubs.metrics] == [0.0, 0.0, 0.0]
    scheduled = [
        (e.activity_task_scheduled_event_attributes.activity_type.name,
         e.activity_task_scheduled_event_attributes.heartbeat_timeout.ToTimedelta())
        async for e in handle.fetch_history_events()
        if e.HasField("activity_task_scheduled_event_attributes")
    ]  # fmt: skip
    assert {name for name, _ in scheduled} >= {"latest_checkpoint", "publish_initial", *per_step}
    assert {timeout for _, timeout in scheduled} == {timedelta(seconds=11)}  # the run's, at every stage


async def test_metrics_and_retention_run_beside_the_next_step_and_the_run_ends_after_them(
    client: Client, task_queue: str
) -> None:
    stubs = ScriptedActivities()
    stubs.metrics_gates[1], stubs.metrics_gates[3] = asyncio.Event(), asyncio.Event()
    spec = make_spec(task_queue, f"beside-{task_queue}", checkpoints={"keep_last": 2})
    async with running(stubs, client, task_queue):
        handle = await start(client, spec)
        await asyncio.wait_for(stubs.train_started[2].wait(), 20)  # step 1's metrics are still held
        assert stubs.metrics == [] and stubs.retained == []

        async def metrics_held() -> bool:
            status = await handle.query(TrainingRun.status)
            return status.step == 3 and status.phase == "metrics"

        await eventually(metrics_held)  # every step served, their bookkeeping behind step 1's metrics
        assert stubs.retained == []
        stubs.metrics_gates[1].set()
        await eventually(lambda: asyncio.sleep(0, result=[m.step for m in stubs.metrics] == [1, 2]))
        assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
        stubs.metrics_gates[3].set()
        final = await handle.result()
    assert final.phase == "done" and final.step == 3
    bookkeeping = [name for name, _ in stubs.calls if name in ("metrics", "retain_checkpoints")]
    assert bookkeeping == ["metrics", "retain_checkpoints"] * 3  # each step's retention after its metrics
    assert [m.step for m in stubs.metrics] == [1, 2, 3]
    # What retention keeps is the run's when it deletes: step 1's retention, held behind its metrics until step 3
    # was served, keeps from step 3 on (sync mode: the served step; keep_last keeps the newest resumable too).
    assert [(r.protect, r.keep_from) for r in stubs.retained] == [([], 3), ([], 3), ([], 3)]


async def test_judge_and_shared_mode_wrap_training_in_sleep_and_wake(client: Client, task_queue: str) -> None:
    stubs = ScriptedActivities()
    spec = make_spec(task_queue, f"shared-{task_queue}", steps=1, mode="shared", judge={"kind": "ruler"})
    async with running(stubs, client, task_queue):
        final = await (await start(client, spec)).result()
    assert final.step == 1
    names = [name for name, _ in stubs.calls]
    chain = names[names.index("rollouts") : names.index("reload", names.index("rollouts")) + 1]
    assert chain == [
        "rollouts",
        "merge_rollouts",
        "judge",
        "compute_advantages",
        "sleep",
        "train",
        "publish_adapter",
        "wake_up",
        "reload",
    ]
    assert sorted(names[len(chain) + names.index("rollouts") :]) == ["metrics", "publish"]


async def test_pause_resume_and_stop_act_at_step_boundaries(client: Client, task_queue: str) -> None:
    stubs = ScriptedActivities()
    stubs.train_gates[1] = asyncio.Event()
    spec = make_spec(task_queue, f"steer-{task_queue}", steps=10)
    async with running(stubs, client, task_queue):
        handle = await start(client, spec)
        await asyncio.wait_for(stubs.train_started[1].wait(), 20)
        paused = await handle.execute_update(TrainingRun.pause)
        assert paused.paused and paused.working_on == 1  # the step in progress finishes first
        stubs.train_gates[1].set()

        async def is_paused() -> bool:
            return (await handle.query(TrainingRun.status)).phase == "paused"

        await eventually(is_paused)
        await asyncio.sleep(1.0)
        status = await handle.query(TrainingRun.status)
        assert status.step == 1 and stubs.names("train") == [1]  # nothing runs while paused
        await handle.execute_update(TrainingRun.resume)
        await eventually(lambda: asyncio.sleep(0, result=len(stubs.names("train")) >= 2))
        stopping = await handle.execute_update(TrainingRun.stop)
        assert stopping.stopping
        final = await handle.result()
    assert final.phase == "stopped" and 2 <= final.step < 10
    assert stubs.names("train") == list(range(1, final.step + 1))
    assert stubs.names("reload")[-1] == final.step


async def test_continue_as_new_carries_the_run_state(client: Client, task_queue: str) -> None:
    stubs = ScriptedActivities()
    spec = make_spec(task_queue, f"can-{task_queue}", steps=5, continue_as_new_every=2)
    async with running(stubs, client, task_queue):
        handle = await start(client, spec)
        final = await handle.result()
        first = await client.get_workflow_handle(spec.run_id, run_id=handle.result_run_id).describe()
    assert first.status == WorkflowExecutionStatus.CONTINUED_AS_NEW
    assert final.step == 5 and [h.step for h in final.history] == [1, 2, 3, 4, 5]
    assert stubs.names("latest_checkpoint") == [-1]  # recovery runs once, the state is carried
    assert stubs.names("train") == [1, 2, 3, 4, 5]
    # Step 3's rollouts ran beside step 2's optimizer state going up, in the execution that continued as new
    # carrying them (each step rolled out once).
    assert stubs.names("rollouts") == [1, 2, 3, 4, 5]
    scheduled = [
        (
            e.activity_task_scheduled_event_attributes.activity_type.name,
            json.loads(e.user_metadata.summary.data),
        )
        async for e in client.get_workflow_handle(
            spec.run_id, run_id=handle.result_run_id
        ).fetch_history_events()
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    assert scheduled[-2:] == [("rollouts", "step 3 shard 1/1"), ("merge_rollouts", "step 3")]
    assert ("publish", "step 2") in scheduled


async def test_pipelined_rolls_out_ahead_and_keeps_fresh_groups(client: Client, task_queue: str) -> None:
    stubs = ScriptedActivities()
    stubs.train_gates[1] = asyncio.Event()
    spec = make_spec(task_queue, f"pipe-{task_queue}", mode="pipelined", max_staleness=1)
    async with running(stubs, client, task_queue):
        handle = await start(client, spec)
        await asyncio.wait_for(stubs.train_started[1].wait(), 20)
        await eventually(lambda: asyncio.sleep(0, result=2 in stubs.rollout_policies))
        assert stubs.names("publish") == []  # step 2's rollouts started while step 1 trains
        stubs.train_gates[1].set()
        final = await handle.result()
    assert final.step == 3 and final.dropped_stale_groups == 0
    assert dict(stubs.rollout_policies) == {1: [0], 2: [0], 3: [1]}
    assert [h.policy_step for h in final.history] == [0, 0, 1]


async def test_pipelined_on_a_shared_device_is_refused_at_start(client: Client, task_queue: str) -> None:
    stubs = ScriptedActivities()
    data = make_spec(task_queue, f"refuse-{task_queue}").model_dump()
    data.update(mode="pipelined", shared_device=True)
    async with running(stubs, client, task_queue):
        handle = await client.start_workflow("TrainingRun", data, id=data["run_id"], task_queue=task_queue)
        with pytest.raises(WorkflowFailureError) as err:
            await asyncio.wait_for(handle.result(), 20)
    assert "pipelined" in str(err.value.cause) and "shared_device" in str(err.value.cause)
    assert stubs.calls == []


async def test_resume_after_terminate_continues_from_the_last_checkpoint(
    client: Client, task_queue: str
) -> None:
    stubs = ScriptedActivities()
    stubs.train_gates[3] = asyncio.Event()
    spec = make_spec(task_queue, f"resume-{task_queue}", steps=4)
    async with running(stubs, client, task_queue):
        handle = await start(client, spec)
        await asyncio.wait_for(stubs.train_started[3].wait(), 20)
        await handle.terminate("simulated crash")
        stubs.train_gates[3].set()
        final = await (await start(client, spec)).result()
    assert final.step == 4 and [h.step for h in final.history] == [3, 4]
    assert stubs.names("train") == [1, 2, 3, 3, 4]  # step 3 was in flight when terminated
    assert sorted(step for _, step in stubs.published) == [0, 1, 2, 3, 4]  # nothing published twice
    assert stubs.names("publish_initial") == [0]
    assert stubs.names("reload") == [0, 1, 2, 2, 3, 4]  # the restart serves checkpoint 2 again first


async def test_a_failing_rollout_fails_the_run_naming_function_and_scenario(
    client: Client, task_queue: str
) -> None:
    stubs = ScriptedActivities()
    message = "rollout examples.arithmetic:rollout raised on scenario 3 ({'a': 1}): ZeroDivisionError"
    stubs.rollout_failure = Failure(message, ROLLOUT_FAILED)
    spec = make_spec(task_queue, f"fail-{task_queue}")
    async with running(stubs, client, task_queue):
        handle = await start(client, spec)
        with pytest.raises(WorkflowFailureError) as err:
            await handle.result()
        status = await handle.query(TrainingRun.status)
    cause = err.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == ROLLOUT_FAILED
    assert "step 1: rollouts failed" in cause.message and "examples.arithmetic:rollout" in cause.message
    assert "scenario 3" in cause.message and status.error == cause.message
    assert len(stubs.names("rollouts")) == ROLLOUTS.max_attempts  # retried, then given up


async def test_a_task_that_does_not_import_fails_at_once(client: Client, task_queue: str) -> None:
    stubs = ScriptedActivities()
    stubs.rollout_failure = Failure(
        "cannot import 'examples.nope:rollout': No module named 'examples.nope'", TASK_IMPORT, True
    )
    spec = make_spec(task_queue, f"import-{task_queue}")
    async with running(stubs, client, task_queue):
        with pytest.raises(WorkflowFailureError) as err:
            await (await start(client, spec)).result()
    cause = err.value.cause
    assert (
        isinstance(cause, ApplicationError) and cause.type == TASK_IMPORT and "examples.nope" in cause.message
    )
    assert stubs.names("rollouts") == [1]


async def test_a_step_without_learning_signal_is_rolled_out_again(client: Client, task_queue: str) -> None:
    stubs = ScriptedActivities(no_signal={2: 1})
    spec = make_spec(task_queue, f"flat-{task_queue}", steps=2)
    async with running(stubs, client, task_queue):
        final = await (await start(client, spec)).result()
    assert final.step == 2 and [h.resampled for h in final.history] == [0, 1]
    seeds = stubs.rollout_seeds[2]
    assert len(seeds) == 2 and seeds[0] != seeds[1]  # other scenarios the second time
    assert stubs.names("train") == [1, 2]


async def test_a_run_that_never_finds_learning_signal_fails_clearly(client: Client, task_queue: str) -> None:
    stubs = ScriptedActivities(no_signal={1: 99})
    spec = make_spec(task_queue, f"never-{task_queue}", steps=1)
    async with running(stubs, client, task_queue):
        with pytest.raises(WorkflowFailureError) as err:
            await (await start(client, spec)).result()
    assert "no learning signal" in str(err.value.cause) and "group_size" in str(err.value.cause)
    assert len(stubs.names("rollouts")) == 4 and stubs.names("train") == []


async def test_shared_mode_wakes_the_server_when_training_fails(client: Client, task_queue: str) -> None:
    stubs = ScriptedActivities()
    stubs.train_failure = Failure("the adapter does not fit this trainer", CONFIG_ERROR, non_retryable=True)
    spec = make_spec(task_queue, f"shared-fail-{task_queue}", steps=1, mode="shared")
    async with running(stubs, client, task_queue):
        with pytest.raises(WorkflowFailureError) as err:
            await (await start(client, spec)).result()
    names = [name for name, _ in stubs.calls]
    assert names[names.index("sleep") :] == ["sleep", "train", "wake_up"]
    cause = err.value.cause
    assert isinstance(cause, ApplicationError) and "train failed" in cause.message
    assert "does not fit this trainer" in cause.message
