"""Sampling logprobs against the trainer's, per engine and dtype, and what the gap does to GRPO's ratio.

``PYTHONPATH=. python bench/logprob_gap.py [--engines cpu vllm] [--dtypes fp32 bf16] [--prompts 16]``
starts each engine in each dtype as the inference worker starts it (one server at a time), samples
``--prompts`` chats of up to ``--max-tokens`` tokens at temperature 1 from SmolLM2-135M, as rollouts do, and
teacher-forces the same tokens through the trainer's fp32 forward. It prints, per server, the per-token
|Δ logprob| (mean, 99th percentile, max) and the importance ratio exp(trainer − sampler) that the step's first
update starts from: its mean, and the share of tokens outside PPO's clip range [1 − ε, 1 + ε] (ε = 0.2, the
default ``train.epsilon``), whose gradient the clip drops although the policy has not moved.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

import openai
import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "serving"))
from engines import ENGINE_NAMES, default_engines, running, server_for
from serving_contract import RETURN_IDS, recorded_choice, teacher_forced

from base_models.resolve import SMOLLM2_NAME, ensure_smollm2
from schemas.config import TrainConfig
from serving.launchers import ServerProcess

QUESTIONS = [
    "Explain why the sky is blue.",
    "Write a haiku about rain.",
    "What is 17 times 23? Show your steps.",
    "Name three rivers in Europe and one fact about each.",
    "Say something about cats.",
    "How does a bicycle stay upright?",
    "Give me a short recipe for pancakes.",
    "What is the capital of Australia, and why is it not Sydney?",
]


async def sample(
    server: ServerProcess, prompts: int, max_tokens: int
) -> list[tuple[list[int], list[int], Any]]:
    """``prompts`` sampled chats: (prompt ids, sampled ids, sampled logprobs)."""
    sdk = openai.AsyncOpenAI(base_url=server.client.openai_base_url, api_key="unused", timeout=600)
    questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(prompts)]
    responses = await asyncio.gather(
        *(
            sdk.chat.completions.create(
                model=SMOLLM2_NAME, messages=[{"role": "user", "content": q}], max_tokens=max_tokens,
                temperature=1.0, logprobs=True, extra_body=RETURN_IDS,
            )
            for q in questions
        )
    )  # fmt: skip
    out = []
    for response in responses:
        choice = recorded_choice(response)
        assert choice.prompt_token_ids and choice.token_ids, "the engine returned no token ids"
        out.append((choice.prompt_token_ids, choice.token_ids, choice.sampled_logprobs()))
    return out


def gaps(model: Any, samples: list[tuple[list[int], list[int], Any]]) -> torch.Tensor:
    """trainer − sampler logprob of every sampled token."""
    return torch.cat(
        [
            teacher_forced(model, prompt, tokens) - torch.tensor(logprobs)
            for prompt, tokens, logprobs in samples
        ]
    )


def row(label: str, dtype: str, delta: torch.Tensor, epsilon: float) -> str:
    gap = delta.abs()
    ratio = delta.exp()
    clipped = float(((ratio < 1 - epsilon) | (ratio > 1 + epsilon)).float().mean())
    return (
        f"| {label} | {dtype} | {gap.numel()} | {float(gap.mean()):.2e} | {float(gap.quantile(0.99)):.2e} | "
        f"{float(gap.max()):.2e} | {float(ratio.mean()):.4f} | {100 * clipped:.2f}% |"
    )


async def main(args: argparse.Namespace) -> None:
    epsilon = TrainConfig().epsilon
    trainer = AutoModelForCausalLM.from_pretrained(str(ensure_smollm2()), dtype=torch.float32).eval()
    lines = [
        f"{args.prompts} chats × up to {args.max_tokens} tokens at temperature 1, SmolLM2-135M; trainer fp32",
        "",
        "| engine | dtype | tokens | mean \\|Δ\\| | p99 \\|Δ\\| | max \\|Δ\\| | mean ratio | outside clip ±"
        f"{epsilon:g} |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for engine in args.engines:
        for dtype in args.dtypes:
            server = server_for(engine, dtype)
            with running({f"{engine}-{dtype}": server}):
                samples = await sample(server, args.prompts, args.max_tokens)
            delta = gaps(trainer, samples)
            lines.append(row(ENGINE_NAMES[engine], dtype, delta, epsilon))
            logging.warning("%s %s done: %d tokens", engine, dtype, delta.numel())
    print("\n".join(lines))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", nargs="+", choices=sorted(ENGINE_NAMES), default=None)
    parser.add_argument("--dtypes", nargs="+", choices=("fp32", "bf16"), default=["fp32", "bf16"])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=48)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    parsed = parser.parse_args()
    parsed.engines = parsed.engines or default_engines()
    asyncio.run(main(parsed))
