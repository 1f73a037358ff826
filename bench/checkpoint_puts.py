"""How long SeaweedFS (the embedded stack's S3) takes to store a demo-sized checkpoint, alone.

A checkpoint of the demo's adapter (SmolLM2-135M, LoRA r16 on all linear layers) is its adapter (19.5 MB), its
optimizer state (39 MB) and small files; ``publish`` uploads them with ``ObjectStore.put_dir``, four at a
time, the manifest last. This writes ``--checkpoints`` such directories (random bytes: nothing to compress) one
after the other under a run's checkpoint keys and prints each one's seconds: the store's share of
``publish`` in bench/stage_costs.py, without the trainer's work around it.

    PYTHONPATH=$PWD python bench/checkpoint_puts.py [--checkpoints 14]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from activities.object_store import ObjectStore
from bench.bench_stack import command_line, median, private_stack, write_results
from schemas import layout

FILES = {"adapter_model.safetensors": 19_500_000, "optimizer.safetensors": 39_000_000, "rng_state.pt": 6_000}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkpoints", type=int, default=14)
    args = parser.parse_args()
    with private_stack() as (stack, _), tempfile.TemporaryDirectory() as tmp:
        store = ObjectStore(stack.s3_settings)
        store.ensure_bucket()
        for name, size in FILES.items():
            (Path(tmp) / name).write_bytes(os.urandom(size))
        seconds = []
        for step in range(1, args.checkpoints + 1):
            start = time.perf_counter()
            store.put_dir(tmp, layout.checkpoint_prefix("bench-puts", step))
            seconds.append(time.perf_counter() - start)
    total_mb = sum(FILES.values()) / 1e6
    rows = " ".join(f"{s:.2f}" for s in seconds)
    markdown = (
        f"{args.checkpoints} checkpoints of {total_mb:.1f} MB each, `put_dir` to the embedded SeaweedFS: median "
        f"{median(seconds):.2f} s ({min(seconds):.2f}-{max(seconds):.2f}); each: {rows}; load average at the end "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}\n\ncommand: {command_line()}"
    )
    write_results("checkpoint_puts", {"seconds": seconds, "bytes": FILES}, markdown)


if __name__ == "__main__":
    main()
