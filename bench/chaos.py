"""Chaos bench: the same TrainingRun undisturbed, then under faults, on one real cluster (CPU, loopback).

A control worker, 2 inference workers (each with its own CPU server) and 2 trainers on their own embedded
stack (tests/chaos/chaos_cluster.py). The undisturbed run goes first; then the same spec under another run
id while ``kill -9`` hits the worker running rollouts, train and reload, the control worker, the Temporal
server (down 5 s) and the S3 server (down ``--s3-outage`` s); each is restarted, servers on their recorded
ports. Printed as markdown: every fault; for a worker kill, the seconds from the kill to the start of the
activity's next attempt (the history's ActivityTaskStarted against the recorded kill time); for a server,
the seconds until the restarted one answered; and both runs' wall times.

Then (``--suite liveness``, or ``all``, the default) the faults a live process hides, on a control worker and
one ``dgrpo worker all`` (its server and its trainer child): ``kill -STOP`` of the server while it serves
rollouts, and the trainer child killed while it trains (``kill -9`` on odd steps, an OOM kill by the kernel on
even ones: needs root and cgroup v1's memory controller), at every step; nothing outside the worker restarts
either. Again the seconds from the fault to the activity's next attempt.

    PYTHONPATH=$PWD python bench/chaos.py [--steps 6] [--groups 4] [--group-size 8] [--s3-outage 30]
        [--suite all|faults|liveness]

The default size is the demo's (4 x 8): on an idle machine a step of 2 x 4 takes seconds, and a kill that
waits for an activity to have run a second or two finds none until late in the run.

Measured 2026-11-23 on 2 CPU cores, machine otherwise idle (6 steps x 4 x 8): each of the 6 killed activity
attempts (rollouts, train, reload) started again 19.8-22.0 s after the kill (20 s heartbeat timeout + 2 s first
retry interval); 74 s undisturbed, 255 s under 10 faults (docs/faults.md).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "chaos"))
from chaos_cluster import (
    ChaosCluster,
    Fault,
    MomentPassed,
    retry_delays,
    stored_steps,
    unless_done,
    wait_for_phase,
)
from test_chaos import chaos_spec

from activities.object_store import ObjectStore
from dgrpo.client import run_control
from schemas.config import TaskQueues
from schemas.run_state import RunStatus
from workers.temporal import connect_client, result_across_restarts

Injection = Callable[[ChaosCluster, object], Awaitable[object]]


def schedule(steps: int, s3_outage_s: float) -> list[Callable[[ChaosCluster, object], Awaitable[object]]]:
    """The faults, in run order: each waits for its moment, then strikes."""

    def at(phase: str, step: int, then: Injection) -> Injection:
        async def inject(cluster: ChaosCluster, handle: object) -> object:
            await wait_for_phase(handle, phase, step)  # type: ignore[arg-type]
            return await then(cluster, handle)

        return inject

    def kill_running(activity: str, after_s: float = 2.0) -> Injection:
        return lambda cluster, handle: cluster.kill_worker_running(handle, activity, after_s=after_s)  # type: ignore[arg-type]

    faults: list[Injection] = [
        at("rollouts", 1, kill_running("rollouts")),
        at("train", 1, kill_running("train")),
        at("rollouts", 2, lambda cluster, _: cluster.kill_worker_now("control")),
        lambda cluster, _: cluster.ready("control"),  # one that starts while Temporal is down exits
        lambda cluster, _: cluster.kill_server("temporal", down_s=5.0),
        at("train", 2, lambda cluster, _: cluster.kill_server("seaweed", down_s=s3_outage_s)),
    ]
    if steps >= 3:
        faults += [at("rollouts", 3, kill_running("rollouts")), at("train", 3, kill_running("train"))]
    if steps >= 4:
        faults += [at("reload", 4, kill_running("reload", after_s=0.2))]
    if steps >= 5:
        faults += [at("rollouts", 5, lambda cluster, _: cluster.kill_worker_now("control"))]
        faults += [at("train", 5, kill_running("train"))]
    return faults


def liveness_schedule(steps: int) -> list[Injection]:
    """Per step: the server of the ``worker all`` stopped during rollouts, its trainer child killed during train:
    ``kill -9`` on odd steps, the kernel's OOM killer (a memory cgroup it overruns) on even ones."""

    def at(phase: str, step: int, then: Injection) -> Injection:
        async def inject(cluster: ChaosCluster, handle: object) -> object:
            await wait_for_phase(handle, phase, step)  # type: ignore[arg-type]
            return await then(cluster, handle)

        return inject

    faults: list[Injection] = []
    for step in range(1, steps + 1):
        faults += [
            at("rollouts", step, lambda cluster, handle: cluster.stop_server_running(handle, "rollouts")),  # type: ignore[arg-type]
            at("train", step, lambda cluster, handle: cluster.kill_trainer_child_running(handle))  # type: ignore[arg-type]
            if step % 2
            else at("train", step, lambda cluster, handle: cluster.oom_kill_trainer_child_running(handle)),  # type: ignore[arg-type]
        ]
    return faults


