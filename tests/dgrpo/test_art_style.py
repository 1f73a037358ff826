"""examples/art_style.py end to end on the CPU: real stack, real workers, real SmolLM2-135M.

- 3 steps with a LocalBackend of its own, which stops everything it started when the script ends;
- the client SIGKILLed in the middle of ``model.train``: the step still completes, and a rerun
  continues at the next step without a second run of the killed step's workflow;
- the same script against ``TemporalBackend`` (the session's stack and workers, started separately);
- the user errors that need a stack, and ``delete_checkpoints``.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
from pathlib import Path

import psutil
import pytest
from example_runner import run_example, spawn_example, tail
from temporalio.api.enums.v1 import WorkflowExecutionStatus
from temporalio.client import Client
from temporalio.service import RPCError

import dgrpo
from dgrpo.metrics import read_metrics
from workers.stack import EmbeddedStack

pytestmark = pytest.mark.slow

PROJECT = "art-style"  # the example's default project


def output(proc: subprocess.CompletedProcess[str]) -> str:
    return f"exit {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-6000:]}"


def processes_of(home: Path) -> list[str]:
    """Processes still running from ``home``: the stack's servers (by argv) or workers (by DGRPO_HOME)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
            if str(home) in cmdline or proc.environ().get("DGRPO_HOME") == str(home):
                found.append(f"{proc.pid}: {cmdline[:200]}")
        except psutil.Error:
            continue
    return found


def test_three_steps_with_a_local_backend_of_its_own(tmp_path: Path) -> None:
    home = tmp_path / "home"
    proc = run_example("--steps", "3", "--path", str(home), "--name", "local-3", timeout=600)
    assert proc.returncode == 0, output(proc)
    for step in (1, 2, 3):
        assert f"step {step}: reward" in proc.stdout, output(proc)
    assert "is at step 3" in proc.stdout, output(proc)
    # It started the stack and the workers, so it stopped them.
    assert EmbeddedStack(home).load_state() is None
    assert processes_of(home) == []


async def test_client_killed_mid_train_the_step_completes_and_a_rerun_continues(
    local_backend: dgrpo.LocalBackend, tmp_path: Path
) -> None:
    name = "killed"
    run_id = f"{PROJECT}-{name}"
    args = ["--steps", "1", "--path", str(local_backend.path), "--name", name]
    client = await local_backend.temporal_client()
    handle = client.get_workflow_handle(f"train-{PROJECT}-{name}-000001")
    log = tmp_path / "killed.log"
    script = spawn_example(*args, log=log)
    try:
        await wait_running(client, handle.id, script, log)
        script.send_signal(signal.SIGKILL)  # a crash in the middle of model.train
    finally:
        script.kill()
        script.wait()
    result = await asyncio.wait_for(handle.result(), timeout=300)
    assert result.step == 1
    store = local_backend.object_store()
    assert store.checkpoint_steps(run_id) == [1]
    assert store.is_complete(f"runs/{run_id}/checkpoints/000001/")

    rerun = run_example("--steps", "2", "--path", str(local_backend.path), "--name", name)
    assert rerun.returncode == 0, output(rerun)
    assert "step 1, training to step 2" in rerun.stdout, output(rerun)
    assert "step 2: reward" in rerun.stdout and "step 1: reward" not in rerun.stdout, output(rerun)
    assert store.checkpoint_steps(run_id) == [1, 2]
    runs = [w async for w in client.list_workflows(f'WorkflowId = "{handle.id}"')]
    assert len(runs) == 1, "the killed client's step was trained once, by one workflow run"

    # delete_checkpoints keeps the newest and the best by a metric that train recorded per step.
    model = dgrpo.TrainableModel(name=name, project=PROJECT)
    await model.register(local_backend)
    assert await model.get_step() == 2
    rewards = {s: m["train/reward"] for s, m in read_metrics(store, run_id).items() if "train/reward" in m}
    assert set(rewards) == {1, 2}
    deleted = await model.delete_checkpoints(best_checkpoint_metric="train/reward", keep_last=1)
    best = max(rewards, key=lambda s: (rewards[s], s))
    assert store.checkpoint_steps(run_id) == sorted({2, best})
    assert deleted == [s for s in (1, 2) if s not in {2, best}]


async def wait_running(client: Client, workflow_id: str, script: subprocess.Popen[bytes], log: Path) -> None:
    running = WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_RUNNING
    for _ in range(600):
        if script.poll() is not None:
            raise AssertionError(f"the script ended before training:\n{tail(log)}")
        try:
            described = await client.get_workflow_handle(workflow_id).describe()
            if described.raw_description.workflow_execution_info.status == running:
                return
        except RPCError:
            pass
        await asyncio.sleep(0.5)
    raise AssertionError(f"{workflow_id} never started")


async def test_same_script_against_a_temporal_backend(local_backend: dgrpo.LocalBackend) -> None:
    proc = run_example(
        "--backend",
        "temporal",
        "--address",
        local_backend.stack.temporal_address,
        "--inference-url",
        local_backend.inference_url(),
        "--steps",
        "1",
        "--name",
        "remote",
    )
    assert proc.returncode == 0, output(proc)
    assert "step 1: reward" in proc.stdout, output(proc)
    assert local_backend.object_store().checkpoint_steps(f"{PROJECT}-remote") == [1]


async def test_a_name_registered_with_another_base_model(local_backend: dgrpo.LocalBackend) -> None:
    first = dgrpo.TrainableModel(name="taken", project="errors", base_model="smollm2-135m-instruct")
    await first.register(local_backend)
    assert await first.get_step() == 0
    other = dgrpo.TrainableModel(
        name="taken", project="errors", base_model="HuggingFaceTB/SmolLM2-360M-Instruct"
    )
    with pytest.raises(
        dgrpo.ModelConflictError, match=r"already registered with base_model='smollm2-135m-instruct'"
    ):
        await other.register(local_backend)
