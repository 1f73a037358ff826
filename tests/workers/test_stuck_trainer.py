"""A training whose compute thread hangs gets a fresh trainer process for its retry, so the retry is bounded as
the first attempt was (issue 45: the retry used to wait, heartbeating, behind the hung thread for hours).

A real standalone ``dgrpo worker trainer`` (tests/workers/stuck_trainer.py: its micro-batch never returns, the only
planted thing) with a micro-batch bound of a few seconds: its attempt fails as ``Stalled`` once the micro-batch is
past its bound, the worker stops polling and exits 75 for its supervisor; the test then plays the supervisor (a
Kubernetes or compose restart policy) and starts a healthy process with the same worker id, which trains the retry.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle
from temporalio.common import RetryPolicy
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities import sft
from activities.object_store import ObjectStore
from host.processes import ChildProcess
from schemas import layout
from schemas.activities import ActivityName, SftConfig, SftInput
from schemas.config import LoraConfig, ModelSpec, TaskQueues
from schemas.settings import ENV_HOME, ENV_STAGE_BOUNDS
from workers.keep_trainer import EXIT_TRAINER_STUCK
from workers.stack import EmbeddedStack
from workers.temporal import connect_client

REPO = Path(__file__).resolve().parents[2]
MICRO_BATCH_BOUND_S = 10
"""Far above a healthy micro-batch of one short example here, even on a loaded machine."""
LEAVES_WITHIN_S = 180.0
"""Liveness bound only: a stuck trainer leaves within its start, its model load, the bound and its grace."""


@workflow.defn(sandboxed=False)
class FineTuneOnce:
    """One ``train_sft`` with retries, as a step's training is called."""

    @workflow.run
    async def run(self, queue: str, inp: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = await workflow.execute_activity(
            ActivityName.TRAIN_SFT,
            inp,
            task_queue=queue,
            start_to_close_timeout=timedelta(minutes=10),
            heartbeat_timeout=timedelta(seconds=10),
            retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=3),
        )
        return result


def trainer(queues: TaskQueues, home: Path, name: str, stuck: bool) -> ChildProcess:
    """``dgrpo worker trainer`` (worker id ``stuck-trainer``, as a supervisor restarts it), ready once it polls."""
    ready = home / f"{name}.ready"
    argv = [
        sys.executable,
        "-m",
        "tests.workers.stuck_trainer",
        "worker",
        "trainer",
        "--ready-file",
        str(ready),
    ]
    argv += ["--control-queue", queues.control, "--inference-queue", queues.inference]
    argv += ["--trainer-queue", queues.trainer, "--worker-id", "stuck-trainer", "--grace-s", "1"]
    env = {**os.environ, "PYTHONPATH": str(REPO), ENV_HOME: str(home)}
    env[ENV_STAGE_BOUNDS] = f"micro_batch={MICRO_BATCH_BOUND_S}"
    env.pop("DGRPO_TEST_STUCK", None)
    if stuck:
        env["DGRPO_TEST_STUCK"] = "1"
    process = ChildProcess(argv, home / f"{name}.log", name=f"trainer {name}", env=env, cwd=REPO)
    process.spawn()
    process.wait_until(ready.exists, 300)
    return process


def exit_code_within(process: ChildProcess, seconds: float) -> int | None:
    deadline = time.monotonic() + seconds
    while process.exit_code() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    return process.exit_code()


async def started_attempts(handle: WorkflowHandle[Any, Any]) -> list[Any]:
    return [
        e.activity_task_started_event_attributes
        async for e in handle.fetch_history_events()
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
    ]


async def test_a_trainer_whose_micro_batch_hangs_leaves_and_its_retry_trains_on_a_fresh_one(
    stack: EmbeddedStack, tmp_path: Path
) -> None:
    suffix = uuid.uuid4().hex[:8]
    queues = TaskQueues(control=f"st-c-{suffix}", inference=f"st-i-{suffix}", trainer=f"st-t-{suffix}")
    store = ObjectStore.from_env()
    chat = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."}]
    examples = store.put_bytes(
        layout.sft_examples_key(f"st-{suffix}", 1), sft.example_line(chat, None).encode()
    )
    inp = SftInput(
        run_id=f"st-{suffix}", step=1, examples=examples,
        model=ModelSpec(name="m", base_model="smollm2-135m-instruct", lora=LoraConfig(rank=2, alpha=4)),
        sft=SftConfig(learning_rates=[1e-4], batch_size=1, micro_batch_size=1),
    )  # fmt: skip
    client = await connect_client(address=stack.temporal_address)
    stuck = await asyncio.to_thread(trainer, queues, tmp_path, "first", True)
    fresh: ChildProcess | None = None
    try:
        async with Worker(client, task_queue=queues.control, workflows=[FineTuneOnce],
                          workflow_runner=UnsandboxedWorkflowRunner()):  # fmt: skip
            handle = await client.start_workflow(
                FineTuneOnce.run, args=[queues.trainer, inp.model_dump(mode="json")],
                id=f"stuck-{suffix}", task_queue=queues.control,
            )  # fmt: skip
            # in a thread: the test's workflow worker runs on this loop
            code = await asyncio.to_thread(exit_code_within, stuck, LEAVES_WITHIN_S)
            log = stuck.log_tail(20_000)
            assert code == EXIT_TRAINER_STUCK, (
                f"the stuck trainer did not leave (exit code {code}):\n{log[-3000:]}"
            )
            assert "compute thread is stuck" in log and "stage 'micro_batch'" in log, log[-3000:]
            fresh = await asyncio.to_thread(
                trainer, queues, tmp_path, "fresh", False
            )  # its supervisor's restart
            result = await handle.result()
        assert result["n_examples"] == 1 and result["worker_id"] == "stuck-trainer"
        attempts = await started_attempts(handle)
        assert [a.attempt for a in attempts] == [2], "the retry is the second attempt, and the last"
        failure = attempts[0].last_failure
        assert failure.application_failure_info.type == "Stalled", failure
        assert "compute thread is stuck" in failure.message and "micro_batch" in failure.message, (
            failure.message
        )
    finally:
        for process in (stuck, fresh):
            if process is not None:
                process.stop(30)
