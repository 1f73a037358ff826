"""What deploy/gpu/production_shapes.py measures on one shape: the trainer's figures and vLLM's.

Each function takes ``record(key, value)``, which stores a figure in the results file at once (a run cut short
keeps every figure it measured), and the same code the workers run: ``Trainer`` and the train activity's
``train_step_or_oom`` / ``next_micro_batch``, ``stage_checkpoint`` / ``publish_staged``, ``VllmServerProcess``
and ``ServingClient``, ``download_checkpoint``.
"""

from __future__ import annotations

import asyncio
import gc
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import torch

from activities.checkpoints import (
    OomState,
    TrainerState,
    download_checkpoint,
    publish_staged,
    stage_checkpoint,
)
from activities.object_store import ObjectStore
from activities.trainer import ADAPTER_WEIGHTS, Trainer
from activities.training import OutOfMemory, next_micro_batch, train_step_or_oom
from base_models.random_shapes import Shape
from bench.serving_throughput import prompts, server_requests
from bench.synthetic import random_sequences
from schemas.config import LoraConfig, ModelSpec, TrainConfig
from schemas.refs import CheckpointRef
from schemas.settings import EngineSettings
from serving.launchers import VllmServerProcess

Record = Callable[[str, Any], None]


@dataclass(frozen=True)
class Sizes:
    """How big the measurements are (the script's flags; ``--tiny`` makes them small)."""

    sequences: int
    """Sequences of a timed GRPO step."""
    tokens: int
    """Tokens per sequence of the timed step (a third of them prompt)."""
    oom_start: int
    """The micro-batch the halving chain starts at."""
    oom_tokens: int
    """Tokens per sequence in the halving chain."""
    concurrency: int
    """Concurrent vLLM requests."""
    max_tokens: int
    """Tokens each vLLM request generates."""
    max_model_len: int = 4096


