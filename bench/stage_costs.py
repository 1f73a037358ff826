"""Where a demo step's time goes: each stage's wall time split into its compute and everything durability adds.

The demo's task and settings (examples/run.toml: SmolLM2-135M, LoRA r16/a32, 4 prompts x 8 = 32 short
rollouts), on a private embedded stack (Temporal + SeaweedFS), two sides alternated per round:

- ``temporal``: a sync ``TrainingRun`` on a real ``dgrpo worker all``; from the run's history, per stage, the
  time from scheduled to started (Temporal's queue), from started to closed (the activity), and from the
  previous activity's close to this one's schedule (the workflow task between them).
- ``direct``: the same activity methods called one after the other in this process (the workflow's order,
  ``ActivityEnvironment``), against a CPU server run in this process too, with every piece of each stage timed
  under one label: compute (the trainer's forward/backward/optimizer, the advantages' arithmetic), S3 reads
  and writes, Parquet, pydantic (de)serialisation of trajectories, tokenization, sha256 hashing, model and state
  loads, state serialisation, the server's adapter load. Time a stage spends outside every label is ``other``.

Medians over steps 2..N of every round (step 1 warms up). A step's checkpoint is ``servable`` once its adapter is
up (``publish_adapter``), reloaded, then made ``resumable`` (``publish``: the optimizer and trainer state, beside
the next step's rollouts through Temporal; after the reload here). Targets (issues 35, 46): train beyond compute
<= 0.15 s, publish-to-servable <= 0.15 s, reload <= 0.15 s, advantages <= 0.05 s, Temporal's schedule -> start
summed over a step's stages <= 0.1 s.

    PYTHONPATH=$PWD python bench/stage_costs.py [--steps 8] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import inspect
import os
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvicorn
from temporalio.client import Client
from temporalio.testing import ActivityEnvironment

import activities.checkpoints as checkpoints
import activities.object_store as object_store
import activities.trajectory_store as trajectory_store
import serving.server as server_module
from activities import advantages as advantages_module
from activities import training as training_module
from activities.advantages import AdvantagesActivities
from activities.early_upload import EarlyUploads
from activities.object_store import ObjectStore
from activities.rollouts import RolloutActivities
from activities.serving import ServingActivities
from activities.trainer import Trainer
from activities.training import TrainerActivities
from bench.bench_stack import (
    activity_spans,
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
    InitialAdapterInput,
    PublishInput,
    ReloadInput,
    TrainInput,
)
from schemas.config import RunSpec, TaskQueues
from schemas.settings import ENV_HOME
from serving.batcher import GenerationEngine
from serving.client import ServingClient
from serving.options import ServerOptions
from serving.server import create_server
from workers.launcher import WorkerProcess
from workers.temporal import connect_client
from workers.worker import DEFAULT_MODEL

STAGES = ("rollouts", "advantages", "train", "servable", "reload", "resumable")
"""A step's stages in order: ``servable`` is publish-to-servable (``publish_adapter``: the adapter and its
manifest), ``resumable`` the rest of the checkpoint (``publish``), which runs beside the next step's rollouts."""
TARGETS = {"train": 0.15, "servable": 0.15, "reload": 0.15, "advantages": 0.05}
"""Seconds a stage may take beyond its compute (issues 35 and 46), medians on this CPU."""
COMPUTE = "compute"
BESIDE = ("stager", "early-upload")
"""Threads whose work runs beside the stages (the trainer writing a step's files, its adapter going up early):
what a stage waits for them shows as its own wait."""
STAGE_OF = {
    "compute_advantages": "advantages",
    "merge_rollouts": "rollouts",
    "judge": "rollouts",
    "publish_adapter": "servable",
    "publish": "resumable",
}
"""Activities counted in another stage than their name."""


