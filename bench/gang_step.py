"""One GRPO step trained by a gang of ranks (activities/gang/), at each world size asked: seconds, trained tokens
per second, each rank's peak memory over the step and its share of the base's weights. And the one-device trainer
of this checkout against another checkout's (the N = 1 path against today's trainer), alternated.

The model is a Qwen3 shape with random weights (base_models/random_shapes.py: made once under the model cache) or
any model directory; the data random sequences (bench/synthetic.py), their sampling logprobs unknown (ratio 1).
The ranks are the worker's own (``LocalRanks``): started, loaded and joined once per world size and sharding, then
``--repeats`` steps each from the same fresh adapter (the first one not timed: warm-up). On a CPU the ranks split
the host's cores between them (a rank takes ``cores / ranks`` threads), so more ranks buy no compute there: what
they buy is each rank's share of the model.

    python bench/gang_step.py --shape qwen3-0.6b --ranks 1 2 --shard fsdp replicate [--sequences 16 --tokens 256]
    python bench/gang_step.py --shape qwen3-tiny --ranks 1 2 --repeats 2              # a dry run, seconds
    python bench/gang_step.py --against /work/main --rounds 5                           # N = 1 against today's
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from activities.gang.initial import initial_adapter  # noqa: E402
from activities.gang.local_ranks import LocalRanks, World  # noqa: E402
from activities.gang.messages import Train  # noqa: E402
from base_models.random_shapes import SHAPES, make_random_model  # noqa: E402
from base_models.resolve import ensure_smollm2  # noqa: E402
from bench.synthetic import random_sequences  # noqa: E402
from host.processes import HOST, free_port  # noqa: E402
from schemas.config import LoraConfig, ModelSpec, TrainConfig  # noqa: E402
from schemas.settings import GangSettings, dgrpo_cache  # noqa: E402

ONE_DEVICE = """
import json, sys, time, torch
from activities.trainer import Trainer
from bench.synthetic import random_sequences
from schemas.config import LoraConfig, ModelSpec, TrainConfig
base, n, tokens, mb, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
trainer = Trainer(ModelSpec(name="bench", base_model=base, lora=LoraConfig(rank=16, alpha=32)), "auto")
seqs = random_sequences(n, tokens)
seconds = []
for _ in range(repeats + 1):
    trainer.init_adapter(0)
    started = time.perf_counter()
    trainer.train_step(seqs, TrainConfig(micro_batch_size=mb), 1, mb)
    if trainer.device.type == "cuda":
        torch.cuda.synchronize()
    seconds.append(time.perf_counter() - started)
