"""The trainer's torch + peft path on a CUDA GPU: logprob agreement, step time, and a real OOM halving.

The CPU path is the one CI proves; this checks that the same ``Trainer`` code, with ``device="cuda"``, is
right on a GPU too, with the same functions the trainer activity uses:

1. agreement: HF ``generate`` on the GPU samples completions (fp32 logprobs, as a server returns them);
   the trainer's forward must give the same per-token logprobs (fp32), and bf16 autocast is reported.
2. step time: one GRPO step on 32 sequences of ~99 tokens (bench/train_step.py's data), fp32 and bf16
   autocast, micro-batch 8 and 32.
3. OOM: with the process capped to ``--cap-gib`` of GPU memory, a step on long sequences at micro-batch 32
   raises CUDA's OOM; ``train_step_or_oom`` (the train activity's call) must turn it into ``OutOfMemory``
   and ``next_micro_batch`` halves until the step fits, as successive activity attempts would.

    python bench/gpu_trainer.py [--cap-gib 6] [--long-tokens 1536]
    DGRPO_TRAINER_BACKEND=unsloth python bench/gpu_trainer.py   # the same with Unsloth loading the model
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from train_step import MODEL, make_data

from activities.checkpoints import OomState
from activities.tokenize import TrainSequence, build_sequences
from activities.trainer import ENV_BACKEND, Trainer
from activities.training import OutOfMemory, next_micro_batch, train_step_or_oom
from bench.local_sampling import max_sampling_logprob_gap, sample_choices
from bench.synthetic import random_sequences
from schemas.config import TrainConfig
from schemas.trajectory import Trajectory

PROMPTS = [
    [{"role": "user", "content": "Name a colour."}],
    [{"role": "user", "content": "What is 2 + 2? Answer briefly."}],
    [{"role": "user", "content": "Write one short sentence about the sea."}],
    [{"role": "user", "content": "List three animals."}],
]


def perturb_adapter(trainer: Trainer, seed: int) -> None:
    """A non-trivial adapter (B != 0), so agreement covers the LoRA path."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in trainer.model.named_parameters():
            if "lora_B" in name:
                p.copy_((torch.randn(p.shape, generator=g) * 0.02).to(p.device))


def agreement(trainer: Trainer) -> dict[str, float]:
    choices = sample_choices(trainer.model, trainer.tokenizer, PROMPTS, 4, 32, seed=0)
    step = build_sequences(
        [Trajectory(messages_and_choices=[c]) for c in choices], [1.0] * len(choices), max_seq_len=512
    )

    out = {"fp32": max_sampling_logprob_gap(trainer, step.sequences)}
    trainer.precision = "bf16"
    out["bf16_autocast"] = max_sampling_logprob_gap(trainer, step.sequences)
    trainer.precision = "fp32"
    return out


def step_seconds(trainer: Trainer, seqs: list[TrainSequence], precision: str, mb: int) -> float:
    trainer.precision = precision
    trainer.init_adapter(0)
    trainer.train_step(seqs, TrainConfig(micro_batch_size=mb), 1, mb)  # warm-up (kernels, allocator)
    trainer.init_adapter(0)
    torch.cuda.synchronize()
    started = time.perf_counter()
    trainer.train_step(seqs, TrainConfig(micro_batch_size=mb), 1, mb)
    torch.cuda.synchronize()
    trainer.precision = "fp32"
    return time.perf_counter() - started


def oom_halving(trainer: Trainer, cap_gib: float, tokens: int) -> dict[str, object]:
    """Micro-batch 32 under a memory cap: each OOM is classified and halves the next attempt's size."""
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap_gib * 2**30 / total))
    seqs = random_sequences(32, tokens)
    config = TrainConfig(micro_batch_size=32)
    micro_batch, oom, attempts = 32, None, []
    try:
        while True:
            micro_batch = next_micro_batch(config.micro_batch_size, oom, None)
            trainer.init_adapter(0)
            try:
                train_step_or_oom(trainer, seqs, config, 1, micro_batch)  # what the train activity calls
            except OutOfMemory as err:
                attempts.append({"micro_batch": micro_batch, "oom": err.cause})
                if micro_batch == 1:
                    raise
                oom = OomState(micro_batch_size=micro_batch, attempt=len(attempts))
                continue
            attempts.append({"micro_batch": micro_batch, "oom": None})
            return {"cap_gib": cap_gib, "tokens_per_sequence": tokens, "attempts": attempts}
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cap-gib", type=float, default=6.0, help="GPU memory cap for the OOM check")
    parser.add_argument("--long-tokens", type=int, default=1536, help="tokens per sequence in the OOM check")
    parser.add_argument("--out", help="also write the results as JSON here")
    a = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this check is for a GPU trainer worker")
    trainer = Trainer(MODEL, "fp32", device="cuda")  # fp32 weights: "bf16" below is autocast over them
    trainer.init_adapter(0)
    perturb_adapter(trainer, 1)
    results: dict[str, object] = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    results["backend"] = os.environ.get(ENV_BACKEND, "auto")
    results["model_class"] = type(trainer.model.get_base_model()).__name__
    results["packed_prompts"] = trainer.share_prefixes
    results["max_abs_logprob_diff"] = agreement(trainer)
    trainer.init_adapter(0)
    seqs = make_data(trainer)
    results["step_seconds"] = {
        f"{precision} mb{mb}": round(step_seconds(trainer, seqs, precision, mb), 3)
        for precision in ("fp32", "bf16")
        for mb in (8, 32)
    }
    results["trained_tokens"] = sum(s.n_trainable for s in seqs)
    results["oom"] = oom_halving(trainer, a.cap_gib, a.long_tokens)
    text = json.dumps(results, indent=2)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
