"""examples/art_style.py end to end on the CPU: real stack, real workers, real SmolLM2-135M.

One story on one stack (the real model is slow here, so every step counts):

1. the script, with a ``LocalBackend`` of its own, trains step 1 and is SIGKILLed in the middle of
   ``model.train`` for step 2; the workers it started finish step 2 anyway;
2. the same script runs against ``TemporalBackend`` pointed at that (now separately running) stack and
   its workers; in this process, a ``TemporalBackend`` checks the name/base-model conflict and
   ``delete_checkpoints``;
3. rerun with ``LocalBackend``: it adopts the orphaned workers, continues at step 3 (step 2 is not trained
   again), and stops the stack and the workers when it ends;
4. a ``LocalBackend`` in this process restarts it all (a fresh server: register serves step 3 again) and
   shows one checkpoint and one ``TrainStep`` run per step.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from pathlib import Path

import psutil
import pytest
from example_runner import run_example, spawn_example, tail
from temporalio.client import Client, WorkflowExecutionStatus

import dgrpo
from activities.retention import complete_checkpoint_steps, metrics_by_step
from dgrpo.model import run_id_of
from schemas import layout
from schemas.run_state import TrainStepResult
from workers.stack import EmbeddedStack

pytestmark = pytest.mark.slow

PROJECT = "art-style"  # the example's default project
RUN_ID = run_id_of(PROJECT, "art")  # art--style-art: each "-" of the project doubled


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


async def wait_running(client: Client, workflow_id: str, script: subprocess.Popen[bytes], log: Path) -> None:
    for _ in range(1200):
        if script.poll() is not None:
            raise AssertionError(f"the script ended before {workflow_id} ran:\n{tail(log)}")
        try:
            if (
                await client.get_workflow_handle(workflow_id).describe()
            ).status == WorkflowExecutionStatus.RUNNING:
                return
        except Exception:  # not started yet (or the stack is still starting)
            pass
        await asyncio.sleep(0.5)
    raise AssertionError(f"{workflow_id} never started:\n{tail(log)}")


async def wait_for_stack(home: Path, script: subprocess.Popen[bytes], log: Path) -> EmbeddedStack:
    stack = EmbeddedStack(home)
    for _ in range(600):
        if stack.load_state() is not None:
            return stack
        assert script.poll() is None, tail(log)
        await asyncio.sleep(0.5)
    raise AssertionError(f"the script's stack never came up:\n{tail(log)}")


async def test_art_style_killed_mid_train_then_temporal_backend_then_rerun(tmp_path: Path) -> None:
    home = tmp_path / "home"
    try:
        await art_style_story(tmp_path, home)
    finally:
        dgrpo.LocalBackend(path=home).stop_all()  # whatever a failure left running


async def art_style_story(tmp_path: Path, home: Path) -> None:
    local = ["--path", str(home), "--name", "art"]
    run_id = RUN_ID

    # 1. Step 1 trains; the client dies in the middle of model.train for step 2.
    log = tmp_path / "first.log"
    script = spawn_example("--steps", "3", *local, log=log)
    try:
        stack = await wait_for_stack(home, script, log)
        client = await dgrpo.TemporalBackend(address=stack.temporal_address).temporal_client()
        step2 = client.get_workflow_handle(f"train-{RUN_ID}-000002", result_type=TrainStepResult)
        await wait_running(client, step2.id, script, log)
        script.send_signal(signal.SIGKILL)
    finally:
        script.kill()
        script.wait()
    assert "step 1: reward" in tail(log, 100_000), tail(log)
    result = await asyncio.wait_for(step2.result(), timeout=600)
    assert (result.step, result.adapter, result.skipped) == (2, f"{run_id}@2", False)

    # 2. The same script against TemporalBackend: that stack and its workers, started separately.
    inference_url = dgrpo.LocalBackend(path=home).inference_url()
    remote = run_example(
        "--backend", "temporal", "--address", stack.temporal_address, "--inference-url", inference_url,
        "--steps", "1", "--name", "remote", extra_env=stack.env(),
    )  # fmt: skip
    assert remote.returncode == 0, output(remote)
    assert "step 1: reward" in remote.stdout and "is at step 1" in remote.stdout, output(remote)

    backend = dgrpo.TemporalBackend(
        address=stack.temporal_address, inference_url=inference_url, s3=stack.s3_settings
    )
    store = backend.object_store()
    assert store.checkpoint_steps(run_id) == [1, 2]
    other_base = dgrpo.TrainableModel(
        name="art", project=PROJECT, base_model="HuggingFaceTB/SmolLM2-360M-Instruct"
    )
    with pytest.raises(
        dgrpo.ModelConflictError, match="already registered with base_model='smollm2-135m-instruct'"
    ):
        await other_base.register(backend)
    model = dgrpo.TrainableModel(name="art", project=PROJECT)
    await model.register(backend)
    assert await model.get_step() == 2
    rewards = {s: m["train/reward"] for s, m in metrics_by_step(store, run_id).items() if "train/reward" in m}
    assert set(rewards) == {1, 2}, "train() records the step's rewards before it trains"
    best = max(rewards, key=lambda s: (rewards[s], s))
    deleted = await model.delete_checkpoints(best_checkpoint_metric="train/reward", keep_last=1)
    kept = sorted({2, best})
    assert (complete_checkpoint_steps(store, run_id), deleted) == (kept, [s for s in (1, 2) if s not in kept])
    for step in deleted:
        assert store.list(layout.checkpoint_prefix(run_id, step)) == [], "a deleted checkpoint leaves no file"

    # 3. Rerun: continues at step 3 on the adopted workers, then stops everything it now owns.
    rerun = run_example("--steps", "3", *local)
    assert rerun.returncode == 0, output(rerun)
    assert "art: step 2, training to step 3" in rerun.stdout, output(rerun)
    # Step 3 trains, or (its 2 x 4 rollouts all scoring alike, more likely as the model learns) is skipped,
    # which still advances to step 3 as in ART >= 0.4.4; either way step 2 is not trained again.
    trained = "step 3: reward" in rerun.stdout
    skipped = "step 3: every group's rewards were equal; nothing trained, skipped" in rerun.stdout
    assert trained != skipped and "step 2: reward" not in rerun.stdout, output(rerun)
    assert EmbeddedStack(home).load_state() is None
    assert processes_of(home) == []

    # 4. A LocalBackend here: a fresh server, so register serves the newest checkpoint again; nothing
    #    was trained twice (one checkpoint and one TrainStep run per step); close() stops it all and
    #    gives back the environment it pointed at its stack.
    env_before = dict(os.environ)
    async with dgrpo.LocalBackend(path=home) as again:
        model = dgrpo.TrainableModel(name="art", project=PROJECT)
        await model.register(again)
        assert (await model.get_step(), model.get_inference_name()) == (3, f"{RUN_ID}@3")
        client = await again.temporal_client()
        for step in (1, 2, 3):
            runs = [w async for w in client.list_workflows(f'WorkflowId = "train-{RUN_ID}-{step:06d}"')]
            assert len(runs) == 1, f"step {step} ran {len(runs)} times"
        assert complete_checkpoint_steps(again.object_store(), run_id) == [*kept, 3]
        assert os.environ["DGRPO_TEMPORAL_ADDRESS"] == again.stack.temporal_address
    assert processes_of(home) == []
    assert dict(os.environ) == env_before
