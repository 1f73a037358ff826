"""Qwen3's production shapes on one GPU, with random weights: what changes with a model's size.

No model of those sizes can be downloaded on a lent GPU, so each size of Qwen3 (0.6B, 4B, 8B: their layers,
widths and heads, base_models/random_shapes.py) is made there with random weights and SmolLM2's tokenizer, and
measured, as time allows (``--budget-s``):

- ``trainer <shape>`` (shape_figures.py): torch + peft on the GPU, LoRA rank 16 on every projection, precision
  ``auto`` (bf16): the micro-batch and checkpointing the trainer plans, tokens/s of a GRPO step and its peak
  memory, the halving chain from micro-batch ``--oom-start`` to the largest that runs without CUDA's OOM (and what
  the plan would have taken), the adapter's size and its publish seconds to S3 (the embedded stack's SeaweedFS);
- ``vllm <shape>``: vLLM started as the inference worker starts it (bf16): start seconds, generated tokens/s of
  the base model and with adapters, the published adapter's reload (download, load, first token);
- ``runs``: at the largest shape with trainer figures, a 3-step pipelined and a 3-step shared (vLLM sleeps while
  the trainer trains) TrainingRun on a real ``dgrpo worker all``: seconds per step and per phase, and the
  pipelined step over max(rollouts, train).

The vLLM servers' and workers' logs go to ``<out>/logs.tar.gz``. Tasks run in this order, each only when its estimate (``ESTIMATE_S``) fits the time left: trainer 0.6B, vLLM 0.6B,
trainer 4B, trainer 8B, runs, vLLM 4B, vLLM 8B. ``<out>/shapes.json`` is rewritten after every figure, so a run
cut short leaves every figure it measured; tasks skipped, and why, are in it too. Every figure is of random
weights: rewards mean nothing, speed and memory are the point.

    python deploy/gpu/production_shapes.py --out $OUT/shapes           # the GPU, after install-offline.sh
    python deploy/gpu/production_shapes.py --plan                        # the tasks and estimates, nothing run
    python deploy/gpu/production_shapes.py --device cpu --tiny --budget-s 1800 --out /tmp/dry   # the plumbing
    python deploy/gpu/production_shapes.py --table deploy/gpu/results/<date>-shapes   # docs' table from results
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import shutil
import statistics
import sys
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(Path(__file__).resolve().parent)]

from shapes_table import table  # noqa: E402

from base_models.random_shapes import (  # noqa: E402
    QWEN3_0_6B,
    QWEN3_4B,
    QWEN3_8B,
    QWEN3_TINY,
    RANDOM_WEIGHTS_NOTE,
    SHAPES,
    Shape,
)
from host.files import write_json_atomic  # noqa: E402

VOCAB = 49152
ESTIMATE_S = {"model": (5, 5), "trainer": (30, 10), "vllm": (120, 10), "runs": (240, 30)}
"""Seconds a task is expected to take, (fixed, per billion parameters): guesses from the H200's SmolLM2 figures
(vLLM's start alone took 176 s there), to be replaced by what a GPU run measures."""
KINDS = ("trainer", "vllm", "runs")
RUN_STEPS = 3
TINY_SIZES = {
    "sequences": 8,
    "tokens": 128,
    "oom_start": 4,
    "oom_tokens": 128,
    "concurrency": 8,
    "max_tokens": 16,
}
"""``--tiny``'s sizes: the plumbing in minutes on a CPU."""


class Results:
    """``shapes.json``: every figure, written again as each one comes."""

    def __init__(self, path: Path, header: dict[str, Any]) -> None:
        self.path = path
        self.data: dict[str, Any] = {
            "weights": RANDOM_WEIGHTS_NOTE,
            **header,
            "shapes": {},
            "skipped": [],
            "errors": [],
        }
        self.write()

    def write(self) -> None:
        write_json_atomic(self.path, self.data)

    def recorder(self, *keys: str) -> Callable[[str, Any], None]:
        """``record(key, value)`` into ``data[keys...][key]``, written at once."""

        def record(key: str, value: Any) -> None:
            node = self.data
            for k in keys:
                node = node.setdefault(k, {})
            node[key] = value
            print(f"{'/'.join(keys)}/{key}: {json.dumps(value)}", flush=True)
            self.write()

        return record

    def note(self, kind: str, task: str, why: str) -> None:
        self.data[kind].append({"task": task, "why": why})
        print(f"{kind}: {task}: {why}", flush=True)
        self.write()


def estimate(task: str, shape: Shape) -> float:
    fixed, per_billion = ESTIMATE_S[task]
    return fixed + per_billion * shape.parameters(VOCAB) / 1e9


def tasks(shapes: list[Shape], kinds: list[str]) -> list[tuple[str, Shape | None]]:
    """The order: the first shape's trainer and vLLM, the other shapes' trainers, the runs (shape None: the
    largest that fits, chosen when their turn comes), the other vLLMs; only tasks of ``kinds``."""
    first, rest = shapes[0], shapes[1:]
    order = [
        ("trainer", first), ("vllm", first), *[("trainer", s) for s in rest], ("runs", None),
        *[("vllm", s) for s in rest],
    ]  # fmt: skip
    return [(kind, shape) for kind, shape in order if kind in kinds]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--shapes",
        nargs="+",
        choices=sorted(SHAPES),
        default=[s.name for s in (QWEN3_0_6B, QWEN3_4B, QWEN3_8B)],
    )
    parser.add_argument("--tiny", action="store_true", help="the tests' tiny shape only (a CPU dry run)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--budget-s", type=float, default=450.0, help="stop starting tasks after this long")
    parser.add_argument("--out", type=Path, help="default: deploy/gpu/results/<date>-shapes")
    parser.add_argument("--work", type=Path, default=Path(os.environ.get("DGRPO_GPU_WORK", "/tmp/dgrpo-gpu")))
    parser.add_argument("--sequences", type=int, default=32, help="sequences of a timed GRPO step")
    parser.add_argument("--tokens", type=int, default=1024, help="tokens per sequence (a third prompt)")
    parser.add_argument("--oom-start", type=int, default=64, help="micro-batch the halving chain starts at")
    parser.add_argument("--oom-tokens", type=int, default=2048, help="tokens per sequence in the chain")
    parser.add_argument("--concurrency", type=int, default=64, help="concurrent vLLM requests")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens each vLLM request generates")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.85, help="vLLM's share alone")
    parser.add_argument("--tasks", nargs="+", choices=KINDS, default=list(KINDS), help="kinds of task to run")
    parser.add_argument(
        "--plan", action="store_true", help="print the tasks and their estimates; run nothing"
    )
    parser.add_argument("--table", type=Path, help="print the docs' table from this results directory")
    a = parser.parse_args()
    if a.table:
        print(table(json.loads((a.table / "shapes.json").read_text())))
        return
    shapes = [QWEN3_TINY] if a.tiny else [SHAPES[name] for name in a.shapes]
    if a.tiny:
        vars(a).update(TINY_SIZES)
    if a.plan:
        for task, shape in tasks(shapes, a.tasks):
            target = shape or shapes[-1]
            where = target.name if shape else f"the largest that fits, at most {target.name}"
            print(
                f"{task:8} {where}: ~{estimate(task, target):.0f} s (+{estimate('model', target):.0f} s to make it)"
            )
        return
    run(a, shapes)


