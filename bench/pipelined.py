"""Pipelined vs sync ``TrainingRun``: a SIMULATION of dedicated devices, and the real demo on this CPU.

``--simulate`` (the default part): the real ``TrainingRun`` on a real Temporal dev server, S3 store and CPU
inference server, run by three real ``dgrpo worker`` processes (control, inference, trainer) in which only the
two devices' compute is simulated (bench/simulated_devices.py): generation takes ``R`` seconds, a training
step's forward/backward/optimizer ``T`` seconds. Everything durability adds is real: the rollouts' upload,
merge, advantages, the trainer's reads, tokenization and staging, publish to S3 (adapter and optimizer state),
reload into the server. Steady-state step time (the mean of steps 3..N, each from step n-1 served to step n served:
a pipelined run alternates shorter and longer steps) is compared
with max(R, T), what a perfect pipeline reaches, and R + T, what sync mode cannot beat; with the trainer's idle
time before each training that neither its data nor the previous training explains.

``--real``: the demo (examples/run.toml, SmolLM2-135M on one ``dgrpo worker all``) in sync and pipelined
mode, alternated, ``--epochs`` passes per step (4 makes training the longer phase on this CPU). Per mode: the
mean step of steps 2..N, the trainer's unexplained idle time (median, range) and, for sync, a step's time
beyond its compute (the step's wall minus its rollouts activity and the trainer's forward/backward/optimizer).

    PYTHONPATH=$PWD python bench/pipelined.py [--steps 8] [--scale 1] [--real --real-steps 7 --epochs 4 --rounds 1]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.bench_stack import (
    ActivitySpan,
    TimedRun,
    activity_spans,
    command_line,
    demo_run_spec,
    median,
    private_stack,
    timed_run,
    trainer_idle,
)
from bench.bench_stack import write_results as write_bench_results
from schemas.activities import ActivityName
from schemas.config import TaskQueues
from workers.launcher import WorkerProcess
from workers.temporal import connect_client

CASES = [(2.0, 2.0), (3.0, 1.5), (1.5, 3.0)]
"""(rollout seconds, train seconds) per simulated step."""


def queues(name: str) -> TaskQueues:
    suffix = uuid.uuid4().hex[:6]
    return TaskQueues(control=f"{name}-control-{suffix}", inference=f"{name}-inference-{suffix}",
                      trainer=f"{name}-trainer-{suffix}")  # fmt: skip


def steady_steps(run: TimedRun, first: int = 3) -> list[float]:
    """Step seconds from step ``first`` on (a pipeline fills during steps 1-2)."""
    return [s for n, s in run.step_seconds().items() if n >= first]


@contextlib.contextmanager
def simulated_workers(home: Path, on: TaskQueues, phases: Path) -> Iterator[None]:
    """``dgrpo worker control``, ``inference`` and ``trainer``, each its own process, devices simulated."""
    workers = []
    try:
        for role in ("control", "inference", "trainer"):
            worker = WorkerProcess(role, home / "logs" / f"sim-{role}.log", task_queues=on)
            worker.child.argv[1:3] = ["-m", "bench.simulated_devices", "--phases", str(phases)]
            worker.start()
            workers.append(worker)
        yield
    finally:
        for worker in workers:
            worker.stop()


async def simulate(
    steps: int, scale: float, home: Path, cases: list[tuple[float, float]] = CASES
) -> list[dict[str, Any]]:
    client = await connect_client()
    on, phases = queues("sim"), home / "phases.json"
    phases.write_text(json.dumps({"rollout_s": 0.0, "train_s": 0.0}))
    rows = []
    with simulated_workers(home, on, phases):
        for rollout_s, train_s in ((r * scale, t * scale) for r, t in cases):
            phases.write_text(json.dumps({"rollout_s": rollout_s, "train_s": train_s}))
            row: dict[str, Any] = {"rollout_s": rollout_s, "train_s": train_s}
            for mode in ("sync", "pipelined"):
                spec = demo_run_spec(f"bench-sim-{mode}-{uuid.uuid4().hex[:6]}", steps, on, mode=mode)
                run = await timed_run(client, spec)
                spans = await activity_spans(client, spec.run_id)
                idle = trainer_idle(spans)
                steady = steady_steps(run)  # the mean: a pipelined run alternates shorter and longer steps
                step = sum(steady) / len(steady)
                chain = step_chain(spans, mode, rollout_s, train_s)
                row[mode] = {
                    "step_s": step,
                    "steps": run.step_seconds(),
                    "trainer_idle_s": idle,
                    "chain": chain,
                }
                print(f"R={rollout_s} T={train_s} {mode}: {step:.2f} s/step, trainer idle median "
                      f"{median([v for n, v in idle.items() if n >= 3]):.2f} s", flush=True)  # fmt: skip
            rows.append(row)
    return rows


def step_chain(spans: list[ActivitySpan], mode: str, rollout_s: float, train_s: float) -> dict[str, float]:
    """Medians over steps 3..N of the pieces of work a step's cycle is made of, read from the run's history:

    - ``rollouts_extra``, ``train_extra``: a rollouts or train activity's seconds beyond its simulated R or T (the
      rollouts' upload, the trainer's reads, tokenization and staging);
    - ``scored``: step n's rollouts closed -> its advantages closed (merge, advantages, the workflow tasks);
    - ``served``: step n's training closed -> its reload closed (the adapter's upload and manifest, the reload, the
      workflow tasks).

    Nothing else waits in these, so they bound a step from below (``bound_s``, leaving out the workflow tasks that
    start the training and the rollouts): a sync step is R + T + all four. In pipelined mode with
    ``max_staleness = 1`` step n's rollouts, its training and step n + 2's rollouts (sampled by step n's adapter)
    follow one another, a cycle two steps long: a step is at least half of R + T + all four, whatever overlaps
    (and at least the busier device's activity)."""
    last: dict[tuple[str, int], ActivitySpan] = {}
    for s in spans:  # a step's last of each (a round rolled out again, a step trained again)
        last[(s.name, s.step)] = s
    parts: dict[str, list[float]] = {"rollouts_extra": [], "train_extra": [], "scored": [], "served": []}
    for n in sorted({step for _, step in last}):
        rollouts, train = last.get((ActivityName.ROLLOUTS, n)), last.get((ActivityName.TRAIN, n))
        advantages, reload = last.get((ActivityName.ADVANTAGES, n)), last.get((ActivityName.RELOAD, n))
        if n < 3 or rollouts is None or train is None or advantages is None or reload is None:
            continue
        parts["rollouts_extra"].append(rollouts.closed - rollouts.started - rollout_s)
        parts["train_extra"].append(train.closed - train.started - train_s)
        parts["scored"].append(advantages.closed - rollouts.closed)
        parts["served"].append(reload.closed - train.closed)
    if not all(parts.values()):
        return {}
    out = {k: median(v) for k, v in parts.items()}
    cycle = rollout_s + train_s + sum(out.values())
    busy = max(rollout_s + out["rollouts_extra"], train_s + out["train_extra"])  # each device, alone
    out["bound_s"] = max(busy, cycle / 2) if mode == "pipelined" else cycle
    return out


async def real(steps: int, rounds: int, epochs: int, home: Path) -> dict[str, Any]:
    on = queues("bench")
    worker = WorkerProcess("all", home / "logs" / "bench-workers.log", task_queues=on)
    worker.start()
    client = await connect_client()
    out: dict[str, Any] = {
        mode: {"mean_step_s": [], "trainer_idle_s": [], "beyond_compute_s": [], "beyond_activities_s": [],
               "spans": []}
        for mode in ("sync", "pipelined")
    }  # fmt: skip
    try:
        for r in range(rounds):
            for mode in ("sync", "pipelined"):
                run_id = f"bench-real-{mode}-{r}-{uuid.uuid4().hex[:6]}"
                spec = demo_run_spec(run_id, steps, on, mode=mode, **{"train.epochs": epochs})
                print(f"round {r + 1}/{rounds}: {mode} ({steps} steps, {epochs} epochs) ...", flush=True)
                run = await timed_run(client, spec)
                spans = await activity_spans(client, run_id)
                later = steady_steps(run, first=2)
                mode_out = out[mode]
                mode_out["mean_step_s"].append(sum(later) / len(later))
                mode_out["trainer_idle_s"] += [v for n, v in trainer_idle(spans).items() if n >= 2]
                mode_out["beyond_compute_s"] += beyond_compute(run, spans)
                mode_out["beyond_activities_s"] += beyond_compute(run, spans, activities=True)
                mode_out["spans"].append([dataclasses.asdict(s) for s in spans])
                print(f"  steps: {[round(s, 1) for s in run.step_seconds().values()]}", flush=True)
                print(
                    f"  trainer idle (s): {[round(v, 2) for v in trainer_idle(spans).values()]}", flush=True
                )
    finally:
        worker.stop()
    return out


def beyond_compute(run: TimedRun, spans: list[Any], activities: bool = False) -> list[float]:
    """Per step 2..N: its wall minus its rollouts activities and the trainer's forward/backward/optimizer (with
    ``activities``, minus its whole train activity: what older trainers, which do not report their compute, allow)."""
    out = []
    for n, wall in run.step_seconds().items():
        rollouts = sum(s.closed - s.started for s in spans if s.name == ActivityName.ROLLOUTS and s.step == n)
        trains = [s for s in spans if s.name == ActivityName.TRAIN and s.step == n and s.result]
        if n < 2 or not trains:
            continue
        result: dict[str, Any] = trains[-1].result
        compute = trains[-1].closed - trains[-1].started if activities else result.get("compute_seconds", 0.0)
        if compute:
            out.append(wall - rollouts - compute)
    return out


def _summary(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def report(results: dict[str, Any]) -> str:
    load = ", ".join(f"{x:.1f}" for x in results["load"])
    lines = [f"load average at the end: {load}", ""]
    if "simulated" in results:
        lines += [
            "SIMULATION of dedicated devices (generation and fwd/bwd/opt simulated; rollouts' upload, merge, "
            "advantages, staging, publish, S3 and reload real); mean step of steps "
            f"3..{results['steps']}; trainer idle: median over steps 3..N",
            "",
            "| rollout s | train s | sync s/step | pipelined s/step | pipelined / max(R,T) | sync / (R+T) "
            "| pipelined trainer idle s |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for row in results["simulated"]:
            r, t = row["rollout_s"], row["train_s"]
            s, p = row["sync"]["step_s"], row["pipelined"]["step_s"]
            idle = [v for n, v in row["pipelined"]["trainer_idle_s"].items() if int(n) >= 3]
            lines.append(
                f"| {r} | {t} | {s:.2f} | {p:.2f} | {p / max(r, t):.3f} | {s / (r + t):.3f} | {_summary(idle)} |"
            )
        lines += [
            "",
            "What a step is made of (medians over steps 3..N, s; see ``step_chain``): the rollouts' and the training's "
            "seconds beyond R and T, rollouts closed -> advantages closed (scored), training closed -> reload "
            "closed (served); the step they bound it to from below, and the step measured",
            "",
            "| rollout s | train s | mode | rollouts extra | train extra | scored | served | bound s/step "
            "| measured s/step |",
            "|---:|---:|---|---:|---:|---:|---:|---:|---:|",
        ]
        for row in results["simulated"]:
            for mode in ("sync", "pipelined"):
                chain = row[mode].get("chain")
                if not chain:
                    continue
                pieces = " | ".join(
                    f"{chain[k]:.3f}" for k in ("rollouts_extra", "train_extra", "scored", "served")
                )
                lines.append(f"| {row['rollout_s']} | {row['train_s']} | {mode} | {pieces} | {chain['bound_s']:.2f} "
                             f"| {row[mode]['step_s']:.2f} |")  # fmt: skip
    if "real" in results:
        real_out = results["real"]
        lines += [
            "",
            f"Real demo on this CPU, {results['epochs']} epochs a step (steps 2..N of each run, modes alternated)",
            "",
            "| mode | mean s/step per round | trainer idle s | beyond compute s | beyond rollouts and train "
            "activities s |",
            "|---|---|---:|---:|---:|",
        ]
        for mode, m in real_out.items():
            means = ", ".join(f"{x:.1f}" for x in m["mean_step_s"])
            sync = mode == "sync"  # pipelined rollouts overlap training: a step is not their sum
            beyond = [_summary(m[k]) if sync else "-" for k in ("beyond_compute_s", "beyond_activities_s")]
            lines.append(
                f"| {mode} | {means} | {_summary(m['trainer_idle_s'])} | {beyond[0]} | {beyond[1]} |"
            )
        lines += ["", "medians (range) over steps 2..N; trainer idle: before each training, beyond what its data "
                  "(scored rollouts) and the previous training explain"]  # fmt: skip
    lines += ["", f"command: {command_line()}"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=8, help="steps per simulated run (>= 4)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the simulated phase durations")
    parser.add_argument(
        "--cases",
        default=",".join(f"{r}:{t}" for r, t in CASES),
        help="simulated (rollout s:train s) pairs, comma-separated",
    )
    parser.add_argument("--no-simulate", action="store_true", help="skip the simulation")
    parser.add_argument("--real", action="store_true", help="also run the real demo, sync vs pipelined")
    parser.add_argument("--real-steps", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=1, help="train.epochs of the real demo")
    parser.add_argument("--rounds", type=int, default=1, help="sync/pipelined pairs of the real demo")
    parser.add_argument("--out", default="pipelined", help="results name under bench/out/")
    args = parser.parse_args()
    results: dict[str, Any] = {"steps": args.steps, "epochs": args.epochs, "command": command_line()}
    with private_stack() as (_stack, home):
        if not args.no_simulate:
            cases = [(float(r), float(t)) for r, t in (c.split(":") for c in args.cases.split(","))]
            results["simulated"] = asyncio.run(simulate(args.steps, args.scale, home, cases))
        if args.real:
            results["real"] = asyncio.run(real(args.real_steps, args.rounds, args.epochs, home))
    results["load"] = os.getloadavg()
    write_bench_results(args.out, results, report(results))


if __name__ == "__main__":
    main()
