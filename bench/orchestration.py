"""Orchestration overhead: one demo step through Temporal and real workers vs the same activities called in-process.

Both sides run the demo's arithmetic task and settings (examples/run.toml: SmolLM2-135M, LoRA r16/a32,
4 prompts x 8 completions, 16 new tokens, lr 2e-4) on one private embedded stack (Temporal + SeaweedFS):

- ``temporal``: ``TrainingRun`` on a ``dgrpo worker all`` process (its CPU server, its trainer child).
- ``direct``: the SAME activity methods (RolloutActivities, AdvantagesActivities, TrainerActivities,
  ServingActivities, MetricsActivities), called one after the other in this process through
  ``temporalio.testing.ActivityEnvironment`` in the workflow's order, against a CPU server of its own;
  the same S3 round trips, Parquet files and checkpoints, no Temporal.

A step is the time from step n-1 served to step n served: on the Temporal side from the run's history (each
``reload`` activity's completion, as the server recorded it; nothing polls the workflow meanwhile), on the
direct side from this process's clock. On both sides a served step's metrics and retention run beside the next
step. The sides alternate (temporal, direct, temporal,
direct, ...) so load from other processes hits both. Overhead = temporal / direct - 1 on the mean step of
steps 2..N (step 1 pays warm-up).

    PYTHONPATH=$PWD python bench/orchestration.py [--steps 4] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

from temporalio.testing import ActivityEnvironment

from activities.advantages import AdvantagesActivities
from activities.metrics import MetricsActivities
from activities.object_store import ObjectStore
from activities.retention import RetentionActivities
from activities.rollouts import RolloutActivities
from activities.serving import ServingActivities
from activities.training import TrainerActivities
from bench.bench_stack import (
    TimedRun,
    command_line,
    demo_run_spec,
    median,
    private_stack,
    step_rollouts,
    timed_run,
    write_results,
)
from host.processes import free_port
from schemas.activities import (
    AdvantagesInput,
    CheckpointLookup,
    InitialAdapterInput,
    MetricsInput,
    PublishInput,
    ReloadInput,
    RetentionInput,
    TrainInput,
)
from schemas.config import RunSpec, TaskQueues
from schemas.refs import CheckpointRef
from schemas.run_state import StepSummary
from schemas.settings import EngineSettings
from serving.launchers import server_process
from workers.launcher import WorkerProcess
from workers.temporal import connect_client
from workers.worker import DEFAULT_MODEL
from workflows.bookkeeping import step_metrics

T = TypeVar("T")


class DirectChain:
    """The activities a ``TrainingRun`` step calls, called in-process in the workflow's order."""

    def __init__(self, store: ObjectStore, server_url: str, home: Path) -> None:
        self.serving = ServingActivities([server_url], store)
        self.rollouts = RolloutActivities([server_url], store, serving=self.serving)
        self.advantages = AdvantagesActivities(store)
        self.trainer = TrainerActivities(store, home / "direct-staging", worker_id="direct")
        self.metrics = MetricsActivities(store, local_dir=home / "direct-runs")
        self.retention = RetentionActivities(store)
        self.phase_seconds: dict[int, dict[str, float]] = {}

    async def _timed(self, step: int, phase: str, call: Awaitable[T]) -> T:
        started = time.perf_counter()
        result = await call
        phases = self.phase_seconds.setdefault(step, {})
        phases[phase] = phases.get(phase, 0.0) + time.perf_counter() - started
        return result

    async def _bookkeeping(
        self,
        env: ActivityEnvironment,
        step: int,
        metrics: MetricsInput,
        retain: RetentionInput | None,
        previous: asyncio.Task[None] | None,
    ) -> None:
        if previous is not None:
            await previous
        await self._timed(step, "metrics", env.run(self.metrics.log_metrics, metrics))
        if retain is not None:
            await self._timed(step, "metrics", env.run(self.retention.retain_checkpoints, retain))

    async def run(self, spec: RunSpec) -> TimedRun:
        env = ActivityEnvironment()
        self.phase_seconds = {}
        started = time.perf_counter()
        served: dict[int, float] = {}
        checkpoint = await env.run(self.trainer.latest_checkpoint, CheckpointLookup(run_id=spec.run_id))
        assert checkpoint is None, "a direct run starts fresh"
        initial = InitialAdapterInput(run_id=spec.run_id, model=spec.model, seed=spec.train.seed)
        checkpoint = await env.run(self.trainer.publish_initial, initial)
        await env.run(self.serving.reload, reload_input(spec, checkpoint))
        served[0] = time.perf_counter() - started
        bookkeeping: asyncio.Task[None] | None = None
        for step in range(1, spec.steps + 1):
            rollouts = step_rollouts(spec, step)
            scored = await self._timed(step, "rollouts", env.run(self.rollouts.rollouts, rollouts))
            inp = AdvantagesInput(run_id=spec.run_id, step=step, trajectories=scored, train=spec.train)
            advantages = await self._timed(
                step, "advantages", env.run(self.advantages.compute_advantages, inp)
            )
            if advantages.n_trajectories == 0:
                raise RuntimeError(f"step {step}: no learning signal (the workflow would resample)")
            train = TrainInput(
                run_id=spec.run_id,
                step=step,
                model=spec.model,
                advantages=advantages.ref,
                train=spec.train,
                start_from=checkpoint,
            )
            trained = await self._timed(step, "train", env.run(self.trainer.train, train))
            publish = PublishInput(
                run_id=spec.run_id,
                step=step,
                staging_dir=trained.staging_dir,
                metrics={"loss": trained.loss, "grad_norm": trained.grad_norm},
            )
            checkpoint = await self._timed(step, "publish", env.run(self.trainer.publish, publish))
            await self._timed(step, "reload", env.run(self.serving.reload, reload_input(spec, checkpoint)))
            served[step] = time.perf_counter() - started
            summary = StepSummary(
                step=step,
                reward_mean=scored.reward_mean,
                reward_std=scored.reward_std,
                n_trajectories=scored.n_trajectories,
                n_exceptions=scored.n_exceptions,
                n_groups_zero_variance=advantages.n_groups_zero_variance,
                policy_step=step - 1,
                loss=trained.loss,
                checkpoint=checkpoint,
                seconds={**self.phase_seconds[step], "step": served[step] - served[step - 1]},
            )
            metrics = MetricsInput(
                run_id=spec.run_id,
                project=spec.model.project,
                model_name=spec.model.name,
                step=step,
                metrics=step_metrics(summary, scored.n_groups, 0),
                wandb=spec.metrics.wandb,
            )
            retain = None
            if spec.checkpoints.keep_last is not None:
                retain = RetentionInput(
                    run_id=spec.run_id,
                    keep_last=spec.checkpoints.keep_last,
                    keep_best_metric=spec.checkpoints.keep_best_metric,
                    protect=[step],
                )
            # As the workflow does: beside the next step, after the previous step's.
            bookkeeping = asyncio.create_task(self._bookkeeping(env, step, metrics, retain, bookkeeping))
        if bookkeeping is not None:
            await bookkeeping
        return TimedRun(status=None, served_at=served, total_s=time.perf_counter() - started)