class Spans:
    """Seconds per (stage, label), each call counted once: a labelled call inside another is taken out of the
    outer one (per thread); ``within`` takes a label's time out of another label's (work another thread does
    for a call that waits on it: the server's load inside the client's request)."""

    def __init__(self) -> None:
        self.stage: str | None = None
        self.seconds: dict[tuple[str, str], float] = collections.defaultdict(float)
        self.within: dict[str, str] = {}
        self._local = threading.local()

    def _stack(self) -> list[float]:
        if not hasattr(self._local, "stack"):
            self._local.stack = []
        stack: list[float] = self._local.stack
        return stack

    def _add(self, label: str, elapsed: float, children: float) -> None:
        if self.stage is None or threading.current_thread().name.startswith(BESIDE):
            return
        self.seconds[(self.stage, label)] += elapsed - children
        outer = self.within.get(label)
        if outer is not None:
            self.seconds[(self.stage, outer)] -= elapsed

    def wrap(self, owner: Any, name: str, label: str, within: str | None = None) -> None:
        """Time ``owner.name`` under ``label`` from now on (nothing, where the code has no such name: the same
        bench runs on an older checkout)."""
        if not hasattr(owner, name):
            return
        original: Callable[..., Any] = getattr(owner, name)
        if within is not None:
            self.within[label] = within
        if inspect.iscoroutinefunction(original):

            @functools.wraps(original)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                started = time.perf_counter()
                try:
                    return await original(*args, **kwargs)
                finally:
                    self._add(label, time.perf_counter() - started, 0.0)

            setattr(owner, name, async_wrapper)
            return

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            stack = self._stack()
            stack.append(0.0)
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - started
                children = stack.pop()
                if stack:
                    stack[-1] += elapsed
                self._add(label, elapsed, children)

        setattr(owner, name, wrapper)

    def take(self) -> dict[str, dict[str, float]]:
        """Seconds per stage and label since the last ``take``."""
        out: dict[str, dict[str, float]] = collections.defaultdict(dict)
        for (stage, label), seconds in self.seconds.items():
            out[stage][label] = seconds
        self.seconds.clear()
        return out


def instrument(spans: Spans) -> None:
    """Label every piece of the stages this bench knows of."""
    store = ObjectStore
    for name in ("get_bytes", "_put_stream", "get_file", "_get_verified", "exists", "list"):
        spans.wrap(store, name, "S3")
    for module in (object_store, checkpoints):
        spans.wrap(module, "sha256_file", "sha256")
    spans.wrap(trajectory_store, "_read_table", "Parquet")
    spans.wrap(trajectory_store, "_parquet_bytes", "Parquet")
    spans.wrap(trajectory_store, "table_to_groups", "trajectories <-> pydantic")
    spans.wrap(trajectory_store, "groups_to_table", "trajectories <-> pydantic")
    spans.wrap(trajectory_store, "advantages_of", "trajectories <-> pydantic")
    spans.wrap(advantages_module, "compute_step_advantages", COMPUTE)
    spans.wrap(training_module, "build_sequences", "tokenization")
    spans.wrap(training_module, "run_tokenizer", "tokenization")
    spans.wrap(Trainer, "train_step", COMPUTE)
    spans.wrap(Trainer, "load_state", "state load")
    spans.wrap(Trainer, "init_adapter", "state load")
    spans.wrap(Trainer, "save_state", "state serialisation")
    spans.wrap(Trainer, "snapshot", "state copy")
    spans.wrap(TrainerActivities, "_written", "waiting for staged files")
    spans.wrap(EarlyUploads, "done", "waiting for the early adapter upload")
    spans.wrap(TrainerActivities, "trainer_for", "model load")
    spans.wrap(training_module, "check_finite_adapter", "finite check")
    spans.wrap(training_module, "check_finite_weights", "finite check")
    spans.wrap(ServingClient, "load_adapter", "server request")
    spans.wrap(ServingClient, "adapters", "server request")
    spans.wrap(ServingClient, "unload_adapter", "server request")
    spans.wrap(server_module, "verify_adapter_dir", "server: sha256", within="server request")
    spans.wrap(GenerationEngine, "_load_adapter", "server: adapter load", within="server request")
    spans.wrap(GenerationEngine, "_delete_adapter", "server: adapter unload", within="server request")


class InProcessServer:
    """Our CPU server in this process (so its adapter load can be timed), on a free port."""

    def __init__(self, adapter_root: Path) -> None:
        self.port = free_port()
        options = ServerOptions(model=DEFAULT_MODEL, port=self.port, adapter_root=str(adapter_root))
        app, self.engine = create_server(options)
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 300
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the in-process server did not start")
            time.sleep(0.1)
        return f"http://127.0.0.1:{self.port}/v1"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)


