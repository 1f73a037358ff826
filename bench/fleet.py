"""Several runs on one fleet: N ``TrainingRun``s together on one ``dgrpo worker all`` (its CPU server and its
trainer) against the same N runs one after another on the same worker.

The runs are the demo's arithmetic task (examples/run.toml: SmolLM2-135M, 4 prompts x 8 completions, 16 new
tokens, lr 2e-4), half of them ``sync`` and half ``pipelined``, with LoRA ranks 8 and 16 in turn. Together,
one run's rollouts share the server's batches with the others' and one run trains while the others roll out;
one after another, the server waits while the trainer works and the other way round. The sides alternate
(together, one after another, together, ...) so load from other processes hits both.

Reported: each side's total wall time, the mean step time of each run (its served steps from its own
history), and together / one after another (issue #25's target: at most 0.6 on this CPU).

    PYTHONPATH=$PWD python bench/fleet.py [--runs 4] [--steps 2] [--rounds 1]
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

from temporalio.client import Client

from bench.bench_stack import TimedRun, command_line, demo_run_spec, private_stack, timed_run, write_results
from schemas.config import RunSpec, TaskQueues
from workers.launcher import WorkerProcess
from workers.temporal import connect_client

SIDES = ("together", "one_after_another")


def fleet_specs(n: int, steps: int, queues: TaskQueues, tag: str) -> list[RunSpec]:
    """``n`` demo runs: sync and pipelined in turn, LoRA rank 8 and 16 in turn."""
    specs = []
    for i in range(n):
        mode = "sync" if i % 2 == 0 else "pipelined"
        rank = 8 if (i // 2) % 2 == 0 else 16
        run_id = f"fleet-{tag}-{i}"
        overrides = {"mode": mode, "model.lora.rank": rank, "model.name": run_id}
        specs.append(demo_run_spec(run_id, steps, queues, **overrides))
    return specs


async def run_side(client: Client, side: str, specs: list[RunSpec]) -> tuple[float, list[TimedRun]]:
    started = time.perf_counter()
    if side == "together":
        runs = list(await asyncio.gather(*(timed_run(client, spec) for spec in specs)))
    else:
        runs = [await timed_run(client, spec) for spec in specs]
    return time.perf_counter() - started, runs


def mean_step_s(run: TimedRun) -> float:
    steps = run.step_seconds()
    return sum(steps.values()) / len(steps)


async def bench(n: int, steps: int, rounds: int, home: Path) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:6]
    queues = TaskQueues(
        control=f"fleet-control-{tag}", inference=f"fleet-inference-{tag}", trainer=f"fleet-trainer-{tag}"
    )
    worker = WorkerProcess("all", home / "logs" / "fleet-workers.log", task_queues=queues)
    await asyncio.to_thread(worker.start)
    try:
        client = await connect_client()
        results: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
        for r in range(rounds):
            for side in SIDES if r % 2 == 0 else reversed(SIDES):
                specs = fleet_specs(n, steps, queues, f"{tag}-{r}-{side[:3]}")
                print(
                    f"round {r + 1}/{rounds}: {n} runs {side.replace('_', ' ')} ({steps} steps) ...",
                    flush=True,
                )
                total, runs = await run_side(client, side, specs)
                for spec, run in zip(specs, runs, strict=True):
                    assert run.status is not None and run.status.step == steps, (spec.run_id, run.status)
                per_run = [round(mean_step_s(run), 2) for run in runs]
                print(f"  {total:.1f} s in all; mean step per run {per_run} s", flush=True)
                results[side].append({"total_s": total, "mean_step_s": per_run})
    finally:
        worker.stop()
    return results


def markdown(results: dict[str, list[dict[str, Any]]], n: int, steps: int) -> str:
    rows = ["| side | total wall (s) | mean step per run (s) |", "|---|---|---|"]
    for side in SIDES:
        for result in results[side]:
            steps_s = ", ".join(f"{s:.1f}" for s in result["mean_step_s"])
            rows.append(f"| {side.replace('_', ' ')} | {result['total_s']:.1f} | {steps_s} |")
    together = sum(r["total_s"] for r in results["together"])
    serial = sum(r["total_s"] for r in results["one_after_another"])
    rows.append("")
    rows.append(f"{n} runs of {steps} steps: together / one after another = **{together / serial:.2f}**")
    rows.append("")
    rows.append(f"`{command_line()}`")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=4, help="runs on the fleet")
    parser.add_argument("--steps", type=int, default=2, help="steps per run (>= 2)")
    parser.add_argument("--rounds", type=int, default=1, help="together / one-after-another pairs")
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be at least 2 (a step time needs two served steps)")
    with private_stack() as (_, home):
        results = asyncio.run(bench(args.runs, args.steps, args.rounds, home))
    write_results(
        "fleet", {"runs": args.runs, "steps": args.steps, **results}, markdown(results, args.runs, args.steps)
    )


if __name__ == "__main__":
    main()