def reload_input(spec: RunSpec, checkpoint: CheckpointRef) -> ReloadInput:
    return ReloadInput(
        model_name=spec.model.name,
        checkpoint=checkpoint,
        serving=spec.serving,
        lora_rank=spec.model.lora.rank,
    )


def steady_mean(run: TimedRun) -> float:
    """Mean seconds per step over steps 2..N (step 1 pays warm-up)."""
    steps = {n: s for n, s in run.step_seconds().items() if n >= 2}
    return sum(steps.values()) / len(steps)


async def bench(steps: int, rounds: int, home: Path, watch_s: float | None) -> dict[str, Any]:
    queues = TaskQueues(
        control=f"bench-control-{uuid.uuid4().hex[:6]}",
        inference=f"bench-inference-{uuid.uuid4().hex[:6]}",
        trainer=f"bench-trainer-{uuid.uuid4().hex[:6]}",
    )
    worker = WorkerProcess("all", home / "logs" / "bench-workers.log", task_queues=queues)
    server = server_process(
        DEFAULT_MODEL, EngineSettings(), port=free_port(), log_path=home / "logs" / "direct-serve.log"
    )
    server.spawn()
    worker.start()
    try:
        await asyncio.to_thread(server.wait_healthy)
        client = await connect_client()
        direct = DirectChain(ObjectStore.from_env(), server.client.openai_base_url, home)
        runs: dict[str, list[TimedRun]] = {"temporal": [], "direct": []}
        phases: dict[str, list[dict[str, float]]] = {"temporal": [], "direct": []}
        for r in range(rounds):
            for side in ("temporal", "direct"):
                spec = demo_run_spec(f"bench-orch-{side}-{r}-{uuid.uuid4().hex[:6]}", steps, queues)
                print(f"round {r + 1}/{rounds}: {side} ({steps} steps) ...", flush=True)
                if side == "temporal":
                    run = await timed_run(client, spec, watch_s)
                    assert run.status is not None
                    run_phases = [h.seconds for h in run.status.history if h.step >= 2]
                else:
                    run = await direct.run(spec)
                    run_phases = [p for n, p in direct.phase_seconds.items() if n >= 2]
                runs[side].append(run)
                phases[side] += run_phases
                print(f"  steps: {[round(s, 2) for s in run.step_seconds().values()]}", flush=True)
                print(f"  phases of steps 2..N: {run_phases}", flush=True)
    finally:
        worker.stop()
        server.stop()
    per_side = {
        side: {
            "steady_mean_s": [steady_mean(r) for r in side_runs],
            "step_s": [r.step_seconds() for r in side_runs],
            "startup_s": [r.served_at[0] for r in side_runs],
        }
        for side, side_runs in runs.items()
    }
    return {"per_side": per_side, "temporal_phases": phases["temporal"], "direct_phases": phases["direct"]}


