"""`dgrpo train/status/pause/resume/stop` as a user runs them, against a run whose activities are scripted."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import uuid
from pathlib import Path
from typing import Any

from temporalio.client import Client

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "workflows"))
from workflow_stubs import ScriptedActivities

from dgrpo.client import run_control
from schemas.config import RunSpec
from workflows.training_run import TrainingRun

DGRPO = str(Path(sys.executable).parent / "dgrpo")


async def dgrpo(*args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        DGRPO, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode()


def spec_file(tmp_path: Path, task_queue: str, run_id: str, **extra: Any) -> Path:
    data: dict[str, Any] = {
        "run_id": run_id,
        "model": {"name": "agent-001", "base_model": "smollm2-135m-instruct"},
        "task": {"rollout": "examples.arithmetic:rollout", "scenarios": "examples.arithmetic:scenarios"},
        "steps": 3,
        "groups_per_step": 2,
        "group_size": 4,
        "metrics": {"wandb": False},
        "task_queues": {"control": task_queue, "inference": task_queue, "trainer": task_queue},
        **extra,
    }
    path = tmp_path / "run.json"
    path.write_text(json.dumps(data))
    return path


async def test_train_runs_to_the_end_and_status_shows_the_rewards(
    client: Client, task_queue: str, tmp_path: Path
) -> None:
    stubs = ScriptedActivities()
    run_id = f"cli-{uuid.uuid4().hex[:8]}"
    path = spec_file(tmp_path, task_queue, run_id)
    async with contextlib.AsyncExitStack() as stack:
        for worker in stubs.workers(client, task_queue):
            await stack.enter_async_context(worker)
        code, out = await dgrpo("train", str(path), "--set", "steps=2")
        assert code == 0, out
        assert f"{run_id}: step 2/2 served, reward" in out, out  # a pipe gets a line per step, not a bar
        code, status = await dgrpo("status", run_id)
    assert code == 0, status
    assert f"run {run_id} (sync): step 2/2, phase done" in status
    assert "reward per step" in status and stubs.names("train") == [1, 2]


async def test_pause_resume_stop_and_restart_after_terminate(
    client: Client, task_queue: str, tmp_path: Path
) -> None:
    stubs = ScriptedActivities()
    stubs.train_seconds = 0.3
    run_id = f"cli-{uuid.uuid4().hex[:8]}"
    path = spec_file(tmp_path, task_queue, run_id, steps=50)
    async with contextlib.AsyncExitStack() as stack:
        for worker in stubs.workers(client, task_queue):
            await stack.enter_async_context(worker)
        code, out = await dgrpo("train", str(path), "--no-wait")
        assert code == 0 and "started run" in out, out
        code, out = await dgrpo("pause", run_id)
        assert code == 0 and "pauses at the next step boundary" in out, out
        handle = run_control.handle_of(client, run_id)
        for _ in range(100):
            if (await handle.query(TrainingRun.status)).phase == "paused":
                break
            await asyncio.sleep(0.1)
        code, out = await dgrpo("resume", run_id)
        assert code == 0 and out.startswith(f"resumed run {run_id}"), out
        await handle.terminate("simulated crash")
        step_at_crash = max(step for _, step in stubs.published)
        code, out = await dgrpo("resume", run_id)  # restarts from the spec kept in S3
        assert code == 0 and out.startswith(f"restarted run {run_id}"), out
        await asyncio.sleep(1.0)
        code, out = await dgrpo("stop", run_id)
        assert code == 0 and "stops at the next step boundary" in out, out
        final = await client.get_workflow_handle_for(TrainingRun.run, run_id).result()
    assert final.phase == "stopped" and step_at_crash <= final.step < 50
    assert final.history[0].step == step_at_crash + 1  # continued after the newest checkpoint
    published = [step for _, step in stubs.published]
    assert sorted(published) == list(range(final.step + 1))  # no step published twice, none skipped


async def test_resume_of_an_unknown_run_says_so(client: Client) -> None:
    code, out = await dgrpo("resume", f"nope-{uuid.uuid4().hex[:6]}")
    assert code == 2 and "no run" in out


def test_dry_run_prints_the_resolved_spec(tmp_path: Path) -> None:
    path = spec_file(tmp_path, "q", "dry")
    import subprocess

    out = subprocess.run(
        [
            DGRPO,
            "train",
            str(path),
            "--dry-run",
            "--set",
            "train.learning_rate=1e-4",
            "--set",
            "mode=pipelined",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    spec = RunSpec.model_validate_json(out)
    assert spec.train.learning_rate == 1e-4 and spec.mode == "pipelined"
