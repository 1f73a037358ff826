"""Whole GRPO steps on this CPU: TRL's ``GRPOTrainer`` (fp32, bf16) vs durable-grpo's demo run, one command.

Same task and settings on every side: the demo's arithmetic task (examples/arithmetic.py: its prompt, its
reward), SmolLM2-135M-Instruct, LoRA r16/a32 on all linear projections, lr 2e-4, 4 prompts x 8
completions per step, 16 new tokens, temperature 1; seconds per step are the median of steps 2..N.

- ``dgrpo``: ``TrainingRun`` with examples/run.toml on a private embedded stack and a ``dgrpo worker all``
  process, as ``dgrpo demo --steps N`` runs it (durable: every phase an activity, checkpoints in S3).
  A step: from step n-1 served to step n served.
- ``trl-fp32`` / ``trl-bf16``: TRL 1.16 ``GRPOTrainer`` (its defaults otherwise: loss ``dapo``, beta 0,
  gradient checkpointing on), per-device batch 8 x 4 accumulation = one generation of 32 per step, in a
  child process that imports TRL from ``.bench/trl``. A step: one optimizer step, generation included.

TRL is not a dependency of this project: the first run installs it (``--no-deps``, with only the
packages the project's venv lacks) into ``.bench/trl`` (ignored by git); the venv's torch and
transformers are the ones TRL runs on.

    PYTHONPATH=$PWD python bench/vs_trl.py [--steps 7] [--sides dgrpo,trl-fp32,trl-bf16] [--gpu]

``--gpu``: the same on one CUDA device: dgrpo's worker serves with vLLM (bf16, sleep mode off, 0.3 of the
GPU) and trains with torch + peft on CUDA; TRL trains on CUDA and generates with HF ``generate`` (its vLLM
modes need a vLLM release TRL supports). On a machine with no network, pre-install TRL's wheels into
``.bench/trl`` (``pip install --no-index --no-deps --target .bench/trl ...``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TRL_DIR = ROOT / ".bench" / "trl"
TRL_PACKAGES = ["trl==1.16.0", "datasets==5.2.0", "dill", "multiprocess", "pandas"]
"""TRL and what it needs that the project's venv lacks (installed with --no-deps: torch stays the venv's)."""
SIDES = ("dgrpo", "trl-fp32", "trl-bf16")


def ensure_trl() -> None:
    if (TRL_DIR / "trl").is_dir():
        return
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(TRL_DIR)]
    print("installing TRL into", TRL_DIR, flush=True)
    subprocess.run([*cmd, *TRL_PACKAGES], check=True)


# --- TRL side (runs in a child process with .bench/trl on its path) ---------------------------------


def trl_dataset(steps: int, seed: int) -> list[dict[str, Any]]:
    """The prompts our runs see, in our order (the scenario picks of steps 1..steps)."""
    from activities.rollouts import pick_scenarios
    from examples.arithmetic import prompt, scenarios

    pool = scenarios()
    rows = []
    for step in range(1, steps + 1):
        for i in pick_scenarios(len(pool), 4, (step - 1) * 4, seed):
            rows.append({"prompt": prompt(pool[i]), "answer": pool[i]["answer"]})
    return rows


GPU_WORKER_FLAGS = ["--engine", "vllm", "--dtype", "bf16", "--max-lora-rank", "16"]
GPU_WORKER_FLAGS += ["--gpu-memory-utilization", "0.3"]  # the trainer shares the GPU
"""``--gpu``: the worker's engine flags (tests/gpu/test_training_run_vllm.py's, without sleep mode)."""


def run_trl(precision: str, steps: int, seed: int, out: Path, gpu: bool = False) -> None:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from base_models.resolve import resolve_base_model
    from examples.arithmetic import MAX_TOKENS, score_answer

    path = resolve_base_model("smollm2-135m-instruct").base_path

    def reward(completions: list[Any], answer: list[int], **_: Any) -> list[float]:
        return [score_answer(c[0]["content"], a).reward for c, a in zip(completions, answer, strict=True)]

    class Clock(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.ends: list[float] = [time.perf_counter()]
            self.rewards: list[float] = []

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.ends.append(time.perf_counter())

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            if logs and "reward" in logs:
                self.rewards.append(float(logs["reward"]))

    config = GRPOConfig(
        output_dir=str(out.parent / f"trl-{precision}"),
        use_cpu=not gpu,
        bf16=precision == "bf16",
        learning_rate=2e-4,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=4,
        num_generations=8,
        max_completion_length=MAX_TOKENS,
        temperature=1.0,
        max_steps=steps,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        shuffle_dataset=False,
        seed=seed,
    )
    clock = Clock()
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
        reward_funcs=[reward],
        args=config,
        train_dataset=Dataset.from_list(trl_dataset(steps, seed)),
        processing_class=AutoTokenizer.from_pretrained(path),
        peft_config=LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM"),
        callbacks=[clock],
    )
    trainer.train()
    if gpu:
        torch.cuda.synchronize()
    step_s = [b - a for a, b in zip(clock.ends, clock.ends[1:], strict=False)]
    out.write_text(
        json.dumps({"step_s": step_s, "rewards": clock.rewards, "threads": torch.get_num_threads()})
    )


def trl_side(precision: str, steps: int, seed: int, out_dir: Path, gpu: bool) -> dict[str, Any]:
    ensure_trl()
    out = out_dir / f"trl-{precision}.json"
    path = os.pathsep.join(p for p in (str(TRL_DIR), str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    cmd = [sys.executable, __file__, "--trl-child", precision, "--steps", str(steps), "--seed", str(seed)]
    cmd += ["--gpu"] if gpu else []
    subprocess.run([*cmd, "--child-out", str(out)], check=True, env=env, cwd=ROOT)
    return dict(json.loads(out.read_text()))


# --- dgrpo side ----------------------------------------------------------------------------------


async def dgrpo_side(steps: int, seed: int, home: Path, gpu: bool) -> dict[str, Any]:
    from bench.bench_stack import demo_run_spec, timed_run
    from schemas.config import TaskQueues
    from workers.launcher import WorkerProcess
    from workers.temporal import connect_client

    tag = uuid.uuid4().hex[:6]
    queues = TaskQueues(
        control=f"vt-control-{tag}", inference=f"vt-inference-{tag}", trainer=f"vt-trainer-{tag}"
    )
    flags = GPU_WORKER_FLAGS if gpu else []
    worker = WorkerProcess("all", home / "logs" / "vs-trl-workers.log", task_queues=queues, extra_args=flags)
    worker.start()
    try:
        run = await timed_run(
            await connect_client(),
            demo_run_spec(
                f"vs-trl-{tag}", steps, queues, seed=seed, **({"serving.engine": "vllm"} if gpu else {})
            ),
        )
    finally:
        worker.stop()
    assert run.status is not None
    seconds = run.step_seconds()
    rewards = {h.step: h.reward_mean for h in run.status.history}
    phases = {h.step: h.seconds for h in run.status.history}
    return {
        "step_s": [seconds[n] for n in sorted(seconds)],
        "rewards": [rewards.get(n) for n in sorted(seconds)],
        "phase_s": [phases.get(n, {}) for n in sorted(seconds)],
    }


def report(results: dict[str, Any], steps: int) -> str:
    from bench.bench_stack import command_line, median

    meds = {side: median(r["step_s"][1:]) for side, r in results["sides"].items()}
    trl = [meds[s] for s in meds if s.startswith("trl")]
    base = max(trl) if trl else meds["dgrpo"]
    lines = [
        f"Whole GRPO steps, arithmetic demo task (4x8, 16 tokens, LoRA r16), median of steps 2..{steps}",
        "",
        "| trainer | s / step | ratio (to TRL's slowest) |",
        "|---|---:|---:|",
    ]
    for side, m in meds.items():
        lines.append(f"| {side} | {m:.1f} | {m / base:.2f} |")
    if trl:
        lines += ["", f"dgrpo / TRL's best configuration: {meds.get('dgrpo', float('nan')) / min(trl):.2f}"]
    if "dgrpo" in results["sides"]:
        phase_s = results["sides"]["dgrpo"]["phase_s"][1:]
        names = sorted({name for p in phase_s for name in p})
        lines += ["", f"dgrpo's phases, median seconds of steps 2..{steps}:", ""]
        lines += ["| " + " | ".join(names) + " |", "|" + "---:|" * len(names)]
        lines.append(
            "| " + " | ".join(f"{median([p.get(n, 0.0) for p in phase_s]):.2f}" for n in names) + " |"
        )
    lines += ["", "Mean reward per step (the samples each step trains on)", ""]
    sides = list(results["sides"])
    lines += ["| step | " + " | ".join(sides) + " |", "|---|" + "---:|" * len(sides)]
    for i in range(steps):
        cells = []
        for side in sides:
            rewards = results["sides"][side]["rewards"]
            value = rewards[i] if i < len(rewards) else None
            cells.append("" if value is None else f"{value:.3f}")
        lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    lines += ["", f"command: {command_line()}"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sides", default=",".join(SIDES), help=f"comma-separated, of {', '.join(SIDES)}")
    parser.add_argument("--gpu", action="store_true", help="both sides on one CUDA device (see above)")
    parser.add_argument("--trl-child", choices=["fp32", "bf16"], help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trl_child:
        run_trl(args.trl_child, args.steps, args.seed, args.child_out, args.gpu)
        return
    from bench.bench_stack import OUT, command_line, private_stack, write_results

    OUT.mkdir(exist_ok=True)
    results: dict[str, Any] = {"steps": args.steps, "command": command_line(), "gpu": args.gpu, "sides": {}}
    for side in args.sides.split(","):
        print(f"{side}: {args.steps} steps ...", flush=True)
        if side == "dgrpo":
            with private_stack() as (_stack, home):
                results["sides"][side] = asyncio.run(dgrpo_side(args.steps, args.seed, home, args.gpu))
        else:
            precision = side.removeprefix("trl-")
            results["sides"][side] = trl_side(precision, args.steps, args.seed, OUT, args.gpu)
        print(f"  step seconds: {[round(s, 1) for s in results['sides'][side]['step_s']]}", flush=True)
    write_results("vs_trl_gpu" if args.gpu else "vs_trl", results, report(results, args.steps))


if __name__ == "__main__":
    main()