class DirectSteps:
    """A sync run's stages called in this process, each under ``spans.stage``."""

    def __init__(self, store: ObjectStore, server_url: str, home: Path, spans: Spans) -> None:
        self.serving = ServingActivities([server_url], store, adapter_root=home / "adapters")
        self.rollouts = RolloutActivities([server_url], store, serving=self.serving)
        self.advantages = AdvantagesActivities(store)
        self.trainer = TrainerActivities(store, home / "direct-staging", worker_id="direct")
        self.spans = spans

    async def _stage(self, stage: str, call: Callable[[], Any]) -> tuple[Any, float]:
        self.spans.stage = stage
        started = time.perf_counter()
        try:
            return await call(), time.perf_counter() - started
        finally:
            self.spans.stage = None

    async def run(self, spec: RunSpec) -> list[dict[str, Any]]:
        """Per step: each stage's wall seconds and its labelled pieces."""
        env = ActivityEnvironment()
        initial = InitialAdapterInput(run_id=spec.run_id, model=spec.model, seed=spec.train.seed)
        checkpoint = await env.run(self.trainer.publish_initial, initial)
        await env.run(self.serving.reload, reload_input(spec, checkpoint))
        self.spans.take()
        steps = []
        for step in range(1, spec.steps + 1):
            walls: dict[str, float] = {}
            rollouts = step_rollouts(spec, step)
            scored, walls["rollouts"] = await self._stage(
                "rollouts", lambda r=rollouts: env.run(self.rollouts.rollouts, r)
            )
            inp = AdvantagesInput(run_id=spec.run_id, step=step, trajectories=scored, train=spec.train)
            advantages, walls["advantages"] = await self._stage(
                "advantages", lambda i=inp: env.run(self.advantages.compute_advantages, i)
            )
            train = TrainInput(
                run_id=spec.run_id,
                step=step,
                model=spec.model,
                advantages=advantages.ref,
                train=spec.train,
                start_from=checkpoint,
            )
            trained, walls["train"] = await self._stage(
                "train", lambda t=train: env.run(self.trainer.train, t)
            )
            publish = PublishInput(
                run_id=spec.run_id,
                step=step,
                staging_dir=trained.staging_dir,
                metrics={"loss": trained.loss, "grad_norm": trained.grad_norm},
            )
            adapter, walls["servable"] = await self._stage(
                "servable", lambda p=publish: env.run(self.trainer.publish_adapter, p)
            )
            _, walls["reload"] = await self._stage(
                "reload", lambda a=adapter: env.run(self.serving.reload, reload_input(spec, a))
            )
            checkpoint, walls["resumable"] = await self._stage(
                "resumable", lambda p=publish: env.run(self.trainer.publish, p)
            )
            pieces = self.spans.take()
            steps.append({"step": step, "wall": walls, "pieces": {s: pieces.get(s, {}) for s in STAGES}})
        return steps


def reload_input(spec: RunSpec, checkpoint: Any) -> ReloadInput:
    return ReloadInput(
        model_name=spec.model.name,
        checkpoint=checkpoint,
        serving=spec.serving,
        lora_rank=spec.model.lora.rank,
    )


async def temporal_stages(client: Client, run_id: str) -> list[dict[str, Any]]:
    """Per step of a finished sync run (every run of its continue-as-new chain): each stage's queue time
    (scheduled -> started), its run time (started -> closed) and the workflow's time before it (the previous
    stage activity's close -> its schedule)."""
    rows: dict[int, dict[str, dict[str, float]]] = collections.defaultdict(dict)
    spans = [(STAGE_OF.get(span.name, span.name), span) for span in await activity_spans(client, run_id)]
    # The resumable stage runs beside the next step: the chain's gaps are between the others.
    closes = sorted(span.closed for stage, span in spans if stage in STAGES and stage != "resumable")
    for stage, span in spans:
        if stage not in STAGES or span.step < 1:
            continue
        row = rows[span.step].setdefault(stage, {})
        row["queue"] = row.get("queue", 0.0) + span.started - span.scheduled
        row["activity"] = row.get("activity", 0.0) + span.closed - span.started
        before = [close for close in closes if close <= span.scheduled]
        if before and stage != "resumable":
            row["workflow"] = row.get("workflow", 0.0) + span.scheduled - before[-1]
    return [{"step": step, "stages": stages} for step, stages in sorted(rows.items())]


