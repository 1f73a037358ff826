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
from temporalio.client import WorkflowFailureError

from dgrpo.cli.progress import RunProgress, history_table
from dgrpo.client import run_control
from schemas.config import RunSpec, TaskQueues, load_run_spec
from schemas.errors import EngineSetupError
from schemas.layout import checkpoints_prefix, reward_curve_key
from schemas.run_state import RunStatus
from schemas.settings import ENV_HOME, EngineSettings, default_engine, dgrpo_home
from serving.launchers import lora_rank_flag, probe_vllm_runtime, vllm_python
from workers.launcher import WorkerProcess
from workers.stack import EmbeddedStack
from workers.temporal import connect_client

log = logging.getLogger(__name__)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DEMO_TASKS: dict[str, Path] = {
    "arithmetic": EXAMPLES / "run.toml",
    "tool_agent": EXAMPLES / "tool_agent.toml",
}
"""Each demo task's run spec: the example's own TOML (sized by its author to show the reward rise)."""


def demo_spec(task: str, steps: int | None, run_id: str, engine: str = "cpu") -> RunSpec:
    suffix = run_id[:80]
    overrides: dict[str, Any] = {
        "run_id": run_id,
        "metrics.wandb": False,
        "serving.engine": engine,
        # Queues of its own: the demo's workers never pick up another run's work, nor the reverse.
        "task_queues.control": f"demo-control-{suffix}",
        "task_queues.inference": f"demo-inference-{suffix}",
        "task_queues.trainer": f"demo-trainer-{suffix}",
    }
    if steps is not None:
        overrides["steps"] = steps
    return load_run_spec(DEMO_TASKS[task], overrides)


def engine_flags(spec: RunSpec, engine: str) -> list[str]:
    """The demo's engine, sized to its run: vLLM keeps every adapter in buffers of ``--max-lora-rank``, and its
    CPU build gathers a token's whole buffer per layer, so a rank-64 engine serving the demo's rank-16 adapter
    does 4x the work (its steps then outlast the rollouts' deadline)."""
    if engine != "vllm":
        return ["--engine", engine]
    return ["--engine", engine, "--max-lora-rank", str(lora_rank_flag(spec.model.lora.rank))]


async def _train(spec: RunSpec, console: Console) -> RunStatus:
    client = await connect_client()
    handle = await run_control.start_run(client, spec)
    with RunProgress(console) as bar:
        return await run_control.watch(handle, bar.update, interval=1.0)


def run_demo(args: argparse.Namespace) -> int:
    console = Console()
    home = Path(args.home or dgrpo_home())
    run_id = args.run_id or f"demo-{args.task}-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        engine = getattr(args, "engine", None) or default_engine()
    except EngineSetupError as err:
        console.print(f"[red]dgrpo demo:[/red] {err}")
        return 2
    if engine == "vllm":  # said now, not after the stack and the workers started
        try:
            runtime = probe_vllm_runtime(vllm_python(EngineSettings(engine="vllm")))
        except EngineSetupError as err:
            console.print(f"[red]dgrpo demo --engine vllm:[/red] {err}")
            return 2
        console.print(f"serving with vLLM {runtime.version} from {runtime.python}")
    spec = demo_spec(args.task, args.steps, run_id, engine)
    started = time.monotonic()
    stack = EmbeddedStack(home)
    reused = stack.load_state() is not None
    state = stack.start()
    os.environ.update(stack.env())
    console.print(f"{'reusing' if reused else 'started'} the embedded stack in {home}")
    queues: TaskQueues = spec.task_queues
    env = {**stack.env(), ENV_HOME: str(home)}  # the metrics activity draws the curve under $DGRPO_HOME/runs
    worker = WorkerProcess(
        "all",
        home / "logs" / f"{run_id}-workers.log",
        task_queues=queues,
        env=env,
        extra_args=engine_flags(spec, engine),
        die_with_parent=True,  # a demo killed (SIGTERM, SIGKILL) takes its workers and their engine with it
    )
    console.print(f"starting the workers (log: {worker.log_path}); loading SmolLM2-135M ...")
    worker.start()
    try:
        console.print(
            f"training {spec.model.name} on {spec.task.rollout}: {spec.steps} steps x "
            f"{spec.groups_per_step} groups x {spec.group_size} rollouts, lr {spec.train.learning_rate}"
        )
        final = asyncio.run(_train(spec, console))
    except WorkflowFailureError as err:
        console.print(f"[red]the demo run failed:[/red] {err.cause}\n(workers' log: {worker.log_path})")
        return 1
    finally:
        worker.stop()
    curve = home / "runs" / run_id / "reward_curve.png"
    console.print(history_table(final))
    rewards = [(h.step, h.reward_mean) for h in final.history if h.reward_mean is not None]
    if rewards:
        (first_step, first), (last_step, last) = rewards[0], rewards[-1]
        console.print(
            f"reward {first:.3f} at step {first_step} -> {last:.3f} at step {last_step}, "
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
