"""Seconds per step of ``dgrpo demo`` from two checkouts, alternated: is a change's demo slower than before?

    PYTHONPATH=$PWD python bench/demo_steps.py --checkout OLD --checkout . [--steps 4] [--rounds 2]

Each round runs ``dgrpo demo --steps N`` (the arithmetic task, SmolLM2-135M on one ``dgrpo worker all``) from
each checkout in turn (this interpreter, ``PYTHONPATH`` and working directory set to the checkout), all on one
embedded stack in a temporary home; a step's seconds are read from the run's history (step n-1's reload closed
to step n's), steps 2..N (step 1 warms up). Make the old checkout with ``git archive <commit> | tar -x -C DIR``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.bench_stack import activity_spans, command_line, median, write_results
from schemas.activities import ActivityName
from workers.stack import EmbeddedStack
from workers.temporal import connect_client


async def step_seconds(address: str, run_id: str) -> dict[int, float]:
    """Step n (>= 2) -> seconds from step n-1's adapter served to step n's."""
    client = await connect_client(address=address)
    served = {s.step: s.closed for s in await activity_spans(client, run_id) if s.name == ActivityName.RELOAD}
    return {n: at - served[n - 1] for n, at in sorted(served.items()) if n >= 2 and n - 1 in served}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--checkout", action="append", type=Path, required=True, help="a checkout (twice)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="dgrpo-demo-steps-"))
    stack = EmbeddedStack(home, free_ports=True, ui=False)  # every demo reuses it
    address = stack.start().temporal_address
    steps: dict[str, list[float]] = {str(c): [] for c in args.checkout}
    try:
        for r in range(args.rounds):
            for checkout in args.checkout:
                root = checkout.resolve()
                run_id = f"demo-steps-{r}-{args.checkout.index(checkout)}"
                print(f"round {r + 1}/{args.rounds}: dgrpo demo from {root} ...", flush=True)
                env = {**os.environ, "PYTHONPATH": str(root)}
                demo = [sys.executable, "-m", "dgrpo.cli", "demo", "--steps", str(args.steps)]
                demo += ["--home", str(home), "--run-id", run_id]
                subprocess.run(demo, cwd=root, env=env, check=True, stdout=subprocess.DEVNULL)
                seconds = asyncio.run(step_seconds(address, run_id))
                steps[str(checkout)] += list(seconds.values())
                print(f"  steps 2..N: {[round(s, 2) for s in seconds.values()]}", flush=True)
    finally:
        stack.stop()
    results: dict[str, Any] = {"steps": steps, "load": os.getloadavg(), "command": command_line()}
    load = ", ".join(f"{x:.1f}" for x in results["load"])
    lines = [
        f"`dgrpo demo --steps {args.steps}`, {args.rounds} rounds alternated; load average at the end {load}",
        "",
        "| checkout | median s/step | range |",
        "|---|---:|---:|",
    ]
    for checkout, values in steps.items():
        lines.append(f"| {checkout} | {median(values):.2f} | {min(values):.2f}-{max(values):.2f} |")
    lines += ["", f"command: {command_line()}"]
    write_results("demo_steps", results, "\n".join(lines))


if __name__ == "__main__":
    main()
