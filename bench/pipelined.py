"""Pipelined vs sync ``TrainingRun``: a SIMULATION of dedicated devices, and the real demo on this CPU.

``--simulate`` (the default part): the real ``TrainingRun`` workflow on a real Temporal dev server and a
real worker, with the activities at its seams replaced by the scripted ones the workflow tests use
(tests/workflows/workflow_stubs.py, registered under the same ActivityName): rollouts hold a simulated
inference device for ``R`` seconds and train a simulated trainer device for ``T`` seconds (asyncio sleeps,
so the two never contend, as two GPUs would not); everything else returns at once. Steady-state step time
(steps 3..N, from step n-1 served to step n served) is compared with max(R, T), which is what a perfect
pipeline reaches, and with R + T, what sync mode cannot beat.

``--real``: the demo (examples/run.toml, SmolLM2-135M on ``dgrpo worker all``) in sync and pipelined mode,
alternated; on one shared CPU the two phases contend for the same cores (shared through host/cpu_share.py),
so it shows whether pipelining costs or saves time here, with the mean phases of each run.

    PYTHONPATH=$PWD python bench/pipelined.py [--steps 8] [--scale 1] [--real --real-steps 3 --rounds 1]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import uuid
from pathlib import Path
from typing import Any

from bench.bench_stack import (
    TimedRun,
    command_line,
    demo_run_spec,
    median,
    private_stack,
    timed_run,
    write_results,
)
from schemas.config import TaskQueues
from workers.launcher import WorkerProcess
from workers.temporal import connect_client

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "workflows"))
from workflow_stubs import ScriptedActivities  # the workflow tests' seam stubs

CASES = [(2.0, 2.0), (3.0, 1.5), (1.5, 3.0)]
"""(rollout seconds, train seconds) per simulated step."""


def steady_steps(run: TimedRun, first: int = 3) -> list[float]:
    """Step seconds from step ``first`` on (a pipeline fills during steps 1-2)."""
    return [s for n, s in run.step_seconds().items() if n >= first]


async def simulate(steps: int, scale: float) -> list[dict[str, Any]]:
    client = await connect_client()
    rows = []
    for rollout_s, train_s in ((r * scale, t * scale) for r, t in CASES):
        row: dict[str, Any] = {"rollout_s": rollout_s, "train_s": train_s}
        for mode in ("sync", "pipelined"):
            stubs = ScriptedActivities(rollout_seconds=rollout_s, train_seconds=train_s)
            queue = f"bench-sim-{uuid.uuid4().hex[:8]}"
            spec = demo_run_spec(
                f"bench-sim-{mode}-{uuid.uuid4().hex[:6]}", steps, TaskQueues(control=queue, inference=queue,
                trainer=queue), mode=mode,
            )  # fmt: skip
            async with contextlib.AsyncExitStack() as running:
                for worker in stubs.workers(client, queue):
                    await running.enter_async_context(worker)
                run = await timed_run(client, spec)
            step = median(steady_steps(run))
            row[mode] = {"step_s": step, "steps": run.step_seconds()}
            print(f"R={rollout_s} T={train_s} {mode}: {step:.2f} s/step", flush=True)
        rows.append(row)
    return rows


async def real(steps: int, rounds: int, home: Path) -> dict[str, list[float]]:
    queues = TaskQueues(
        control=f"bench-control-{uuid.uuid4().hex[:6]}",
        inference=f"bench-inference-{uuid.uuid4().hex[:6]}",
        trainer=f"bench-trainer-{uuid.uuid4().hex[:6]}",
    )
    worker = WorkerProcess("all", home / "logs" / "bench-workers.log", task_queues=queues)
    worker.start()
    client = await connect_client()
    means: dict[str, list[float]] = {"sync": [], "pipelined": []}
    try:
        for r in range(rounds):
            for mode in ("sync", "pipelined"):
                spec = demo_run_spec(
                    f"bench-real-{mode}-{r}-{uuid.uuid4().hex[:6]}", steps, queues, mode=mode
                )
                print(f"round {r + 1}/{rounds}: {mode} ({steps} steps) ...", flush=True)
                run = await timed_run(client, spec)
                later = steady_steps(run, first=2)
                means[mode].append(sum(later) / len(later))
                print(f"  steps: {[round(s, 1) for s in run.step_seconds().values()]}", flush=True)
                assert run.status is not None
                phases = [h.seconds for h in run.status.history if h.step >= 2]
                mean = {k: round(sum(p.get(k, 0.0) for p in phases) / len(phases), 2) for k in phases[0]}
                print(f"  mean phases of steps 2..N (rollouts: of the step's own, if not prefetched): {mean}")
    finally:
        worker.stop()
    return means


def report(results: dict[str, Any]) -> str:
    lines = []
    if "simulated" in results:
        lines += [
            "SIMULATION of dedicated devices (sleeping activities on the real TrainingRun, real Temporal); "
            f"median step of steps 3..{results['steps']}",
            "",
            "| rollout s | train s | sync s/step | pipelined s/step | pipelined / max(R,T) | sync / (R+T) |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        for row in results["simulated"]:
            r, t = row["rollout_s"], row["train_s"]
            s, p = row["sync"]["step_s"], row["pipelined"]["step_s"]
            lines.append(f"| {r} | {t} | {s:.2f} | {p:.2f} | {p / max(r, t):.3f} | {s / (r + t):.3f} |")
    if "real" in results:
        real_means = results["real"]
        s, p = real_means["sync"], real_means["pipelined"]
        lines += [
            "",
            "Real demo on this CPU (mean s/step of steps 2..N per run, modes alternated)",
            "",
            "| round | sync s/step | pipelined s/step | pipelined / sync |",
            "|---|---:|---:|---:|",
        ]
        for i, (a, b) in enumerate(zip(s, p, strict=True)):
            lines.append(f"| {i + 1} | {a:.1f} | {b:.1f} | {b / a:.2f} |")
    lines += ["", f"command: {command_line()}"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=8, help="steps per simulated run (>= 4)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the simulated phase durations")
    parser.add_argument("--no-simulate", action="store_true", help="skip the simulation")
    parser.add_argument("--real", action="store_true", help="also run the real demo, sync vs pipelined")
    parser.add_argument("--real-steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1, help="sync/pipelined pairs of the real demo")
    args = parser.parse_args()
    results: dict[str, Any] = {"steps": args.steps, "command": command_line()}
    with private_stack() as (_stack, home):
        if not args.no_simulate:
            results["simulated"] = asyncio.run(simulate(args.steps, args.scale))
        if args.real:
            results["real"] = asyncio.run(real(args.real_steps, args.rounds, home))
    write_results("pipelined", results, report(results))


if __name__ == "__main__":
    main()