LORA = LoraConfig(rank=16, alpha=32)
"""The run spec's default shape: rank 16 on every projection."""
GIB = 2**30


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def peak_gib(device: torch.device) -> float:
    """The peak of what torch allocated on ``device`` since the last reset (a CPU: the process's peak RSS)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / GIB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB


def trainer_figures(
    shape: Shape,
    model_dir: Path,
    device: str,
    sizes: Sizes,
    store: ObjectStore,
    staging: Path,
    record: Record,
) -> CheckpointRef:
    """Trained tokens/s, peak memory, the memory plan, the OOM halving chain, the adapter's size and publish
    seconds; returns the published checkpoint (step 1 of run ``shapes-<shape>``)."""
    spec = ModelSpec(name=f"shapes-{shape.name}", base_model=str(model_dir), lora=LORA)
    started = time.perf_counter()
    trainer = Trainer(spec, "auto", device=device)
    dev = trainer.device
    record("load_s", round(time.perf_counter() - started, 2))
    record("precision", trainer.precision)
    record("trainable_parameters", sum(p.numel() for p in trainer.params))

    sequences, tokens = sizes.sequences, sizes.tokens
    data = random_sequences(sequences, tokens, seed=0)
    plan = trainer.plan_memory(data, requested=sequences)
    record("plan", {"asked": sequences, "micro_batch": plan.micro_batch,
                    "gradient_checkpointing": plan.gradient_checkpointing,
                    "sequence_gib": round(plan.sequence_bytes / GIB, 3), "budget_gib": round(plan.budget_bytes / GIB, 2)})  # fmt: skip
    trainer.use_gradient_checkpointing(plan.gradient_checkpointing)
    config = TrainConfig(micro_batch_size=plan.micro_batch)
    trainer.init_adapter(0)
    trainer.train_step(data, config, 1, plan.micro_batch)  # warm-up: kernels, the allocator, the optimizer
    synchronize(dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    started = time.perf_counter()
    stats = trainer.train_step(data, config, 2, plan.micro_batch)
    synchronize(dev)
    seconds = time.perf_counter() - started
    record("step", {
        "sequences": sequences, "tokens_per_sequence": tokens, "seconds": round(seconds, 3),
        "tokens": stats.n_tokens, "trained_tokens": stats.n_trainable_tokens,
        "tokens_per_s": round(stats.n_tokens / seconds, 1),
        "trained_tokens_per_s": round(stats.n_trainable_tokens / seconds, 1),
        "peak_gib": round(peak_gib(dev), 2), "mean_importance_ratio": stats.mean_ratio,
    })  # fmt: skip

    staged = stage_checkpoint(
        staging / shape.name / "000001",
        trainer.save_state,
        TrainerState(run_id=spec.name, step=1, base_model=spec.base_model, lora=LORA.model_dump()),
        {"mean_ratio": stats.mean_ratio},
    )
    started = time.perf_counter()
    ref = publish_staged(store, staged, spec.name, 1)
    record("adapter", {
        "adapter_mib": round((staged / ADAPTER_WEIGHTS).stat().st_size / 2**20, 2),
        "checkpoint_mib": round(sum(p.stat().st_size for p in staged.iterdir()) / 2**20, 2),
        "publish_s": round(time.perf_counter() - started, 3),
    })  # fmt: skip
    with torch.no_grad():  # a second adapter for vLLM's mixed-adapter figure: B random, so it differs
        for name, p in trainer.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    other = staging / shape.name / "other"
    other.mkdir(parents=True, exist_ok=True)  # save_state writes the files, not their directory
    trainer.save_state(other)

    record("oom", oom_chain(trainer, sizes.oom_start, sizes.oom_tokens))
    del trainer
    release(dev)
    return ref


def oom_chain(trainer: Trainer, start: int, tokens: int) -> dict[str, Any]:
    """The train activity's attempts from micro-batch ``start`` (checkpointing off, no memory cap): each OOM
    halves the next, as the retried activity does, until one runs; and what the memory plan would have chosen."""
    data = random_sequences(start, tokens, seed=1)
    trainer.use_gradient_checkpointing(False)
    planned = trainer.plan_memory(data, requested=start)
    config = TrainConfig(micro_batch_size=start)
    oom: OomState | None = None
    attempts: list[dict[str, Any]] = []
    while True:
        micro_batch = next_micro_batch(start, oom, None)
        trainer.init_adapter(0)
        trainer.optimizer = None
        started = time.perf_counter()
        try:  # one micro-batch per attempt: whether it fits is the question
            train_step_or_oom(trainer, data[:micro_batch], config, 1, micro_batch)
        except OutOfMemory as err:
            attempts.append({"micro_batch": micro_batch, "oom": err.cause[:160],
                             "seconds": round(time.perf_counter() - started, 2)})  # fmt: skip
            release(trainer.device)
            if micro_batch == 1:
                break
            oom = OomState(micro_batch_size=micro_batch, attempt=len(attempts))
            continue
        attempts.append(
            {"micro_batch": micro_batch, "oom": None, "seconds": round(time.perf_counter() - started, 2)}
        )
        break
    ran = [a["micro_batch"] for a in attempts if a["oom"] is None]
    return {
        "start": start, "tokens_per_sequence": tokens, "attempts": attempts,
        "largest_that_ran": ran[0] if ran else None,
        "plan_would_take": {"micro_batch": planned.micro_batch, "gradient_checkpointing": planned.gradient_checkpointing},
    }  # fmt: skip


def vllm_figures(
    model_dir: Path,
    settings: EngineSettings,
    sizes: Sizes,
    ref: CheckpointRef,
    other_adapter: Path,
    store: ObjectStore,
    adapter_root: Path,
    log_path: Path,
    record: Record,
) -> None:
    """vLLM's start seconds, generated tokens/s without and with adapters, and the reload of the published one."""
    server = VllmServerProcess(
        str(model_dir), settings, log_path=log_path, extra_args=["--max-model-len", str(sizes.max_model_len)]
    )
    record(
        "settings",
        settings.model_dump(include={"dtype", "max_lora_rank", "max_loras", "gpu_memory_utilization"}),
    )
    started = time.perf_counter()
    server.start()
    try:
        record("start_s", round(time.perf_counter() - started, 1))
        asyncio.run(_measure(server, str(model_dir), sizes, ref, other_adapter, store, adapter_root, record))
    finally:
        server.stop()


async def _measure(
    server: VllmServerProcess,
    base: str,
    sizes: Sizes,
    ref: CheckpointRef,
    other_adapter: Path,
    store: ObjectStore,
    adapter_root: Path,
    record: Record,
) -> None:
    """Every request in one event loop (the server's client belongs to the loop it first ran in)."""
    client, url = server.client, server.client.openai_base_url
    chats, max_tokens = prompts(sizes.concurrency), sizes.max_tokens
    tok_s: dict[str, float] = {}
    tok_s["base"] = round(await server_requests(url, chats, max_tokens, [base]), 1)
    record("tok_s", tok_s)
    started = time.perf_counter()
    local = (
        adapter_root / ref.run_id / "000001"
    )  # download_checkpoint returns the manifest, not the directory
    await asyncio.to_thread(download_checkpoint, store, ref, local)
    downloaded = time.perf_counter()
    await client.load_adapter("trained@1", str(local))
    async with openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0) as sdk:
        await sdk.chat.completions.create(model="trained@1", messages=chats[0], max_tokens=1)  # type: ignore[arg-type]
    served = time.perf_counter()
    record("reload", {"download_s": round(downloaded - started, 3), "load_to_first_token_s": round(served - downloaded, 3),
                      "total_s": round(served - started, 3)})  # fmt: skip
    await client.load_adapter("other@1", str(other_adapter))
    tok_s["base/trained/other"] = round(
        await server_requests(url, chats, max_tokens, [base, "trained@1", "other@1"]), 1
    )
    tok_s["trained"] = round(await server_requests(url, chats, max_tokens, ["trained@1"]), 1)
    record("tok_s", tok_s)
    record("requests", {"concurrency": sizes.concurrency, "max_tokens": max_tokens})