def run(a: argparse.Namespace, shapes: list[Shape]) -> None:
    import torch

    from schemas.settings import ENV_CACHE, ENV_MODEL_ROOTS

    deadline = time.monotonic() + a.budget_s
    out = a.out or REPO / "deploy" / "gpu" / "results" / f"{datetime.date.today().isoformat()}-shapes"
    out.mkdir(parents=True, exist_ok=True)
    work = a.work.absolute()
    models = work / "models"
    os.environ.setdefault(ENV_CACHE, str(work / "cache"))  # the converted SmolLM2 (its tokenizer)
    os.environ[ENV_MODEL_ROOTS] = str(models)  # the trainer reads base_model only from under its roots
    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --device cpu --tiny for the plumbing")
    device_name = torch.cuda.get_device_name(0) if a.device == "cuda" else "cpu"
    results = Results(out / "shapes.json", {
        "device": device_name, "torch": torch.__version__, "started": datetime.datetime.now().isoformat(),
        "command": " ".join(sys.argv), "budget_s": a.budget_s,
        "plan": [f"{task} {shape.name if shape else 'largest that fits'}" for task, shape in tasks(shapes, a.tasks)],
    })  # fmt: skip
    from workers.stack import EmbeddedStack

    stack = EmbeddedStack(work / "stack", free_ports=True, ui=False, tied_to_parent=True)
    stack.start()
    try:
        for name, value in stack.env().items():
            os.environ[name] = value
        Session(a, shapes, results, stack, models, work, deadline).run_all()
    finally:
        stack.stop()
        # The servers' and workers' logs as one file beside the results (a lent GPU returns at most 8 files).
        shutil.make_archive(str(out / "logs"), "gztar", work, "logs")
    print(f"results: {out / 'shapes.json'}\n\n{table(results.data)}")


