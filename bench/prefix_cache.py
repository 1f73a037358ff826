"""Prefix caching on the tool agent's rollouts: one step's rollouts through real servers, our CPU engine with
its cache off and on, and vLLM.

``PYTHONPATH=. python bench/prefix_cache.py [--engines cpu vllm] [--vllm-dtype fp32 bf16] [--rounds 3]`` starts
``serving.server`` twice (``--prefix-cache-mb 0`` and the default) and, with ``--engines vllm``, ``vllm serve``
as the inference worker starts it (prefix caching on, its default; ``--vllm-dtype`` fp32, the CPU build's
``auto``), all up at once and used in turn. It times one step of ``examples/tool_agent.py`` conversations, 4
groups x 8 rollouts, at two stages of a run: *early* (one turn: the base model answers without calling the
tool) and *late* (three turns: every reply is followed by a tool result, as once the agent has learned to call
it, so the conversation grows). The prompts, tools, sampling and token limits are the example's own; only the
number of turns is scripted, and each conversation's requests carry a seed so our two sides draw alike. vLLM's
requests carry none: on its CPU build a seeded request whose prompt is split across engine steps crashes the
engine (``CPU Generator does not use offset``).

Each server answers one unrelated request first (its first forwards are slower), and its prefix cache is
emptied before every timed step: in a run each step samples with a newly trained adapter, whose keys and values
no earlier step computed. ``--rounds`` repeats the whole comparison; the table shows each side's median.
Default sides: ours off and on, and vLLM when its runtime environment imports; ``--no-cache-off`` drops ours
with the cache off.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import time
from typing import Any

import openai

from base_models.resolve import SMOLLM2_NAME
from bench.engines import ENGINE_NAMES, forget_prefixes, running, server_for, vllm_found
from examples.tool_agent import CATALOG, EXAMPLE_EPISODE, EXAMPLE_ITEM, MAX_TOKENS, TOOLS
from serving.client import ServingClient
from serving.launchers import ServerProcess, VllmServerProcess

GROUPS, GROUP_SIZE = 4, 8


async def conversation(
    client: openai.AsyncOpenAI, item: str, turns: int, seed: int | None, max_tokens: int = MAX_TOKENS
) -> int:
    """One rollout of ``turns`` assistant turns; returns the prompt tokens of its last turn."""
    messages: list[dict[str, Any]] = [
        *EXAMPLE_EPISODE,
        {"role": "user", "content": f"How much does a {item} cost?"},
    ]
    prompt_tokens = 0
    for turn in range(turns):
        completion = await client.chat.completions.create(
            model=SMOLLM2_NAME,
            messages=messages,  # type: ignore[arg-type]
            tools=TOOLS,  # type: ignore[arg-type]
            max_tokens=max_tokens,
            temperature=1.0,
            seed=None if seed is None else seed * 8 + turn,
        )
        prompt_tokens = completion.usage.prompt_tokens if completion.usage else 0
        messages.append({"role": "assistant", "content": completion.choices[0].message.content or ""})
        if turn + 1 < turns:
            messages.append({"role": "user", "content": json.dumps({"item": item, "price": CATALOG[item]})})
    return prompt_tokens


async def one_step(
    base_url: str,
    turns: int,
    max_tokens: int = MAX_TOKENS,
    *,
    seeded: bool = True,
    groups: int = GROUPS,
    group_size: int = GROUP_SIZE,
) -> tuple[float, int]:
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=3600)
    items = [item for item in CATALOG if item != EXAMPLE_ITEM][:groups]
    started = time.perf_counter()
    lengths = await asyncio.gather(
        *(
            conversation(
                client, item, turns, seed=g * group_size + i if seeded else None, max_tokens=max_tokens
            )
            for g, item in enumerate(items)
            for i in range(group_size)
        )
    )
    elapsed = time.perf_counter() - started
    await client.close()  # inside its event loop: asyncio.run closes the loop next
    return elapsed, max(lengths)


async def warm_up(client: ServingClient) -> None:
    """One short request that shares no prompt block with the tool agent's."""
    openai_client = openai.AsyncOpenAI(base_url=client.openai_base_url, api_key="unused", max_retries=0)
    await openai_client.chat.completions.create(
        model=SMOLLM2_NAME, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
    )
    await openai_client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", nargs="+", choices=("cpu", "vllm"), default=None)
    parser.add_argument("--vllm-dtype", nargs="+", choices=("fp32", "bf16"), default=["fp32"])
    parser.add_argument("--no-cache-off", action="store_true", help="leave out our server with the cache off")
    parser.add_argument("--threads", type=int, default=None, help="torch threads of our server")
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=MAX_TOKENS,
        help="new tokens a turn (the example's own by default; 1 shows the prefill alone)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="times the whole comparison runs")
    parser.add_argument("--groups", type=int, default=GROUPS)
    parser.add_argument("--group-size", type=int, default=GROUP_SIZE)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    engines = args.engines or ["cpu", *(["vllm"] if vllm_found() else [])]
    servers: dict[str, ServerProcess] = {}
    if "cpu" in engines:
        if not args.no_cache_off:
            servers["ours, cache off"] = server_for("cpu", "fp32", prefix_cache_mb=0, threads=args.threads)
        servers["ours"] = server_for("cpu", "fp32", threads=args.threads)
    if "vllm" in engines:
        for dtype in args.vllm_dtype:
            servers[f"{ENGINE_NAMES['vllm']} {dtype}"] = server_for("vllm", dtype)
    results: dict[tuple[str, int], list[tuple[float, int]]] = {}
    with running(servers):
        for server in servers.values():
            asyncio.run(warm_up(server.client))
        # All servers stay up and the sides alternate, so a change in the machine's load between them shows
        # in every one; seeded requests make our two sides sample the same conversations.
        for round_ in range(args.rounds):
            for turns in (1, 3):
                for label, server in servers.items():
                    asyncio.run(forget_prefixes(server))
                    step = one_step(
                        server.client.openai_base_url,
                        turns,
                        args.max_tokens,
                        seeded=not isinstance(server, VllmServerProcess),
                        groups=args.groups,
                        group_size=args.group_size,
                    )
                    result = asyncio.run(step)
                    results.setdefault((label, turns), []).append(result)
                    print(f"round {round_ + 1}: {label} turns={turns}: {result[0]:.1f} s", flush=True)
    print(table(list(servers), results))


def table(labels: list[str], results: dict[tuple[str, int], list[tuple[float, int]]]) -> str:
    """Median seconds of a step per side and stage, then ours off / on and each vLLM / ours."""
    ratios = [("ours, cache off", "ours")] if "ours, cache off" in labels and "ours" in labels else []
    ratios += [(label, "ours") for label in labels if label.startswith("vLLM") and "ours" in labels]
    header = ["stage", "turns", "last prompt tokens", *(f"{label} (s)" for label in labels)]
    header += [f"{a} / {b}" for a, b in ratios]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    seeded = "ours" if "ours" in labels else labels[0]  # the sides that draw alike; vLLM's draws its own
    for stage, turns in (("early", 1), ("late", 3)):
        median = {label: statistics.median(s for s, _ in results[(label, turns)]) for label in labels}
        tokens = max(n for _, n in results[(seeded, turns)])
        cells = [stage, str(turns), str(tokens), *(f"{median[label]:.1f}" for label in labels)]
        cells += [f"{median[a] / median[b]:.2f}x" for a, b in ratios]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