print(json.dumps({"seconds": seconds[1:]}))
"""
"""The one-device step, as code both checkouts have (run with ``PYTHONPATH`` set to each)."""


def base_model(shape: str | None, model: str | None) -> str:
    if model is not None:
        return model
    assert shape is not None
    return str(make_random_model(SHAPES[shape], Path(dgrpo_cache()) / "models" / shape, ensure_smollm2()))


def gang_figures(base: str, ranks: int, shard: str, a: argparse.Namespace) -> dict[str, Any]:
    """Steps of ``a.sequences`` x ``a.tokens`` on ``ranks`` ranks sharded ``shard``: their seconds and memory."""
    spec = ModelSpec(name="bench", base_model=base, lora=LoraConfig(rank=16, alpha=32))
    settings = GangSettings(ranks=ranks, shard=shard)  # type: ignore[arg-type]
    never = lambda: None  # noqa: E731  # a bench is never cancelled
    with tempfile.TemporaryDirectory(prefix="dgrpo-gang-bench-") as scratch:
        start = Path(scratch) / "adapter"
        start.mkdir()
        initial_adapter(spec, 0).write(start)
        local = LocalRanks(settings, Path(scratch))
        try:
            loading = time.perf_counter()
            local.load(spec, a.precision, never)
            members = ("bench",)
            world = World(
                "bench", HOST, free_port(), 0, ranks, members, settings.shard, settings.collective_timeout_s
            )
            local.join(world, never)
            formed = time.perf_counter() - loading
            seqs = random_sequences(a.sequences, a.tokens)
            config = TrainConfig(micro_batch_size=a.micro_batch)
            walls, answers = [], []
            for _ in range(a.repeats + 1):
                command = Train(1, a.micro_batch, start, None, ranks, config, seqs)
                started = time.perf_counter()
                answers = local.train([command] * ranks, None, never)
                walls.append(time.perf_counter() - started)
        finally:
            local.recycle()
    trained = int(answers[0].stats["n_trainable_tokens"])
    step = statistics.median(walls[1:])
    return {
        "ranks": ranks,
        "shard": shard,
        "load_and_join_s": round(formed, 1),
        "step_s": round(step, 2),
        "step_s_all": [round(w, 2) for w in walls[1:]],
        "trained_tokens_per_s": round(trained / step, 1),
        "peak_gib_per_rank": [round(t.peak_bytes / 2**30, 2) for t in answers],
        "base_share_per_rank": round(local.base_fraction, 3),
        "micro_batch": answers[0].micro_batch,
        "gradient_checkpointing": answers[0].gradient_checkpointing,
    }


def one_device_seconds(root: Path, base: str, a: argparse.Namespace) -> list[float]:
    """Timed steps of the one-device trainer of the checkout at ``root`` (in a process of its own)."""
    env = {**os.environ, "PYTHONPATH": str(root), "DGRPO_CPU_SHARE_DIR": "off"}
    argv = [sys.executable, "-c", ONE_DEVICE, base, str(a.sequences), str(a.tokens), str(a.micro_batch),
            str(a.repeats)]  # fmt: skip
    done = subprocess.run(argv, env=env, cwd=root, capture_output=True, text=True, check=True)
    seconds: list[float] = json.loads(done.stdout.strip().splitlines()[-1])["seconds"]
    return seconds


def one_device_against(other: Path, base: str, a: argparse.Namespace) -> dict[str, Any]:
    """The one-device step of this checkout and of ``other``, alternated ``a.rounds`` times."""
    times: dict[str, list[float]] = {"this checkout": [], str(other): []}
    for _ in range(a.rounds):
        for name, root in (("this checkout", REPO), (str(other), other)):
            times[name] += one_device_seconds(root, base, a)
    return {name: {"median_s": round(statistics.median(s), 3), "all": [round(x, 3) for x in s]}
            for name, s in times.items()}  # fmt: skip


def table(figures: dict[str, Any]) -> str:
    """The figures as the markdown table docs/scaling-out.md shows."""
    rows = ["| ranks | sharding | s / step | trained tokens / s | peak GiB per rank | base share per rank |",
            "|---:|---|---:|---:|---|---:|"]  # fmt: skip
    if "one_device_step_s" in figures:
        rows.append(f"| 1 (the worker's own trainer) | | {figures['one_device_step_s']} | | | 1.0 |")
    for g in figures.get("gang", []):
        peaks = ", ".join(f"{p:.2f}" for p in g["peak_gib_per_rank"])
        rows.append(f"| {g['ranks']} | {g['shard']} | {g['step_s']} | {g['trained_tokens_per_s']} | {peaks} | "
                    f"{g['base_share_per_rank']} |")  # fmt: skip
    for name, one in figures.get("one_device", {}).items():
        rows.append(f"| 1 ({name}) | | {one['median_s']} | | | |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3-0.6b")
    parser.add_argument("--model", help="a model directory instead of a shape (under DGRPO_MODEL_ROOTS)")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--shard", nargs="+", default=["fsdp", "replicate"], choices=["fsdp", "replicate"])
    parser.add_argument("--sequences", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    parser.add_argument("--repeats", type=int, default=3, help="timed steps (after one not timed)")
    parser.add_argument("--one-device", action="store_true", help="also the worker's own trainer (no ranks)")
    parser.add_argument(
        "--against", type=Path, help="another checkout: its one-device step against this one's"
    )
    parser.add_argument("--rounds", type=int, default=5, help="--against: alternations")
    parser.add_argument("--out", type=Path, help="also write the figures here (JSON)")
    a = parser.parse_args()
    base = base_model(a.shape, a.model)
    figures: dict[str, Any] = {"model": a.model or a.shape, "sequences": a.sequences, "tokens": a.tokens,
                               "cores": len(os.sched_getaffinity(0))}  # fmt: skip
    if a.against is not None:
        figures["one_device"] = one_device_against(a.against, base, a)
    else:
        if a.one_device:
            seconds = statistics.median(one_device_seconds(REPO, base, a))
            figures["one_device_step_s"] = round(seconds, 2)
        # one rank is the same sharded or not
        figures["gang"] = [gang_figures(base, n, shard, a) for n in a.ranks for shard in a.shard
                           if not (n == 1 and shard == "replicate")]  # fmt: skip
    text = json.dumps(figures, indent=2)
    print(text)
    print(table(figures))
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
