"""The CPU engine's decode path: its growing KV cache vs transformers' DynamicCache, adapter folded vs peft's,
projections through oneDNN on packed weights vs torch's default (MKL) matmuls.

One ``GenerationEngine`` per configuration, in this process, SmolLM2-135M fp32, prefix cache on: 32 requests
(4 prompts of ``--prompt-tokens`` random tokens, 8 rows each, as a group's rollouts), greedy, EOS ignored, row
``k`` stopping after ``17 + k`` tokens (rows finish one per step, as sampled rollouts do), with a random LoRA
adapter (r16, non-zero B) or the base model. Each configuration runs the batch twice and times the second (the
prompts are then cached); the tokens must be the same in every configuration.

    PYTHONPATH=$PWD python bench/decode_step.py [--prompt-tokens 317]
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import tempfile
import time
from pathlib import Path

import serving.running_batch as running_batch
from base_models.resolve import resolve_base_model
from serving.batcher import GenerationEngine, GenerationRequest
from serving.sampling import SamplingParams

ROWS, GROUP = 32, 8


def random_adapter(base_path: str, directory: Path) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    config = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", init_lora_weights=False)
    get_peft_model(AutoModelForCausalLM.from_pretrained(base_path), config).save_pretrained(str(directory))
    return directory


def run(
    base_path: str, adapter: Path | None, prompt_tokens: int, growing: bool, fold: bool, packed: bool
) -> tuple[float, int]:
    from transformers import DynamicCache

    original = running_batch.new_cache
    if not growing:
        running_batch.new_cache = lambda config: DynamicCache(config=config)
    try:
        engine = GenerationEngine(
            base_path, max_batch=ROWS, fold_adapters=fold, prefix_cache_bytes=1 << 30, pack_weights=packed
        )
        name = None
        if adapter is not None:
            engine.command("load", "a", str(adapter)).result()
            name = "a"
        rng = random.Random(0)
        prompts = [[rng.randrange(100, 40000) for _ in range(prompt_tokens)] for _ in range(ROWS // GROUP)]
        params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
        requests = [
            GenerationRequest(prompts[k // GROUP], name, dataclasses.replace(params, max_tokens=17 + k))
            for k in range(ROWS)
        ]
        seconds = 0.0
        for _ in range(2):
            started = time.perf_counter()
            outputs = [future.result() for future in engine.submit(requests)]
            seconds = time.perf_counter() - started
        engine.close()
    finally:
        running_batch.new_cache = original
    return seconds, hash(tuple(tuple(o.token_ids) for o in outputs))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompt-tokens", type=int, default=317)
    args = parser.parse_args()
    base_path = resolve_base_model("smollm2-135m-instruct").base_path
    with tempfile.TemporaryDirectory() as tmp:
        adapter = random_adapter(base_path, Path(tmp) / "adapter")
        configurations = [
            ("base", None, False, False, True),
            ("base", None, True, False, False),
            ("base", None, True, False, True),
            ("adapter", adapter, True, False, True),
            ("adapter", adapter, True, True, False),
            ("adapter", adapter, True, True, True),
        ]
        lines = [
            f"32 rows x 17-48 greedy tokens on {args.prompt_tokens}-token prompts (cached), SmolLM2-135M fp32",
            "",
            "| model | KV cache | adapter path | matmuls | seconds | same tokens |",
            "|---|---|---|---|---:|---|",
        ]
        first: dict[str, int] = {}
        for model, path, growing, fold, packed in configurations:
            seconds, tokens = run(base_path, path, args.prompt_tokens, growing, fold, packed)
            same = first.setdefault(model, tokens) == tokens
            cache = "growing" if growing else "DynamicCache"
            route = "-" if path is None else ("folded" if fold else "peft")
            matmuls = "oneDNN, packed" if packed else "MKL"
            lines.append(
                f"| {model} | {cache} | {route} | {matmuls} | {seconds:.2f} | {'yes' if same else 'NO'} |"
            )
            print(lines[-1], flush=True)
    print("\n".join(lines))
    print("\ncommand: PYTHONPATH=$PWD python bench/decode_step.py --prompt-tokens", args.prompt_tokens)


if __name__ == "__main__":
    main()
