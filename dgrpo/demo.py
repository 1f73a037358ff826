"""``dgrpo demo``: a real GRPO run of SmolLM2-135M on an example task, on this machine, in minutes.

Starts (or reuses) the embedded stack, starts ``dgrpo worker all`` on queues of its own, runs
``TrainingRun`` with a live progress bar, and ends with the reward per step and where things are.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from dgrpo import run_control
from dgrpo.progress import RunProgress, history_table
from schemas.config import RunSpec, TaskQueues
from schemas.layout import checkpoints_prefix, reward_curve_key
from schemas.run_state import RunStatus
from schemas.settings import dgrpo_home
from workers.launcher import WorkerProcess
from workers.stack import EmbeddedStack
from workers.temporal import connect_client

log = logging.getLogger(__name__)

# Sized for ~10 minutes on 2 CPU cores; the arithmetic reward gives partial credit, so every group
# has variance from step 1 and lr 2e-4 on a rank-16 LoRA moves the 135M model within a few steps.
DEMO_TASKS: dict[str, dict[str, Any]] = {
    "arithmetic": {
        "task": {"rollout": "examples.arithmetic:rollout", "scenarios": "examples.arithmetic:scenarios"},
        "steps": 10,
        "groups_per_step": 4,
        "group_size": 8,
        "train": {"learning_rate": 2e-4, "micro_batch_size": 16},
    },
    "tool_agent": {
        "task": {"rollout": "examples.tool_agent:rollout", "scenarios": "examples.tool_agent:scenarios"},
        "steps": 8,
        "groups_per_step": 4,
        "group_size": 6,
        "train": {"learning_rate": 2e-4, "micro_batch_size": 8},
    },
}


def demo_spec(task: str, steps: int | None, run_id: str) -> RunSpec:
    preset = dict(DEMO_TASKS[task])
    if steps is not None:
        preset["steps"] = steps
    suffix = run_id[:80]
    return RunSpec.model_validate(
        {
            "run_id": run_id,
            "model": {"name": f"demo-{task}", "project": "dgrpo-demo", "base_model": "smollm2-135m-instruct"},
            "mode": "sync",
            "metrics": {"wandb": False},
            # Queues of its own: the demo's workers never pick up another run's work, nor the reverse.
            "task_queues": {
                "control": f"demo-control-{suffix}",
                "inference": f"demo-inference-{suffix}",
                "trainer": f"demo-trainer-{suffix}",
            },
            **preset,
        }
    )


async def _train(spec: RunSpec, console: Console) -> RunStatus:
    client = await connect_client()
    handle = await run_control.start_run(client, spec)
    with RunProgress(console) as bar:
        return await run_control.watch(handle, bar.update, interval=1.0)


def run_demo(args: argparse.Namespace) -> int:
    console = Console()
    home = Path(args.home or dgrpo_home())
    run_id = args.run_id or f"demo-{args.task}-{time.strftime('%Y%m%d-%H%M%S')}"
    spec = demo_spec(args.task, args.steps, run_id)
    started = time.monotonic()
    stack = EmbeddedStack(home)
    reused = stack.load_state() is not None
    state = stack.start()
    os.environ.update(stack.env())
    console.print(f"{'reusing' if reused else 'started'} the embedded stack in {home}")
    queues: TaskQueues = spec.task_queues
    worker = WorkerProcess(
        "all", home / "logs" / f"{run_id}-workers.log", task_queues=queues, env=stack.env()
    )
    console.print(f"starting the workers (log: {worker.log_path}); loading SmolLM2-135M ...")
    worker.start()
    try:
        console.print(
            f"training {spec.model.name} on {spec.task.rollout}: {spec.steps} steps x "
            f"{spec.groups_per_step} groups x {spec.group_size} rollouts, lr {spec.train.learning_rate}"
        )
        final = asyncio.run(_train(spec, console))
    finally:
        worker.stop()
    curve = home / "runs" / run_id / "reward_curve.png"
    console.print(history_table(final))
    first, last = final.history[0], final.history[-1]
    console.print(
        f"reward {first.reward_mean:.3f} at step {first.step} -> {last.reward_mean:.3f} at step {last.step} "
        f"in {time.monotonic() - started:.0f}s"
    )
    bucket = stack.s3_settings.bucket
    console.print(f"reward curve:  {curve} (and s3://{bucket}/{reward_curve_key(run_id)})")
    console.print(
        f"checkpoints:   s3://{bucket}/{checkpoints_prefix(run_id)} (S3 at http://{state.s3_endpoint})"
    )
    console.print(f"Temporal UI:   {state.ui_url or '(headless)'}  (workflow id {run_id})")
    console.print("the stack keeps running for you to look around; stop it with `dgrpo down`")
    return 0
