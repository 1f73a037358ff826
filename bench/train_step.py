"""Seconds per GRPO training step on SmolLM2-135M (LoRA r=16, all linear projections), CPU.

32 sequences of ~35 prompt + 64 completion tokens; the sampling logprobs come with the data (as the
server returns them), computed once up front by a no-grad forward of the same policy (not timed).

- ``dgrpo``: our step (activities/trainer.py): one forward+backward per micro-batch, ratio against the
  server's logprobs, no recompute.
- ``recompute``: the same step preceded by a no-grad forward recomputing old-policy logprobs (what a
  trainer that cannot trust the sampler's logprobs does).
- ``trl``: TRL's ``GRPOTrainer._compute_loss`` (loss_type ``bnpo``, token-level ratio) on the same
  micro-batches, plus its AdamW step; generation and reward are not part of any row.

    python bench/train_step.py [--micro-batch 8] [--repeats 1] [--skip-trl]
"""

from __future__ import annotations

import argparse
import math
import random
import time
from typing import Any

import torch

from activities.tokenize import TrainSequence
from activities.trainer import Trainer
from base_models.resolve import pad_token_id
from schemas.config import LoraConfig, ModelSpec, TrainConfig

MODEL = ModelSpec(name="bench", base_model="smollm2-135m-instruct", lora=LoraConfig(rank=16, alpha=32))
N_SEQ, PROMPT, COMPLETION = 32, 35, 64


def make_data(trainer: Trainer, seed: int = 0) -> list[TrainSequence]:
    rng = random.Random(seed)
    seqs = []
    for i in range(N_SEQ):
        p = PROMPT + rng.randrange(-4, 5)
        c = COMPLETION - rng.randrange(0, 9)
        tokens = [rng.randrange(100, 40000) for _ in range(p + c)]
        seqs.append(TrainSequence(tokens, [False] * p + [True] * c, [math.nan] * (p + c), rng.gauss(0, 1), i))
    for seq, lps in zip(seqs, trainer.sequence_logprobs(seqs), strict=True):  # the "server's" logprobs
        seq.sampling_logprobs = [math.nan] + [
            lp if m else math.nan for lp, m in zip(lps, seq.trainable[1:], strict=True)
        ]
    return seqs


def time_dgrpo(trainer: Trainer, seqs: list[TrainSequence], mb: int, recompute: bool) -> float:
    trainer.init_adapter(0)
    started = time.perf_counter()
    if recompute:
        for i in range(0, len(seqs), mb):
            trainer.sequence_logprobs(seqs[i : i + mb])
    trainer.train_step(seqs, TrainConfig(micro_batch_size=mb), 1, mb)
    return time.perf_counter() - started


def build_trl(trainer: Trainer, mb: int) -> Any:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir="/tmp/dgrpo-bench-trl",
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=mb,
        num_generations=8,
        gradient_accumulation_steps=N_SEQ // mb,
        loss_type="bnpo",
        beta=0.0,
        max_completion_length=COMPLETION,
        report_to=[],
        learning_rate=2e-4,
        logging_steps=1000,
    )
    return GRPOTrainer(
        model=trainer.model,
        reward_funcs=[lambda completions, **_: [0.0] * len(completions)],
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["x"] * N_SEQ}),
        processing_class=trainer.tokenizer,
    )


def time_trl(trl: Any, trainer: Trainer, seqs: list[TrainSequence], mb: int) -> float:
    trainer.init_adapter(0)
    model = trl.model
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-4)
    trl.current_gradient_accumulation_steps = N_SEQ // mb
    pad = pad_token_id(trainer.tokenizer)
    started = time.perf_counter()
    for i in range(0, len(seqs), mb):
        chunk = seqs[i : i + mb]
        prompts = [s.tokens[: s.trainable.index(True)] for s in chunk]
        completions = [s.tokens[s.trainable.index(True) :] for s in chunk]
        pw, cw = max(map(len, prompts)), max(map(len, completions))
        inputs = {
            "prompt_ids": torch.tensor([[pad] * (pw - len(p)) + p for p in prompts]),
            "prompt_mask": torch.tensor([[0] * (pw - len(p)) + [1] * len(p) for p in prompts]),
            "completion_ids": torch.tensor([c + [pad] * (cw - len(c)) for c in completions]),
            "completion_mask": torch.tensor([[1] * len(c) + [0] * (cw - len(c)) for c in completions]),
            "advantages": torch.tensor([s.advantage for s in chunk]),
            "old_per_token_logps": torch.tensor(
                [
                    [x for x, m in zip(s.sampling_logprobs, s.trainable, strict=True) if m]
                    + [0.0] * (cw - len(c))
                    for s, c in zip(chunk, completions, strict=True)
                ]
            ),
            "num_items_in_batch": torch.tensor(float(sum(len(c) for c in completions))),
        }
        trl._compute_loss(model, inputs).backward()
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
    optimizer.step()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--skip-trl", action="store_true")
    a = parser.parse_args()
    trainer = Trainer(MODEL)
    trainer.init_adapter(0)
    seqs = make_data(trainer)
    n_trained = sum(s.n_trainable for s in seqs)
    rows: dict[str, float] = {}
    rows["dgrpo (server logprobs)"] = min(
        time_dgrpo(trainer, seqs, a.micro_batch, False) for _ in range(a.repeats)
    )
    rows["recompute old logprobs + step"] = min(
        time_dgrpo(trainer, seqs, a.micro_batch, True) for _ in range(a.repeats)
    )
    if not a.skip_trl:
        try:
            trl = build_trl(trainer, a.micro_batch)
            rows["TRL GRPOTrainer._compute_loss + AdamW"] = min(
                time_trl(trl, trainer, seqs, a.micro_batch) for _ in range(a.repeats)
            )
        except Exception as err:  # report what broke instead of losing the rows already measured
            print(f"TRL row failed: {type(err).__name__}: {err}")
    ours = rows["dgrpo (server logprobs)"]
    print(
        f"\n{N_SEQ} sequences, {sum(len(s.tokens) for s in seqs)} tokens ({n_trained} trained), "
        f"micro-batch {a.micro_batch}, torch threads {torch.get_num_threads()}\n"
    )
    print("| step | s / step | trained tokens / s | time vs dgrpo |")
    print("|---|---:|---:|---:|")
    for name, seconds in rows.items():
        print(f"| {name} | {seconds:.1f} | {n_trained / seconds:.0f} | {seconds / ours:.2f}x |")


if __name__ == "__main__":
    main()
