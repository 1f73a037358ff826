"""TrainStep (ART-style ``model.train``) with scripted activities at the seams."""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from datetime import timedelta
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.worker import UnsandboxedWorkflowRunner
from workflow_stubs import ScriptedActivities

from schemas.errors import CONFIG_ERROR
from schemas.refs import ObjectRef, TrajectoriesRef
from schemas.run_state import TrainStepInput
from workflows import servable
from workflows.stages import PUBLISH_ADAPTER
from workflows.train_step import TrainStep


def step_input(task_queue: str, run_id: str, step: int, **extra: Any) -> TrainStepInput:
    trajectories = TrajectoriesRef(
        ref=ObjectRef(uri=f"s3://stub/runs/{run_id}/uploads/{step}.parquet", size=1, sha256="0" * 64),
        run_id=run_id,
        step=step,
        n_groups=2,
        n_trajectories=8,
    )
    return TrainStepInput(
        run_id=run_id,
        model={"name": "agent-001", "base_model": "smollm2-135m-instruct"},  # type: ignore[arg-type]
        trajectories=trajectories,
        step=step,
        task_queues={"control": task_queue, "inference": task_queue, "trainer": task_queue},  # type: ignore[arg-type]
        **extra,
    )


@contextlib.asynccontextmanager
async def workers(stubs: ScriptedActivities, client: Client, task_queue: str):  # type: ignore[no-untyped-def]
    async with contextlib.AsyncExitStack() as stack:
        for worker in stubs.workers(client, task_queue):
            await stack.enter_async_context(worker)
        yield


async def run_step(client: Client, inp: TrainStepInput, workflow_id: str) -> Any:
    return await client.execute_workflow(
        TrainStep.run, inp, id=workflow_id, task_queue=inp.task_queues.control
    )


async def test_train_step_trains_publishes_serves_and_is_idempotent(client: Client, task_queue: str) -> None:
    stubs = ScriptedActivities()
    run_id = f"art-{uuid.uuid4().hex[:8]}"
    async with workers(stubs, client, task_queue):
        first = await run_step(client, step_input(task_queue, run_id, 1), f"{run_id}-1")
        again = await run_step(client, step_input(task_queue, run_id, 1), f"{run_id}-1-retry")
        second = await run_step(client, step_input(task_queue, run_id, 2), f"{run_id}-2")
        with pytest.raises(WorkflowFailureError) as err:
            await run_step(client, step_input(task_queue, run_id, 4), f"{run_id}-4")
    assert (first.step, first.adapter, first.skipped) == (1, f"{run_id}@1", False)
    assert again.skipped and again.checkpoint == first.checkpoint  # a retried call does not train twice
    assert second.checkpoint.step == 2 and second.loss == pytest.approx(0.5)
    assert stubs.names("train") == [1, 2] and stubs.names("reload") == [1, 1, 2]
    cause = err.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == CONFIG_ERROR
    assert "newest checkpoint is step 2" in cause.message and "train step 3 next" in cause.message


async def test_a_step_without_learning_signal_advances_untrained_when_asked(
    client: Client, task_queue: str
) -> None:
    # ART >= 0.4.4: every group's rewards equal -> nothing trained, the step still advances.
    stubs = ScriptedActivities(no_signal={1: 1, 3: 1, 4: 1})
    run_id = f"flat-{uuid.uuid4().hex[:8]}"
    async with workers(stubs, client, task_queue):
        # Step 1 of a fresh LoRA has no checkpoint 0 yet (step 0 is served as the base model).
        flat = await run_step(
            client, step_input(task_queue, run_id, 1, advance_without_signal=True), f"{run_id}-1"
        )
        await run_step(client, step_input(task_queue, run_id, 2), f"{run_id}-2")
        flat_again = await run_step(
            client, step_input(task_queue, run_id, 3, advance_without_signal=True), f"{run_id}-3"
        )
        with pytest.raises(WorkflowFailureError) as err:  # a caller that does not ask still fails
            await run_step(client, step_input(task_queue, run_id, 4), f"{run_id}-4")
    assert (flat.step, flat.adapter, flat.trained, flat.loss) == (1, f"{run_id}@1", False, None)
    assert (flat_again.step, flat_again.trained, flat_again.n_groups_zero_variance) == (3, False, 2)
    assert stubs.names("publish_initial") == [0] and stubs.names("republish") == [1, 3]
    assert stubs.names("train") == [2] and stubs.names("reload") == [1, 2, 3]
    assert "no learning signal" in str(err.value.cause)


async def test_a_trainer_that_vanished_before_publishing_means_training_again(
    client: Client, task_queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Unsandboxed, so the shortened schedule-to-start deadline of publish reaches the workflow code.
    quick = timedelta(seconds=2)
    monkeypatch.setattr(
        servable, "PUBLISH_ADAPTER", dataclasses.replace(PUBLISH_ADAPTER, schedule_to_start=quick)
    )
    stubs = ScriptedActivities(lost_workers=1)
    async with contextlib.AsyncExitStack() as stack:
        for worker in stubs.workers(client, task_queue, workflow_runner=UnsandboxedWorkflowRunner()):
            await stack.enter_async_context(worker)
        result = await run_step(client, step_input(task_queue, f"lost-{task_queue}", 1), f"lost-{task_queue}")
    assert result.checkpoint.step == 1
    # The publish_adapter sent to the vanished trainer never started; the second training's did.
    assert stubs.names("train") == [1, 1] and stubs.names("publish_adapter") == [1]
    assert stubs.names("publish") == [1] and stubs.names("reload") == [1]


@pytest.mark.parametrize("same", [False, True], ids=["another-adapter", "same-adapter"])
async def test_a_trainer_lost_after_serving_its_adapter_means_training_again_and_serving_that(
    client: Client, task_queue: str, same: bool
) -> None:
    """Served, not resumable: the step is trained again from the checkpoint before it, published whole and
    served; ``model.train`` returns once the step is resumable, with the adapter the servers now hold."""
    stubs = ScriptedActivities(lost_after_adapter={1}, same_adapter_when_trained_again=same)
    run_id = f"lost-after-{task_queue}"
    async with workers(stubs, client, task_queue):
        result = await run_step(client, step_input(task_queue, run_id, 1), run_id)
    assert stubs.names("train") == [1, 1] and stubs.names("reload") == [1, 1]
    assert [t.start_from for t in stubs.train_inputs[1]] == [None, None]  # both from the fresh adapter
    assert result.checkpoint == stubs.checkpoints[run_id][1]
    assert result.adapter_sha256 == stubs.adapters[(run_id, 1)] == stubs.served[(run_id, 1)]
    (_, first), (_, second) = stubs.reloaded
    assert second == result.adapter_sha256 and (first == second) == same


async def test_a_hostile_run_id_fails_the_workflow_at_once_and_runs_no_activity(
    client: Client, task_queue: str
) -> None:
    stubs = ScriptedActivities()
    good = step_input(task_queue, "run-ok", 1).model_dump(mode="json")
    async with workers(stubs, client, task_queue):
        for run_id in ("../../etc", "/abs/path", "a/b"):
            hostile = {**good, "run_id": run_id}
            with pytest.raises(WorkflowFailureError) as err:
                await client.execute_workflow(
                    "TrainStep", hostile, id=f"hostile-{uuid.uuid4().hex[:8]}", task_queue=task_queue,
                    execution_timeout=timedelta(seconds=60),
                )  # fmt: skip
            assert "run_id" in str(err.value.cause) and "pattern" in str(err.value.cause)
    assert stubs.calls == []
