"""`dgrpo worker`: a control worker runs TrainingRun from the command line and stops cleanly on SIGTERM."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from pydantic import ValidationError
from temporalio.client import Client

from dgrpo.cli import build_parser
from dgrpo.cli.worker import worker_options
from schemas.config import TaskQueues
from schemas.settings import (
    ENV_HOME,
    ENV_TEMPORAL_WAIT_S,
    ENV_WORKER_GRACE_S,
    EngineSettings,
    WorkerLifecycle,
)
from workers.launcher import WorkerProcess
from workers.stack import EmbeddedStack
from workers.temporal import connect_client


async def test_a_control_worker_polls_and_shuts_down_gracefully(stack: EmbeddedStack, tmp_path: Path) -> None:
    suffix = uuid.uuid4().hex[:8]
    queues = TaskQueues(control=f"w-control-{suffix}", inference=f"w-inf-{suffix}", trainer=f"w-tr-{suffix}")
    worker = WorkerProcess(
        "control", tmp_path / "control.log", task_queues=queues, env={ENV_HOME: str(tmp_path)}
    )
    worker.start(timeout=120)
    client: Client = await connect_client(address=stack.temporal_address)
    # A run whose spec names a task that cannot run still shows the workflow is served here: it reaches
    # its first activity (on the inference queue, where nobody polls) and answers the status query.
    run_id = f"w-{suffix}"
    spec = {
        "run_id": run_id,
        "model": {"name": "m", "base_model": "smollm2-135m-instruct"},
        "task": {"rollout": "examples.arithmetic:rollout", "scenarios": "examples.arithmetic:scenarios"},
        "steps": 1,
        "groups_per_step": 1,
        "group_size": 2,
        "task_queues": queues.model_dump(),
    }
    handle = await client.start_workflow("TrainingRun", spec, id=run_id, task_queue=queues.control)
    status = await handle.query("status")
    assert status["run_id"] == run_id and status["phase"] == "starting"
    await handle.terminate("test over")
    assert worker.stop(timeout=30) == 0
    assert "shutting down control worker" in worker.log_path.read_text()


def test_the_engine_flags_become_the_inference_workers_engine_settings() -> None:
    flags = "--engine vllm --max-lora-rank 32 --max-loras 6 --sleep-mode --dtype bf16 --gpu-memory-utilization 0.5"
    args = build_parser().parse_args(["worker", "inference", *flags.split()])
    assert worker_options(args).engine == EngineSettings(
        engine="vllm",
        max_lora_rank=32,
        max_loras=6,
        sleep_mode=True,
        dtype="bf16",
        gpu_memory_utilization=0.5,
    )
    defaults = worker_options(build_parser().parse_args(["worker", "inference"])).engine
    assert defaults == EngineSettings() and defaults.can_sleep and not EngineSettings(engine="vllm").can_sleep
    for flag, parser in (("llama3_json", "llama3_json"), ("", None)):
        args = build_parser().parse_args(["worker", "inference", "--tool-call-parser", flag])
        assert worker_options(args).engine.tool_call_parser == parser


def test_max_concurrent_activities_is_a_whole_number_of_one_or_more(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parse = build_parser().parse_args
    two = worker_options(parse(["worker", "inference", "--max-concurrent-activities", "2"]))
    assert two.max_concurrent_activities == 2
    assert worker_options(parse(["worker", "inference"])).max_concurrent_activities is None  # Temporal's
    with pytest.raises(SystemExit):
        parse(["worker", "inference", "--max-concurrent-activities", "0"])
    assert "--max-concurrent-activities: 0 is less than 1" in capsys.readouterr().err


def test_grace_and_temporal_wait_come_from_flags_else_variables_else_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENV_WORKER_GRACE_S, "7")
    monkeypatch.setenv(ENV_TEMPORAL_WAIT_S, "90")
    args = build_parser().parse_args(["worker", "trainer", "--temporal-wait-s", "30"])
    assert worker_options(args).lifecycle == WorkerLifecycle(grace_s=7, temporal_wait_s=30)
    monkeypatch.delenv(ENV_WORKER_GRACE_S)
    monkeypatch.delenv(ENV_TEMPORAL_WAIT_S)
    assert worker_options(build_parser().parse_args(["worker", "trainer"])).lifecycle == WorkerLifecycle()
    with pytest.raises(ValidationError, match="grace_s"):
        worker_options(build_parser().parse_args(["worker", "trainer", "--grace-s", "-1"]))