class Session:
    """The tasks of one invocation, and what they leave for each other (models, checkpoints, adapters)."""

    def __init__(self, a: argparse.Namespace, shapes: list[Shape], results: Results, stack: Any, models: Path,
                 work: Path, deadline: float) -> None:  # fmt: skip
        from activities.object_store import ObjectStore

        self.a, self.shapes, self.results, self.stack = a, shapes, results, stack
        self.models, self.work, self.deadline = models, work, deadline
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.store = ObjectStore(stack.s3_settings)
        self.store.ensure_bucket()
        self.checkpoints: dict[str, Any] = {}

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run_all(self) -> None:
        for task, shape in tasks(self.shapes, self.a.tasks):
            if task == "runs":
                shape = next((s for s in reversed(self.shapes) if s.name in self.checkpoints
                              and estimate("runs", s) <= self.left()), None)  # fmt: skip
                if shape is None:
                    self.results.note(
                        "skipped", "runs", f"no shape with trainer figures fits the {self.left():.0f} s left"
                    )
                    continue
            assert shape is not None
            label = f"{task} {shape.name}"
            needed = estimate(task, shape) + (0 if self.made(shape) else estimate("model", shape))
            if needed > self.left():
                self.results.note("skipped", label, f"estimate {needed:.0f} s, {self.left():.0f} s left")
                continue
            if task == "vllm" and shape.name not in self.checkpoints:
                self.results.note("skipped", label, "its trainer task published no adapter to reload")
                continue
            work = {"trainer": self.trainer, "vllm": self.vllm, "runs": self.runs}[task]
            try:
                work(shape)
            except Exception as err:  # one task's failure leaves the others their chance
                self.results.note(
                    "errors", label, "".join(traceback.format_exception_only(err)).strip()[-600:]
                )

    def made(self, shape: Shape) -> bool:
        return (self.models / shape.name / "random_model.json").is_file()

    def model(self, shape: Shape) -> Path:
        import torch
        from shape_figures import release

        from base_models.random_shapes import make_random_model
        from base_models.resolve import ensure_smollm2

        if not self.made(shape):
            started = time.perf_counter()
            dtype = "bfloat16" if self.a.device == "cuda" else "float32"
            path = make_random_model(
                shape, self.models / shape.name, ensure_smollm2(), dtype=dtype, device=self.a.device
            )
            release(
                torch.device(self.a.device)
            )  # the made model's memory, for vLLM's start beside this process
            size = sum(p.stat().st_size for p in path.iterdir())
            record = self.results.recorder("shapes", shape.name)
            record("model", {"parameters": shape.parameters(VOCAB), "dtype": dtype, "disk_gib": round(size / 2**30, 2),
                             "make_s": round(time.perf_counter() - started, 1), "weights": RANDOM_WEIGHTS_NOTE})  # fmt: skip
        return self.models / shape.name

    def sizes(self) -> Any:
        from shape_figures import Sizes

        a = self.a
        return Sizes(a.sequences, a.tokens, a.oom_start, a.oom_tokens, a.concurrency, a.max_tokens)

    def trainer(self, shape: Shape) -> None:
        from shape_figures import trainer_figures

        record = self.results.recorder("shapes", shape.name, "trainer")
        model, staging = self.model(shape), self.work / "staging"
        self.checkpoints[shape.name] = trainer_figures(
            shape, model, self.a.device, self.sizes(), self.store, staging, record
        )

    def vllm(self, shape: Shape) -> None:
        from shape_figures import vllm_figures

        from schemas.settings import EngineSettings

        cuda = self.a.device == "cuda"
        settings = EngineSettings(
            engine="vllm", dtype="bf16" if cuda else "auto", max_lora_rank=16, max_loras=4,
            gpu_memory_utilization=self.a.gpu_memory_utilization if cuda else None,
        )  # fmt: skip
        other = self.work / "staging" / shape.name / "other"
        vllm_figures(
            self.model(shape), settings, self.sizes(), self.checkpoints[shape.name], other, self.store,
            self.work / "adapters", self.logs / f"vllm-{shape.name}.log",
            self.results.recorder("shapes", shape.name, "vllm"),
        )  # fmt: skip

    def runs(self, shape: Shape) -> None:
        asyncio.run(self._runs(shape))

    async def _runs(self, shape: Shape) -> None:
        from schemas.config import TaskQueues
        from schemas.settings import ENV_HOME
        from workers.launcher import WorkerProcess
        from workers.temporal import connect_client

        record = self.results.recorder("runs")
        record("shape", shape.name)
        cpu = self.a.device == "cpu"
        suffix = uuid.uuid4().hex[:6]
        queues = TaskQueues(control=f"sh-c-{suffix}", inference=f"sh-i-{suffix}", trainer=f"sh-t-{suffix}")
        flags = ["--model", str(self.model(shape))]
        if not cpu:  # vLLM sleeps in shared mode; both share the GPU in every mode
            flags += ["--engine", "vllm", "--dtype", "bf16", "--sleep-mode", "--max-lora-rank", "16",
                      "--gpu-memory-utilization", "0.35"]  # fmt: skip
        record("worker_flags", flags)
        home = self.work / f"worker-{suffix}"
        worker = WorkerProcess("all", self.logs / f"worker-{shape.name}.log", task_queues=queues,
                               env={ENV_HOME: str(home)}, cwd=REPO, extra_args=flags)  # fmt: skip
        started = time.perf_counter()
        worker.start()
        try:
            record("worker_start_s", round(time.perf_counter() - started, 1))
            client = await connect_client(address=self.stack.temporal_address)
            for mode in ("shared", "pipelined"):
                spec = run_spec(f"shapes-{mode}-{suffix}", shape, self.model(shape), queues, mode, cpu)
                record(mode, await one_run(client, spec))
            record("pipelined_over_max_r_t", pipelined_ratio(self.results.data["runs"]))
        finally:
            worker.stop()


