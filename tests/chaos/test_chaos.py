"""Chaos: a real training run survives ``kill -9`` of every worker kind mid-activity, a Temporal server kill and
restart, and S3 stopped for 30 s, and leaves exactly what an undisturbed run leaves.

Its own stack (it gets killed), a control worker, 2 inference workers (each with its own CPU server) and 2
trainers, all real processes on loopback; SmolLM2-135M at tiny sizes. Faults, in order: the inference worker
running step 1's rollouts and the trainer running step 1's train are killed (each restarted at once, as a
supervisor would); in step 2 the control worker (it holds the workflow; its own activities last under a
second, so it is killed while the rollouts run elsewhere), then Temporal (down 3 s), then the trainer running
train, then S3 (down 20 s, while the retry of train runs); in step 3 the worker running rollouts, and the
control worker again during train. The run's heartbeat timeout is the least a run may set (10 s, not the default
20 s), so each kill costs about 12 s before its retry starts.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from activities.object_store import ObjectStore
from dgrpo.client import run_control
from schemas.config import HEARTBEAT_TIMEOUT_S, RunSpec, TaskQueues
from schemas.layout import MANIFEST_NAME, step_name, trajectories_key
from workers.temporal import connect_client, result_across_restarts

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chaos_cluster import REPO, ChaosCluster, MomentPassed, retry_delays, unless_done, wait_for_phase

pytestmark = pytest.mark.slow

STEPS, GROUPS, GROUP_SIZE = 3, 2, 4
HEARTBEAT_S = 10.0
"""The run's heartbeat timeout: how long a killed worker's activity waits before its retry."""


def chaos_spec(
    run_id: str, queues: TaskQueues, steps: int = STEPS, heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S
) -> RunSpec:
    """The chaos run; bench/chaos.py keeps the default heartbeat timeout, which its figures are about."""
    data = json.loads((REPO / "examples" / "run.json").read_text())
    data.update(run_id=run_id, steps=steps, groups_per_step=GROUPS, group_size=GROUP_SIZE)
    data.update(task_queues=queues.model_dump(), metrics={"wandb": False})
    data.update(heartbeat_timeout_s=heartbeat_timeout_s)
    data["model"]["name"] = run_id
    data["train"] = {"learning_rate": 2e-4}
    return RunSpec.model_validate(data)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ChaosCluster]:
    suffix = uuid.uuid4().hex[:8]
    queues = TaskQueues(
        control=f"ch-control-{suffix}", inference=f"ch-inf-{suffix}", trainer=f"ch-tr-{suffix}"
    )
    cluster = ChaosCluster(tmp_path, queues)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def checkpoint_steps(store: ObjectStore, run_id: str) -> list[str]:
    """The step directories under the run's checkpoints that hold a manifest, one entry per manifest."""
    keys = store.list(f"runs/{run_id}/checkpoints/")
    return sorted(k.split("/")[-2] for k in keys if k.endswith("/" + MANIFEST_NAME))


async def test_a_run_survives_worker_kills_a_temporal_restart_and_an_s3_outage(cluster: ChaosCluster) -> None:
    client = await connect_client(address=cluster.stack.temporal_address)
    spec = chaos_spec(f"chaos-{uuid.uuid4().hex[:6]}", cluster.queues, heartbeat_timeout_s=HEARTBEAT_S)
    handle = await run_control.start_run(client, spec, ObjectStore(cluster.stack.s3_settings))
    result = asyncio.ensure_future(result_across_restarts(handle))

    def kill_running(activity: str) -> Awaitable[object]:
        # An activity lasts about a second at these sizes: strike early in it, or it is over.
        return cluster.kill_worker_running(handle, activity, after_s=0.3)

    async def moment(phase: str, step: int) -> None:
        """Until ``phase`` of ``step``; if the run is already past it, the next strike goes ahead anyway."""
        try:
            await wait_for_phase(handle, phase, step)
        except MomentPassed:
            pass

    faults: list[Callable[[], Awaitable[object]]] = [
        lambda: kill_running("rollouts"),  # step 1: retried on an inference worker
        lambda: kill_running("train"),  # step 1: retried on the other trainer
        lambda: moment("rollouts", step=2),
        lambda: cluster.kill_worker_now("control"),  # it holds the run's workflow
        lambda: cluster.ready("control"),  # polling again before Temporal goes down
        lambda: cluster.kill_server("temporal", down_s=3.0),
        lambda: kill_running("train"),  # step 2: its retry runs into the S3 outage
        lambda: cluster.kill_server("seaweed", down_s=20.0),
        lambda: kill_running("rollouts"),  # step 3
        lambda: moment("train", step=3),
        lambda: cluster.kill_worker_now("control"),
    ]
    try:
        for strike in faults:
            await unless_done(result, strike())
        final = await asyncio.wait_for(result, 900)
    finally:
        result.cancel()  # a failed injection: stop following the run before the stack goes
    assert final.phase == "done" and final.step == STEPS
    assert cluster.dead() == []
    assert [h.step for h in final.history] == list(range(1, STEPS + 1))
    assert all(h.n_trajectories == GROUPS * GROUP_SIZE and h.n_exceptions == 0 for h in final.history)
    kills = [f for f in cluster.faults if f.kind == "kill worker"]
    # Which strikes land depends on timing (a step may end before its strike finds it); every worker kind was
    # killed at least once, mid-activity for inference and trainer, and every killed attempt was retried.
    assert {f.target.split("-")[0] for f in kills} == {"control", "inference", "trainer"}, kills
    mid_activity = [f for f in kills if f.activity_id is not None]
    assert {f.activity for f in mid_activity} >= {"rollouts", "train"}, mid_activity
    delays = await retry_delays(client, spec.run_id, cluster.faults)
    assert len(delays) == len(mid_activity) and all(d is not None for d in delays.values()), delays

    store = ObjectStore(cluster.stack.s3_settings)
    assert checkpoint_steps(store, spec.run_id) == [step_name(s) for s in range(STEPS + 1)]
    latest = store.latest_checkpoint(spec.run_id)
    assert latest is not None and latest.step == STEPS
    for step in range(1, STEPS + 1):
        table = pq.read_table(pa.BufferReader(store.get_bytes(trajectories_key(spec.run_id, step))))
        ids = list(
            zip(
                table.column("group_index").to_pylist(),
                table.column("trajectory_index").to_pylist(),
                strict=True,
            )
        )
        assert len(ids) == GROUPS * GROUP_SIZE and len(set(ids)) == len(ids), (step, ids)
