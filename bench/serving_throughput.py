"""Tokens/s of our CPU serving engine against raw batched ``model.generate`` and against vLLM, same prompts,
same run.

    python bench/serving_throughput.py [--engines raw cpu vllm] [--dtype fp32 bf16] [--concurrency 32]
        [--max-tokens 64] [--repeats 2] [--threads 1]

Sides (``--engines``): ``raw``, batched ``generate`` on the left-padded chat prompts in this process (sampling
at temperature 1, exactly ``--max-tokens`` new tokens per row); ``cpu``, our server (a subprocess); ``vllm``,
``vllm serve`` from its own runtime environment, started as the inference worker starts it
(``--max-lora-rank`` 16, the adapters' rank). The servers answer the same prompts as ``--concurrency``
concurrent ``openai`` SDK requests (``ignore_eos``, same ``max_tokens``). Then the same with rank-16 LoRA
adapters: raw ``generate(adapter_names=...)`` on a peft model, the servers with requests alternating base /
adapter A / adapter B. For each dtype both servers stay up and the sides alternate, one request set each per
round, ``--repeats`` rounds; best of them per side. Default sides: raw, cpu, and vllm when its runtime
environment imports. Prints a markdown table. Other processes on the machine make the numbers noisy; the
ratios are what to read.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import openai
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from base_models.resolve import SMOLLM2_NAME, ensure_smollm2
from bench.engines import ADAPTER_RANK, ENGINE_NAMES, running, server_for, vllm_found
from schemas.settings import ENV_ADAPTER_ROOT

TOPICS = ["cats", "the sea", "trains", "music", "rain", "chess", "bread", "stars"]


def prompts(n: int) -> list[list[dict[str, str]]]:
    return [
        [{"role": "user", "content": f"Tell me a story about {TOPICS[i % 8]} and the number {i}."}]
        for i in range(n)
    ]


def make_adapters(root: Path) -> list[Path]:
    """Two random rank-16 all-linear LoRAs (the trainer's default shape)."""
    out = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_pretrained(str(ensure_smollm2()))
        peft = get_peft_model(
            model,
            LoraConfig(
                r=ADAPTER_RANK,
                lora_alpha=2 * ADAPTER_RANK,
                target_modules="all-linear",
                init_lora_weights=False,
            ),
        )
        peft.save_pretrained(str(root / f"a{seed}"))
        out.append(root / f"a{seed}")
    return out


def raw_generate(dtype: str, chats: list[Any], max_tokens: int, adapters: list[Path] | None) -> float:
    """Tokens/s of one batched ``generate`` call over all prompts."""
    path = str(ensure_smollm2())
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).eval()
    kwargs: dict[str, Any] = {}
    if adapters:
        model = PeftModel.from_pretrained(model, str(adapters[0]), adapter_name="a").eval()
        model.load_adapter(str(adapters[1]), adapter_name="b")
        kwargs["adapter_names"] = [("__base__", "a", "b")[i % 3] for i in range(len(chats))]
    texts = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats]
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    sampling = {"do_sample": True, "temperature": 1.0, "top_p": 1.0, "top_k": 0}
    with torch.inference_mode():
        model.generate(**batch, max_new_tokens=2, **sampling, **kwargs)  # warm-up
        start = time.perf_counter()
        out = model.generate(
            **batch, max_new_tokens=max_tokens, min_new_tokens=max_tokens, **sampling, **kwargs
        )
        seconds = time.perf_counter() - start
    new_tokens = (out.shape[1] - batch["input_ids"].shape[1]) * out.shape[0]
    return new_tokens / seconds


async def server_requests(base_url: str, chats: list[Any], max_tokens: int, models: list[str]) -> float:
    """Tokens/s of all prompts sent at once as concurrent chat requests."""
    async with openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=3600) as sdk:
        extra = {"ignore_eos": True}
        await sdk.chat.completions.create(model=models[0], messages=chats[0], max_tokens=2, extra_body=extra)
        start = time.perf_counter()
        responses = await asyncio.gather(
            *(
                sdk.chat.completions.create(
                    model=models[i % len(models)], messages=c, max_tokens=max_tokens, extra_body=extra
                )
                for i, c in enumerate(chats)
            )
        )
        seconds = time.perf_counter() - start
    return sum(r.usage.completion_tokens for r in responses if r.usage) / seconds


WORKLOADS = (("base", False), ("mixed: base / A / B", True))
COLUMNS = {"raw": "raw `generate`", **ENGINE_NAMES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", nargs="+", choices=("raw", "cpu", "vllm"), default=None)
    parser.add_argument("--dtype", nargs="+", choices=("fp32", "bf16"), default=["fp32", "bf16"])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="torch threads for raw and our server")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    engines = args.engines or ["raw", "cpu", *(["vllm"] if vllm_found() else [])]
    if args.threads:
        torch.set_num_threads(args.threads)
    chats = prompts(args.concurrency)
    rows: list[tuple[str, str, dict[str, float]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        adapters = make_adapters(Path(tmp))
        os.environ[ENV_ADAPTER_ROOT] = tmp  # our server loads adapters only from under its adapter root
        for dtype in args.dtype:
            servers = {
                engine: server_for(engine, dtype, max_batch=args.concurrency, threads=args.threads)
                for engine in engines
                if engine != "raw"
            }
            with running(servers):
                for label, with_adapters in WORKLOADS:
                    models = [SMOLLM2_NAME, "a@1", "b@1"] if with_adapters else [SMOLLM2_NAME]
                    for server in (
                        servers.values() if with_adapters else ()
                    ):  # now: base rows are like for like
                        asyncio.run(server.client.load_adapter("a@1", str(adapters[0])))
                        asyncio.run(server.client.load_adapter("b@1", str(adapters[1])))
                    best: dict[str, float] = {}
                    for round_ in range(args.repeats):
                        for (
                            engine
                        ) in engines:  # alternated: a change in the machine's load shows on every side
                            if engine == "raw":
                                tok_s = raw_generate(
                                    dtype, chats, args.max_tokens, adapters if with_adapters else None
                                )
                            else:
                                url = servers[engine].client.openai_base_url
                                tok_s = asyncio.run(server_requests(url, chats, args.max_tokens, models))
                            best[engine] = max(best.get(engine, 0.0), tok_s)
                            print(
                                f"round {round_ + 1}: {dtype} {label} {engine}: {tok_s:.1f} tok/s", flush=True
                            )
                    rows.append((dtype, label, best))
    print(
        f"\n{args.concurrency} concurrent requests x {args.max_tokens} new tokens, SmolLM2-135M, "
        f"torch threads {args.threads or torch.get_num_threads()}, best of {args.repeats} alternated rounds\n"
    )
    print(table(engines, rows))


def table(engines: list[str], rows: list[tuple[str, str, dict[str, float]]]) -> str:
    """One row per dtype and workload: each side's tok/s, then ours / raw and vLLM / ours."""
    ratios = [(a, b) for a, b in (("cpu", "raw"), ("vllm", "cpu")) if a in engines and b in engines]
    header = ["dtype", "adapters", *(f"{COLUMNS[e]} tok/s" for e in engines)]
    header += [f"{COLUMNS[a]} / {COLUMNS[b]}" for a, b in ratios]
    lines = ["| " + " | ".join(header) + " |", "|---|---|" + "---:|" * (len(header) - 2)]
    for dtype, label, best in rows:
        cells = [dtype, label, *(f"{best[e]:.1f}" for e in engines)]
        cells += [f"{best[a] / best[b]:.2f}x" for a, b in ratios]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
