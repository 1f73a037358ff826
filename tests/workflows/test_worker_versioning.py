"""Upgrading the workers while a run is in flight (Temporal's Worker Versioning, on the real dev server): workers
of build A run a TrainingRun; workers of build B start, B becomes the deployment's current version, A drains and
its workers stop. The run ends on B with every step trained, published and logged once, and a new run lands on
B. Scripted activities at the seams; the workflows are those a versioned control worker registers."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

from temporalio.api.deployment.v1 import WorkerDeploymentVersion
from temporalio.api.enums.v1 import VersionDrainageStatus
from temporalio.api.workflowservice.v1 import (
    DescribeWorkerDeploymentVersionRequest,
    SetWorkerDeploymentCurrentVersionRequest,
)
from temporalio.client import Client
from temporalio.service import RPCError
from temporalio.worker import Worker
from workflow_stubs import WORKER_ID, ScriptedActivities

from schemas.config import RunSpec
from schemas.layout import worker_task_queue
from schemas.settings import WorkerDeployment
from workers.temporal import connect_client
from workers.worker import WorkerOptions, deployment_config, interceptors
from workflows.training_run import TrainingRun
from workflows.versioned import VERSIONED_WORKFLOWS


def spec(run_id: str, queue: str, **overrides: Any) -> RunSpec:
    data: dict[str, Any] = {
        "run_id": run_id,
        "model": {"name": run_id, "base_model": "smollm2-135m-instruct"},
        "task": {"rollout": "examples.arithmetic:rollout", "scenarios": "examples.arithmetic:scenarios"},
        "steps": 4,
        "groups_per_step": 2,
        "group_size": 2,
        "continue_as_new_every": 2,
        "task_queues": {"control": queue, "inference": queue, "trainer": queue},
        "metrics": {"wandb": False},
    }
    return RunSpec.model_validate({**data, **overrides})


@contextlib.asynccontextmanager
async def build(
    stubs: ScriptedActivities, client: Client, queue: str, deployment: WorkerDeployment
) -> AsyncIterator[None]:
    """One build's workers, with a client of their own as another process's would have: every stage on
    ``queue``, versioned; the trainer's own queue unversioned."""
    client = await connect_client(address=client.service_client.config.target_host)
    everything = [
        stubs.latest_checkpoint, stubs.publish_initial, stubs.rollouts, stubs.merge_rollouts, stubs.judge,
        stubs.compute_advantages, stubs.train, stubs.reload, stubs.metrics_activity, stubs.retain_checkpoints,
    ]  # fmt: skip
    identity = f"build-{deployment.build_id}"
    workers = [
        Worker(client, task_queue=queue, workflows=VERSIONED_WORKFLOWS, activities=everything, identity=identity,
               interceptors=interceptors(WorkerOptions()), deployment_config=deployment_config(deployment)),
        Worker(client, task_queue=worker_task_queue(queue, WORKER_ID),
               activities=[stubs.publish, stubs.publish_adapter], identity=identity,
               interceptors=interceptors(WorkerOptions())),
    ]  # fmt: skip
    async with contextlib.AsyncExitStack() as stack:
        for worker in workers:
            await stack.enter_async_context(worker)
        yield


async def make_current(client: Client, deployment: WorkerDeployment) -> None:
    """What ``temporal worker deployment set-current-version`` does, once the server has seen the build poll."""
    request = SetWorkerDeploymentCurrentVersionRequest(
        namespace=client.namespace, deployment_name=deployment.name, build_id=deployment.build_id
    )
    for _ in range(100):
        try:
            await client.workflow_service.set_worker_deployment_current_version(request)
            return
        except RPCError:  # the version is not registered until its workers have polled
            await asyncio.sleep(0.2)
    raise AssertionError(f"{deployment} never became current")


