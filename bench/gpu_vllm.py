"""vLLM on a GPU, started as the inference worker starts it (``VllmServerProcess``): tokens/s, adapter swap
latency, and sleep / wake-up seconds.

1. tok/s: ``--concurrency`` concurrent ``openai`` SDK chat requests of exactly ``--max-tokens`` new tokens
   (``ignore_eos``), on the base model, then alternating base / adapter A / adapter B (rank-16 all-linear
   LoRAs, the trainer's default shape). Best of ``--repeats``.
2. swap: load a new adapter and get its first token back (what the reload activity waits for once the
   checkpoint is on local disk); median of ``--swaps``.
3. sleep: ``/sleep`` (level 1) then ``/wake_up`` seconds, and the GPU memory sleep frees.

    python bench/gpu_vllm.py [--concurrency 64] [--max-tokens 128] [--out results.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import openai
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from base_models.resolve import SMOLLM2_NAME
from bench.serving_throughput import make_adapters, prompts, server_requests
from schemas.settings import EngineSettings
from serving.client import ServingClient
from serving.launchers import VllmServerProcess

SETTINGS = EngineSettings(
    engine="vllm", dtype="bf16", max_lora_rank=16, max_loras=8, sleep_mode=True, gpu_memory_utilization=0.5
)


async def swap_seconds(client: ServingClient, adapters: list[Path], swaps: int) -> list[float]:
    """Seconds from asking vLLM to load a new adapter to its first generated token."""
    out = []
    async with openai.AsyncOpenAI(base_url=client.openai_base_url, api_key="unused", max_retries=0) as sdk:
        for i in range(swaps):
            name = f"swap@{i}"
            started = time.perf_counter()
            await client.load_adapter(name, str(adapters[i % len(adapters)]))
            await sdk.chat.completions.create(
                model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=1
            )
            out.append(time.perf_counter() - started)
            await client.unload_adapter(name)
    return out


async def sleep_wake(client: ServingClient) -> dict[str, float]:
    free_awake, _ = torch.cuda.mem_get_info()
    started = time.perf_counter()
    await client.sleep()
    slept = time.perf_counter()
    free_asleep, _ = torch.cuda.mem_get_info()
    await client.wake_up()
    woke = time.perf_counter()
    return {
        "sleep_s": slept - started,
        "wake_up_s": woke - slept,
        "freed_gib": (free_asleep - free_awake) / 2**30,
    }


async def measure(
    server: VllmServerProcess, adapters: list[Path], a: argparse.Namespace, out: dict[str, Any]
) -> None:
    """Every measurement in one event loop (the server's HTTP client belongs to the loop it first ran in);
    each result is written as soon as it is known, so a run cut short still reports what it measured."""
    client, url = server.client, server.client.openai_base_url
    chats = prompts(a.concurrency)
    out["tok_s"] = {}
    for label, models in (("base", [SMOLLM2_NAME]), ("base/A/B", [SMOLLM2_NAME, "a@1", "b@1"])):
        if len(models) > 1:
            await client.load_adapter("a@1", str(adapters[0]))
            await client.load_adapter("b@1", str(adapters[1]))
        best = max([await server_requests(url, chats, a.max_tokens, models) for _ in range(a.repeats)])
        out["tok_s"][label] = round(best, 1)
        report(out, a.out)
    swaps = await swap_seconds(client, adapters, a.swaps)
    out["adapter_swap_s"] = {"median": statistics.median(swaps), "all": swaps}
    report(out, a.out)
    out["sleep"] = await sleep_wake(client)


def report(results: dict[str, Any], path: str | None) -> None:
    text = json.dumps(results, indent=2)
    print(text, flush=True)
    if path:
        Path(path).write_text(text + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--swaps", type=int, default=5)
    parser.add_argument("--out", help="also write the results as JSON here (rewritten as each one is known)")
    a = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this bench is for a GPU inference worker")
    results: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "settings": SETTINGS.model_dump()}
    results.update(concurrency=a.concurrency, max_tokens=a.max_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        adapters = make_adapters(Path(tmp))
        log = Path(a.out).with_suffix(".vllm.log") if a.out else Path(tmp) / "vllm.log"  # kept beside --out
        server = VllmServerProcess(SMOLLM2_NAME, SETTINGS, log_path=log)
        started = time.perf_counter()
        server.start()
        results["start_s"] = time.perf_counter() - started
        report(results, a.out)
        try:
            asyncio.run(measure(server, adapters, a, results))
        finally:
            server.stop()
    report(results, a.out)


if __name__ == "__main__":
    main()
