"""A step's rollouts fanned out over two real inference worker processes (real Temporal, real S3).

The workers front a scripted OpenAI server and run scripted rollout functions (the task-code seam); the
shards, their retries and the merge are the real activities. Each worker runs one activity at a time
(``--max-concurrent-activities 1``), so the step's shards must be shared between them.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from shard_harness import ShardedRollouts, ShardedStep
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.worker import Worker

from activities.object_store import ObjectStore
from activities.rollout_shards import ShardActivities
from activities.rollouts import pick_scenarios
from schemas.activities import ActivityName, RolloutsInput
from schemas.config import TaskQueues, TaskSpec
from schemas.layout import rollout_shard_key, step_prefix, trajectories_key
from schemas.refs import TrajectoriesRef
from schemas.settings import ENV_HOME, ENV_TASK_MODULES, S3Settings
from workers.launcher import WorkerProcess
from workers.worker import INTERCEPTORS

REPO = Path(__file__).resolve().parents[2]
STUBS_DIR = REPO / "tests" / "activities"
sys.path.insert(0, str(STUBS_DIR))
from openai_stub import openai_stub  # noqa: E402

GROUPS, GROUP_SIZE, PER_SHARD, SEED = 8, 2, 2, 3
SCENARIOS = [{"id": f"s{i}", "x": i, **({"flaky": True} if i == 5 else {})} for i in range(GROUPS)]


@pytest.fixture(scope="module")
def queues() -> TaskQueues:
    suffix = uuid.uuid4().hex[:8]
    return TaskQueues(control=f"fan-control-{suffix}", inference=f"fan-inf-{suffix}", trainer="unused")


@pytest.fixture(scope="module")
def inference_workers(
    stack: Any, queues: TaskQueues, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[WorkerProcess]]:
    with openai_stub() as server, contextlib.ExitStack() as exits:
        workers = []
        for n in (1, 2):
            home = tmp_path_factory.mktemp(f"inference-{n}")
            worker = WorkerProcess(
                "inference",
                home / "worker.log",
                task_queues=queues,
                server_url=server.base_url,
                env={
                    ENV_HOME: str(home),
                    ENV_TASK_MODULES: "rollout_stubs",
                    "PYTHONPATH": os.pathsep.join([str(REPO), str(STUBS_DIR)]),
                },
                cwd=REPO,
                extra_args=["--max-concurrent-activities", "1"],
            )
            worker.spawn()
            exits.callback(worker.stop)
            workers.append(worker)
        for worker in workers:
            worker.wait_ready()
        yield workers


def step_input(run_id: str, step: int) -> RolloutsInput:
    return RolloutsInput(
        run_id=run_id,
        step=step,
        model_name="agent-001",
        task=TaskSpec(rollout="rollout_stubs:flaky", scenarios=SCENARIOS, max_exceptions=0),
        groups_per_step=GROUPS,
        group_size=GROUP_SIZE,
        seed=SEED,
    )


async def shard_attempts(client: Client, workflow_id: str) -> list[tuple[int, int, str]]:
    """(shard, attempt that finished, worker identity) of each rollouts activity, from the history."""
    shard_of: dict[int, int] = {}  # scheduled event id -> shard
    finished = []
    async for event in client.get_workflow_handle(workflow_id).fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == ActivityName.ROLLOUTS:
                shard_of[event.event_id] = json.loads(attrs.input.payloads[0].data)["shard"]
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            started = event.activity_task_started_event_attributes
            if started.scheduled_event_id in shard_of:
                finished.append((shard_of[started.scheduled_event_id], started.attempt, started.identity))
    return sorted(finished)


def rows(store: ObjectStore, ref: TrajectoriesRef) -> list[tuple[Any, ...]]:
    table = pq.read_table(pa.BufferReader(store.get_bytes(ref.ref.uri)))
    groups = json.loads(table.schema.metadata[b"dgrpo.groups"])
    return [
        (kind, g, i, groups[g]["metadata"]["scenario_id"], reward)
        for kind, g, i, reward in zip(
            table.column("kind").to_pylist(),
            table.column("group_index").to_pylist(),
            table.column("trajectory_index").to_pylist(),
            table.column("reward").to_pylist(),
            strict=True,
        )
    ]


async def test_two_inference_workers_share_a_steps_shards_and_a_failed_shard_is_retried_alone(
    client: Client, inference_workers: list[WorkerProcess], queues: TaskQueues, s3_settings: S3Settings
) -> None:
    store = ObjectStore(s3_settings)
    run_id = f"fanout-{uuid.uuid4().hex[:6]}"
    merge = ShardActivities(store).merge_rollouts
    async with Worker(
        client,
        task_queue=queues.control,
        workflows=[ShardedRollouts],
        activities=[merge],
        interceptors=INTERCEPTORS,
    ):
        refs = []
        for step in (1, 2):  # the same scenarios and seed twice
            refs.append(
                await client.execute_workflow(
                    ShardedRollouts.run,
                    ShardedStep(step=step_input(run_id, step), groups_per_shard=PER_SHARD, queues=queues),
                    id=f"{run_id}-{step}",
                    task_queue=queues.control,
                    result_type=TrajectoriesRef,
                )
            )
    first, again = refs
    assert first.ref.uri == store.uri(trajectories_key(run_id, 1))
    assert (first.n_groups, first.n_trajectories, first.n_exceptions) == (GROUPS, GROUPS * GROUP_SIZE, 0)

    # Both workers ran shards; the shard holding the flaky scenario took two attempts, the others one.
    picked = pick_scenarios(len(SCENARIOS), GROUPS, 0, SEED)
    flaky_shard = picked.index(5) // PER_SHARD
    attempts = await shard_attempts(client, f"{run_id}-1")
    assert [(shard, attempt) for shard, attempt, _ in attempts] == [
        (shard, 2 if shard == flaky_shard else 1) for shard in range(GROUPS // PER_SHARD)
    ]
    pids = {str(w.info.pid) for w in inference_workers}
    identities = {identity.partition("@")[0] for _, _, identity in attempts}
    assert identities == pids, (identities, pids)

    # One table: every (group, trajectory) once, groups in the step's scenario order, the same both times.
    merged = rows(store, first)
    assert len(merged) == GROUPS * GROUP_SIZE
    assert len({(g, i) for _, g, i, _, _ in merged}) == len(merged)
    assert [r[3] for r in merged[::GROUP_SIZE]] == [f"s{i}" for i in picked]
    assert [r[4] for r in merged] == [float(i) for i in picked for _ in range(GROUP_SIZE)]
    assert rows(store, again) == merged
    # One object per successful attempt (the failed one wrote nothing), each with its own shard's groups only.
    shard_keys = [k for k in store.list(step_prefix(run_id, 1)) if "/rollouts/" in k]
    assert shard_keys == [
        rollout_shard_key(run_id, 1, k, 2 if k == flaky_shard else 1) for k in range(GROUPS // PER_SHARD)
    ]
    flaky_key = rollout_shard_key(run_id, 1, flaky_shard, attempt=2)
    flaky_table = pq.read_table(pa.BufferReader(store.get_bytes(flaky_key)))
    assert flaky_table.num_rows == PER_SHARD * GROUP_SIZE