def run_spec(run_id: str, shape: Shape, model: Path, queues: Any, mode: str, cpu: bool) -> Any:
    from schemas.config import RunSpec

    max_tokens = 16 if cpu else 256
    scenarios = [{"id": f"s{i}", "item": item, "max_tokens": max_tokens}
                 for i, item in enumerate(("anvil", "bucket", "candle", "drum"))]  # fmt: skip
    return RunSpec.model_validate({
        "run_id": run_id, "steps": RUN_STEPS, "mode": mode, "groups_per_step": 4, "group_size": 8,
        "model": {"name": run_id, "base_model": str(model), "lora": {"rank": 16, "alpha": 32}},
        "task": {"rollout": "examples.shape_check:rollout", "scenarios": scenarios},
        "train": {"learning_rate": 1e-4}, "task_queues": queues.model_dump(), "metrics": {"wandb": False},
    })  # fmt: skip


async def one_run(client: Any, spec: Any) -> dict[str, Any]:
    from dgrpo.client import run_control

    started = time.perf_counter()
    handle = await run_control.start_run(client, spec)
    final = await asyncio.wait_for(run_control.watch(handle, lambda _: None, interval=0.5), 1800)
    return {
        "wall_s": round(time.perf_counter() - started, 1),
        "steps": [
            {
                "step": h.step,
                "policy_step": h.policy_step,
                "seconds": h.seconds,
                "mean_importance_ratio": h.train_metrics.get("loss/mean_importance_ratio"),
            }
            for h in final.history
        ],
        "phase": final.phase,
    }


def pipelined_ratio(runs: dict[str, Any]) -> dict[str, float] | None:
    """The pipelined step (median of steps 2..) over max(rollouts, train), each the shared run's median."""
    shared, pipelined = runs.get("shared"), runs.get("pipelined")
    if not shared or not pipelined or len(pipelined["steps"]) < 2:
        return None
    rollouts = statistics.median(
        s["seconds"].get("rollouts", 0) + s["seconds"].get("judge", 0) for s in shared["steps"]
    )
    train = statistics.median(s["seconds"]["train"] for s in shared["steps"])
    step = statistics.median(s["seconds"]["step"] for s in pipelined["steps"][1:])
    return {
        "pipelined_step_s": step,
        "rollouts_s": rollouts,
        "train_s": train,
        "ratio": round(step / max(rollouts, train), 3),
    }


if __name__ == "__main__":
    main()
