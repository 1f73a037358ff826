"""Liveness, not just life: a real ``dgrpo worker all`` notices a hung server and a killed trainer child, replaces
them, and the run completes with one checkpoint per step.

A small real TrainingRun (2 steps, SmolLM2-135M on the CPU server). In the first test the worker's server gets
``kill -STOP`` as soon as the run rolls out (a hung engine: its process lives, it answers nothing); in the
second the trainer child gets ``kill -9`` as soon as the run trains. Nothing outside the worker helps: no
supervisor restarts anything, so the run completes only if the worker notices by itself.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from temporalio.client import Client

from activities.object_store import ObjectStore
from dgrpo.client import run_control
from schemas.config import RunSpec, TaskQueues
from schemas.layout import MANIFEST_NAME, checkpoint_prefix
from schemas.run_state import RunStatus
from schemas.settings import S3Settings
from workers.launcher import WorkerProcess
from workers.stack import EmbeddedStack
from workers.temporal import connect_client
from workflows.training_run import TrainingRun

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 600.0
"""Liveness bound only: the run completes within this after the fault, or the fault went unnoticed."""
HEARTBEAT_S = 10.0
"""The runs' heartbeat timeout (the least a run may set): a killed trainer's attempt is retried this long after."""


@pytest.fixture(scope="module")
def queues(shared_queues: TaskQueues) -> TaskQueues:
    return shared_queues


@pytest.fixture(scope="module")
def worker(shared_worker: WorkerProcess) -> Iterator[WorkerProcess]:
    """The session's ``dgrpo worker all`` (tests/conftest.py): it replaces what these tests break, so the
    modules after this one find it whole (the replacements are what is tested here)."""
    try:
        yield shared_worker
    finally:
        for child in children(shared_worker, ""):  # a server a failed test left stopped answers again
            child.send_signal(signal.SIGCONT)


def children(worker: WorkerProcess, marker: str) -> list[psutil.Process]:
    """The worker's live child processes whose command line holds ``marker``."""
    found = []
    for child in psutil.Process(worker.info.pid).children():
        try:
            if marker in " ".join(child.cmdline()) and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


def one_child(worker: WorkerProcess, marker: str) -> psutil.Process:
    found = children(worker, marker)
    assert len(found) == 1, [" ".join(c.cmdline()) for c in found]
    return found[0]


def small_spec(run_id: str, queues: TaskQueues) -> RunSpec:
    data = json.loads((REPO / "examples" / "run.json").read_text())
    data.update(run_id=run_id, steps=2, task_queues=queues.model_dump(), metrics={"wandb": False})
    data.update(heartbeat_timeout_s=HEARTBEAT_S)
    data["model"]["name"] = run_id
    data["train"] = {"learning_rate": 2e-4}
    return RunSpec.model_validate(data)


async def run_with_fault(
    client: Client, spec: RunSpec, phase: str, fault: psutil.Process, sig: int
) -> RunStatus:
    """Start ``spec``, send ``sig`` to ``fault`` once the run is in ``phase`` (first time seen), and return the
    run's final status."""
    handle = await run_control.start_run(client, spec)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while (await handle.query(TrainingRun.status)).phase != phase:
        assert time.monotonic() < deadline, f"the run never reached {phase}"
        await asyncio.sleep(0.2)
    os.kill(fault.pid, sig)
    return await asyncio.wait_for(handle.result(), RUN_TIMEOUT_S)


def assert_one_checkpoint_per_step(s3_settings: S3Settings, final: RunStatus, steps: int) -> None:
    assert final.phase == "done" and final.step == steps, final
    assert [h.step for h in final.history] == list(range(1, steps + 1))
    store = ObjectStore(s3_settings)
    for step in range(steps + 1):
        assert store.exists(checkpoint_prefix(final.run_id, step) + MANIFEST_NAME), f"no checkpoint {step}"
    newest = store.latest_checkpoint(final.run_id)
    assert newest is not None and newest.step == steps


async def test_a_hung_server_is_killed_and_replaced_and_the_run_completes(
    stack: EmbeddedStack, worker: WorkerProcess, queues: TaskQueues, s3_settings: S3Settings
) -> None:
    client = await connect_client(address=stack.temporal_address)
    server = one_child(worker, "serving.server")
    spec = small_spec(f"lv-stop-{uuid.uuid4().hex[:6]}", queues)
    try:
        final = await run_with_fault(client, spec, "rollouts", server, signal.SIGSTOP)
    finally:
        if server.is_running():
            server.send_signal(signal.SIGCONT)
    assert_one_checkpoint_per_step(s3_settings, final, 2)
    assert not server.is_running() or server.status() == psutil.STATUS_ZOMBIE  # killed, not continued
    assert one_child(worker, "serving.server").pid != server.pid
    log = worker.log_path.read_text()
    assert "health probes in a row unanswered" in log and "inference server restarted" in log


async def test_a_killed_trainer_child_is_restarted_and_the_run_completes(
    stack: EmbeddedStack, worker: WorkerProcess, queues: TaskQueues, s3_settings: S3Settings
) -> None:
    client = await connect_client(address=stack.temporal_address)
    trainer = one_child(worker, "worker trainer")
    spec = small_spec(f"lv-kill-{uuid.uuid4().hex[:6]}", queues)
    final = await run_with_fault(client, spec, "train", trainer, signal.SIGKILL)
    assert_one_checkpoint_per_step(s3_settings, final, 2)
    assert one_child(worker, "worker trainer").pid != trainer.pid
    assert "the trainer child exited; starting it again" in worker.log_path.read_text()