async def drained(client: Client, deployment: WorkerDeployment) -> None:
    """Wait until no pinned workflow needs ``deployment``'s build (its workers may stop)."""
    version = WorkerDeploymentVersion(deployment_name=deployment.name, build_id=deployment.build_id)
    request = DescribeWorkerDeploymentVersionRequest(namespace=client.namespace, deployment_version=version)
    for _ in range(120):
        info = (
            await client.workflow_service.describe_worker_deployment_version(request)
        ).worker_deployment_version_info
        if info.drainage_info.status == VersionDrainageStatus.VERSION_DRAINAGE_STATUS_DRAINED:
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"build {deployment.build_id} never drained")


async def identities(client: Client, run_id: str) -> list[list[tuple[str, str]]]:
    """Per execution of the run (oldest first): (what, worker identity) of each task a worker started."""
    executions = [e async for e in client.list_workflows(f"WorkflowId = '{run_id}'")]
    out = []
    for execution in sorted(executions, key=lambda e: e.start_time):
        history = await client.get_workflow_handle(run_id, run_id=execution.run_id).fetch_history()
        scheduled = {e.event_id: e.activity_task_scheduled_event_attributes.activity_type.name for e in history.events
                     if e.HasField("activity_task_scheduled_event_attributes")}  # fmt: skip
        started = []
        for e in history.events:
            if e.HasField("workflow_task_started_event_attributes"):
                started.append(("workflow task", e.workflow_task_started_event_attributes.identity))
            if e.HasField("activity_task_started_event_attributes"):
                a = e.activity_task_started_event_attributes
                started.append((scheduled[a.scheduled_event_id], a.identity))
        out.append(started)
    return out


async def test_a_run_in_flight_moves_to_the_new_build_and_the_old_one_drains(
    client: Client, task_queue: str
) -> None:
    name = f"dgrpo-{uuid.uuid4().hex[:8]}"
    a, b = WorkerDeployment(name=name, build_id="A"), WorkerDeployment(name=name, build_id="B")
    stubs = ScriptedActivities()
    stubs.train_gates[1] = asyncio.Event()
    run, fresh = spec(f"moving-{task_queue}", task_queue), spec(f"fresh-{task_queue}", task_queue, steps=1)
    async with build(stubs, client, task_queue, b):
        async with build(stubs, client, task_queue, a):
            await make_current(client, a)
            handle = await client.start_workflow(TrainingRun.run, run, id=run.run_id, task_queue=task_queue)
            await asyncio.wait_for(stubs.train_started[1].wait(), 30)  # step 1 trains on build A
            await make_current(client, b)
            fresh_handle = await client.start_workflow(
                TrainingRun.run, fresh, id=fresh.run_id, task_queue=task_queue
            )
            stubs.train_gates[1].set()
            await drained(client, a)
        # build A's workers have stopped
        final = await handle.result()
        await fresh_handle.result()
    assert final.step == 4 and [h.step for h in final.history] == [1, 2, 3, 4]
    published = [step for run_id, step in stubs.published if run_id == run.run_id]
    assert published == [0, 1, 2, 3, 4]  # each checkpoint once: nothing lost, nothing doubled
    assert sorted(step for name, step in stubs.calls if name == "train") == [1, 1, 2, 3, 4]
    assert [m.step for m in stubs.metrics if m.run_id == run.run_id] == [1, 2, 3, 4]
    first, *later = await identities(client, run.run_id)
    assert len(later) == 1  # continued as new after step 2
    assert ("train", "build-A") in first  # in flight on A when B became current...
    after_train = first[[what for what, _ in first].index("train") + 1 :]
    assert ("reload", "build-B") in after_train  # ...it went on on B in the same execution
    # publish goes to the trainer that holds the step, on its own unversioned queue: whichever build that is
    pinned = ("publish", "publish_adapter")
    assert {who for what, who in [s for execution in later for s in execution] if what not in pinned} == {
        "build-B"
    }
    [fresh_tasks] = await identities(client, fresh.run_id)
    assert {who for what, who in fresh_tasks if what not in pinned} == {"build-B"}  # new runs land on B