def phase_means(rows: list[dict[str, float]]) -> dict[str, float]:
    names = sorted({k for row in rows for k in row})
    return {k: sum(row.get(k, 0.0) for row in rows) / len(rows) for k in names}


def report(results: dict[str, Any], steps: int, rounds: int) -> str:
    t = results["per_side"]["temporal"]["steady_mean_s"]
    d = results["per_side"]["direct"]["steady_mean_s"]
    ratios = [a / b for a, b in zip(t, d, strict=True)]
    lines = [
        f"Orchestration overhead, demo step (arithmetic, 4x8, 16 tokens), {steps} steps x {rounds} rounds, "
        "mean of steps 2..N per run, sides interleaved",
        "",
        "| round | direct s/step | temporal s/step | overhead |",
        "|---|---:|---:|---:|",
    ]
    for i, (a, b, q) in enumerate(zip(t, d, ratios, strict=True)):
        lines.append(f"| {i + 1} | {b:.2f} | {a:.2f} | {100 * (q - 1):+.1f} % |")
    mt, md = sum(t) / len(t), sum(d) / len(d)
    lines.append(f"| all | {md:.2f} | {mt:.2f} | {100 * (mt / md - 1):+.1f} % |")
    tp, dp = phase_means(results["temporal_phases"]), phase_means(results["direct_phases"])
    lines += ["", "Mean seconds per phase, steps 2..N (temporal: the workflow's clock)", "",
              "| phase | direct | temporal |", "|---|---:|---:|"]  # fmt: skip
    for phase in sorted(set(tp) | set(dp)):
        a, b = dp.get(phase), tp.get(phase)
        lines.append(f"| {phase} | {'' if a is None else f'{a:.2f}'} | {'' if b is None else f'{b:.2f}'} |")
    results["overhead_pct"] = 100 * (mt / md - 1)
    results["median_round_overhead_pct"] = 100 * (median(ratios) - 1)
    lines += ["", f"command: {command_line()}"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=4, help="steps per run (>= 3)")
    parser.add_argument("--rounds", type=int, default=2, help="temporal/direct pairs")
    parser.add_argument(
        "--watch-s",
        type=float,
        default=None,
        help="on the Temporal side, a client queries the run's status this often (dgrpo train: 1 s)",
    )
    args = parser.parse_args()
    with private_stack() as (_stack, home):
        results = asyncio.run(bench(args.steps, args.rounds, home, args.watch_s))
    results["command"] = command_line()
    write_results("orchestration", results, report(results, args.steps, args.rounds))


if __name__ == "__main__":
    main()