async def bench(steps: int, rounds: int, home: Path) -> dict[str, Any]:
    spans = Spans()
    instrument(spans)
    queues = TaskQueues(
        control=f"bench-control-{uuid.uuid4().hex[:6]}",
        inference=f"bench-inference-{uuid.uuid4().hex[:6]}",
        trainer=f"bench-trainer-{uuid.uuid4().hex[:6]}",
    )
    worker = WorkerProcess("all", home / "logs" / "bench-workers.log", task_queues=queues)
    worker.start()
    results: dict[str, Any] = {"temporal": [], "direct": []}
    try:
        client = await connect_client()
        with InProcessServer(home / "adapters") as url:
            direct = DirectSteps(ObjectStore.from_env(), url, home, spans)
            for r in range(rounds):
                for side in ("temporal", "direct"):
                    spec = demo_run_spec(f"bench-costs-{side}-{r}-{uuid.uuid4().hex[:6]}", steps, queues)
                    print(f"round {r + 1}/{rounds}: {side} ({steps} steps) ...", flush=True)
                    if side == "temporal":
                        await timed_run(client, spec)
                        results[side] += await temporal_stages(client, spec.run_id)
                    else:
                        results[side] += await direct.run(spec)
    finally:
        worker.stop()
    results["load"] = os.getloadavg()
    return results


def _med(values: list[float]) -> float:
    return median(values) if values else float("nan")


def report(results: dict[str, Any], steps: int, rounds: int) -> str:
    load = ", ".join(f"{x:.1f}" for x in results["load"])
    direct = [s for s in results["direct"] if s["step"] >= 2]
    temporal = [s for s in results["temporal"] if s["step"] >= 2]
    lines = [
        f"Stage costs, demo step (32 rollouts, SmolLM2-135M, LoRA r16), {steps} steps x {rounds} rounds, medians "
        f"of steps 2..N; load average at the end {load}",
        "",
        "In this process (direct): each stage's wall and its pieces, median seconds",
        "",
    ]
    labels = sorted(
        {label for s in direct for pieces in s["pieces"].values() for label in pieces} - {COMPUTE}
    )
    lines += [
        "| stage | wall | compute | beyond compute | target | " + " | ".join(labels) + " | other |",
        "|---|---:|---:|---:|---:|" + "---:|" * (len(labels) + 1),
    ]
    summary: dict[str, Any] = {}
    for stage in STAGES:
        walls = [s["wall"][stage] for s in direct]
        pieces = [s["pieces"][stage] for s in direct]
        compute = [p.get(COMPUTE, 0.0) for p in pieces]
        beyond = [w - c for w, c in zip(walls, compute, strict=True)]
        other = [w - sum(p.values()) for w, p in zip(walls, pieces, strict=True)]
        cells = [f"{_med([p.get(label, 0.0) for p in pieces]):.3f}" for label in labels]
        target = TARGETS.get(stage)
        summary[stage] = {"wall": _med(walls), "compute": _med(compute), "beyond_compute": _med(beyond)}
        lines.append(
            f"| {stage} | {_med(walls):.3f} | {_med(compute):.3f} | {_med(beyond):.3f} | "
            f"{'' if target is None else f'{target:.2f}'} | " + " | ".join(cells) + f" | {_med(other):.3f} |"
        )
    lines += [
        "",
        "Through Temporal (a sync TrainingRun on `dgrpo worker all`), from the history, median seconds",
        "",
        "| stage | queue (scheduled -> started) | activity (started -> closed) | workflow before it |",
        "|---|---:|---:|---:|",
    ]
    for stage in STAGES:
        rows = [s["stages"].get(stage, {}) for s in temporal]
        cells = [_med([r[k] for r in rows if k in r]) for k in ("queue", "activity", "workflow")]
        lines.append(f"| {stage} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
    queue = [sum(r.get("queue", 0.0) for r in s["stages"].values()) for s in temporal]
    flow = [sum(r.get("workflow", 0.0) for r in s["stages"].values()) for s in temporal]
    summary["temporal_queue_per_step"] = _med(queue)
    summary["workflow_per_step"] = _med(flow)
    lines += [
        "",
        f"Temporal's queue time summed over a step's stages: median {_med(queue):.3f} s (target 0.1); the "
        f"workflow tasks between them: {_med(flow):.3f} s",
        "",
        f"command: {command_line()}",
    ]
    results["summary"] = summary
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--steps", type=int, default=8, help="steps per run (>= 2; a run's first 3 reloads inject)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="temporal/direct pairs")
    args = parser.parse_args()
    with private_stack() as (_stack, home):
        os.environ[ENV_HOME] = str(home)
        results = asyncio.run(bench(args.steps, args.rounds, home))
    results["command"] = command_line()
    markdown = report(results, args.steps, args.rounds)
    write_results("stage_costs", results, markdown)


if __name__ == "__main__":
    main()
