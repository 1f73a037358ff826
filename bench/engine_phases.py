"""Where the CPU engine's time goes during one tool agent step: seconds and calls of each engine phase.

``PYTHONPATH=. python bench/engine_phases.py --turns 3`` serves ``serving.server``'s app in this process (so
the engine's methods can be timed) and runs one step of ``bench/prefix_cache.py``'s conversations through it
over HTTP. Phases nest: ``_admit`` holds a joining row's cached prefix copied out (``joining rows' cache
rows``) and into the running batch (``join``), and the forward of a group's shared prompt
(``_prefill_shared_prompts``);
``_advance`` is one step: its forward (``_forward``, also counted within ``_prefill_shared_prompts``), the
prompts it keeps and the sampling (``_step``, which holds the ``_keep`` of finished rows); ``cache copies`` is
every copy of cache storage (a join, a regrow into spare columns, rows moving when others leave).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import uvicorn

import serving.batcher as batcher
import serving.kv_cache as kv_cache
import serving.running_batch as running_batch
from base_models.resolve import SMOLLM2_NAME
from bench.prefix_cache import one_step
from serving.options import ServerOptions
from serving.server import create_server

seconds: collections.Counter[str] = collections.Counter()
calls: collections.Counter[str] = collections.Counter()


def timed(owner: Any, name: str, label: str | None = None) -> None:
    """Replace ``owner.name`` with a version that adds its time to ``label`` (default: its name)."""
    original: Callable[..., Any] = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            seconds[label or name] += time.perf_counter() - started
            calls[label or name] += 1

    setattr(owner, name, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=3, help="assistant turns a conversation (1: early)")
    parser.add_argument("--prefix-cache-mb", type=int, default=1024)
    parser.add_argument("--port", type=int, default=8791)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    for name in (
        "_admit",
        "_prefill_shared_prompts",
        "_advance",
        "_forward",
        "_step",
        "_keep",
    ):
        timed(batcher.GenerationEngine, name)
    timed(running_batch.Joining, "build", "joining rows' cache rows")
    timed(running_batch.RunningBatch, "join", "join")
    for name in ("append_rows", "keep_rows"):
        timed(kv_cache.GrowingLayer, name, "cache copies")
    timed(running_batch, "restack", "cache copies")
    timed(kv_cache, "_regrown", "cache copies")
    options = ServerOptions(model=SMOLLM2_NAME, port=args.port, prefix_cache_mb=args.prefix_cache_mb)
    app, _engine = create_server(options)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=args.port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    elapsed, tokens = asyncio.run(one_step(f"http://127.0.0.1:{args.port}/v1", args.turns))
    server.should_exit = True
    thread.join(timeout=30)
    print(f"one step, {args.turns} turns (last prompt {tokens} tokens): {elapsed:.1f} s")
    print("| phase | seconds | calls |")
    print("|---|---:|---:|")
    for name, total in seconds.most_common():
        print(f"| {name} | {total:.2f} | {calls[name]} |")


if __name__ == "__main__":
    main()