async def timed_run(
    cluster: ChaosCluster, args: argparse.Namespace, faults: list[Injection]
) -> tuple[float, RunStatus, str]:
    """Start a run, strike ``faults`` in order (one whose moment passed is skipped), wait for the result;
    returns the wall seconds, the final status and the run id."""
    client = await connect_client(address=cluster.stack.temporal_address, wait_s=120)
    spec = chaos_spec(f"bench-{uuid.uuid4().hex[:6]}", cluster.queues, steps=args.steps)
    spec = spec.model_copy(update={"groups_per_step": args.groups, "group_size": args.group_size})
    started = time.monotonic()
    handle = await run_control.start_run(client, spec, ObjectStore(cluster.stack.s3_settings))
    result = asyncio.ensure_future(result_across_restarts(handle))
    for inject in faults:
        try:
            await unless_done(result, inject(cluster, handle))
        except (TimeoutError, MomentPassed) as err:
            logging.warning("fault skipped: %s", err)
    final = await result
    return time.monotonic() - started, final, spec.run_id


def report(
    args: argparse.Namespace,
    calm_s: float,
    chaos_s: float,
    final: RunStatus,
    faults: list[Fault],
    delays: dict[int, float | None],
    start: datetime,
    title: str = "control + 2 inference + 2 trainer workers",
) -> str:
    lines = [
        f"Chaos bench: {args.steps} steps x {args.groups} groups x {args.group_size}, SmolLM2-135M on CPU, "
        + title,
        "",
        "| # | fault | target | activity (attempt) | at (s) | retry started after (s) | outage (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, fault in enumerate(faults):
        activity = f"{fault.activity} ({fault.attempt})" if fault.activity else "-"
        delay = delays.get(i)
        retry = "-" if i not in delays else ("never" if delay is None else f"{delay:.1f}")
        outage = "-" if fault.outage_s is None else f"{fault.outage_s:.1f}"
        at = (fault.at - start).total_seconds()
        lines.append(
            f"| {i + 1} | {fault.kind} | {fault.target} | {activity} | {at:.0f} | {retry} | {outage} |"
        )
    lines += [
        "",
        "| run | wall (s) | final phase | steps |",
        "|---|---|---|---|",
        *([f"| undisturbed | {calm_s:.0f} | done | {args.steps} |"] if calm_s else []),
        f"| under {len(faults)} faults | {chaos_s:.0f} | {final.phase} | {final.step} |",
    ]
    return "\n".join(lines)


def intact(store: ObjectStore, run_id: str, final: RunStatus, rows: int) -> str:
    """What the faulted run left (``stored_steps``: every checkpoint sha256-verified, each step's rows)."""
    lines = [
        f"step {s['step']}: checkpoint verified, {s['rows']} rows, {s['distinct']} distinct of {rows}"
        for s in stored_steps(store, run_id, final.step)
    ]
    return "\n".join(["", *lines])


async def main(args: argparse.Namespace) -> None:
    if args.suite in ("all", "faults"):
        await bench(args, liveness=False)
    if args.suite in ("all", "liveness"):
        await bench(args, liveness=True)


async def bench(args: argparse.Namespace, liveness: bool) -> None:
    suffix = uuid.uuid4().hex[:8]
    queues = TaskQueues(
        control=f"bc-control-{suffix}", inference=f"bc-inf-{suffix}", trainer=f"bc-tr-{suffix}"
    )
    with tempfile.TemporaryDirectory(prefix="dgrpo-chaos-") as root:
        if liveness:
            cluster = ChaosCluster(Path(root), queues, inference=0, trainers=0, all_in_one=1)
            title, faults = "control + 1 `worker all` (server + trainer child)", liveness_schedule(args.steps)
        else:
            cluster = ChaosCluster(Path(root), queues)
            title, faults = "control + 2 inference + 2 trainer workers", schedule(args.steps, args.s3_outage)
        try:
            cluster.start()
            calm_s = 0.0
            if not liveness:
                calm_s, calm, _ = await timed_run(cluster, args, [])
                assert calm.phase == "done", calm
            start = datetime.now().astimezone()
            chaos_s, final, run_id = await timed_run(cluster, args, faults)
            client = await connect_client(address=cluster.stack.temporal_address, wait_s=120)
            delays = await retry_delays(client, run_id, cluster.faults)
            print(report(args, calm_s, chaos_s, final, cluster.faults, delays, start, title))
            print(
                intact(ObjectStore(cluster.stack.s3_settings), run_id, final, args.groups * args.group_size)
            )
        finally:
            cluster.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--s3-outage", type=float, default=30.0, help="seconds S3 stays down")
    parser.add_argument("--suite", choices=("all", "faults", "liveness"), default="all")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    asyncio.run(main(parser.parse_args()))
