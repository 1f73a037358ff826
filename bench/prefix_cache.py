"""Prefix caching on the tool agent's rollouts: one step's rollouts through the real CPU server, cache on vs off.

``PYTHONPATH=. python bench/prefix_cache.py`` starts ``serving.server`` twice (``--prefix-cache-mb 0`` and the
default), both up at once and used in turn, and times one step of ``examples/tool_agent.py`` conversations, 4 groups x 8 rollouts, at two stages
of a run: *early* (one turn: the base model answers without calling the tool) and *late* (three turns: every
reply is followed by a tool result, as once the agent has learned to call it, so the conversation grows). The
prompts, tools, sampling and token limits are the example's own; only the number of turns is scripted, and
each conversation's requests carry a seed so the two sides draw alike.

Each server answers one unrelated request first (its first forwards are slower), and its prefix cache is
emptied (``/sleep`` then ``/wake_up``) before every timed step: in a run each step samples with a newly
trained adapter, whose keys and values no earlier step computed. ``--rounds`` repeats the whole comparison;
the table shows each side's median.
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
from examples.tool_agent import CATALOG, EXAMPLE_EPISODE, EXAMPLE_ITEM, MAX_TOKENS, TOOLS
from schemas.settings import EngineSettings
from serving.client import ServingClient
from serving.launchers import CpuServerProcess

GROUPS, GROUP_SIZE = 4, 8


async def conversation(
    client: openai.AsyncOpenAI, item: str, turns: int, seed: int, max_tokens: int = MAX_TOKENS
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
            seed=seed * 8 + turn,
        )
        prompt_tokens = completion.usage.prompt_tokens if completion.usage else 0
        messages.append({"role": "assistant", "content": completion.choices[0].message.content or ""})
        if turn + 1 < turns:
            messages.append({"role": "user", "content": json.dumps({"item": item, "price": CATALOG[item]})})
    return prompt_tokens


async def one_step(base_url: str, turns: int, max_tokens: int = MAX_TOKENS) -> tuple[float, int]:
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=3600)
    items = [item for item in CATALOG if item != EXAMPLE_ITEM][:GROUPS]
    started = time.perf_counter()
    lengths = await asyncio.gather(
        *(
            conversation(client, item, turns, seed=g * GROUP_SIZE + i, max_tokens=max_tokens)
            for g, item in enumerate(items)
            for i in range(GROUP_SIZE)
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


async def forget(client: ServingClient) -> None:
    """Empty the server's prefix cache (sleeping drops it)."""
    await client.sleep()
    await client.wake_up()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="torch threads of the server")
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=MAX_TOKENS,
        help="new tokens a turn (the example's own by default; 1 shows the prefill alone)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="times the whole comparison runs")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    results: dict[tuple[str, int], list[tuple[float, int]]] = {}
    servers = {
        label: CpuServerProcess(SMOLLM2_NAME, EngineSettings(prefix_cache_mb=mb), threads=args.threads)
        for label, mb in (("off", 0), ("on", 1024))
    }
    try:
        for server in servers.values():
            server.start()
            asyncio.run(warm_up(server.client))
        # Both servers stay up and the two sides alternate, so a change in the machine's load between
        # them shows in both; seeded requests make both sides sample the same conversations.
        for round_ in range(args.rounds):
            for turns in (1, 3):
                for label, server in servers.items():
                    asyncio.run(forget(server.client))
                    result = asyncio.run(one_step(server.client.openai_base_url, turns, args.max_tokens))
                    results.setdefault((label, turns), []).append(result)
                    print(f"round {round_ + 1}: {label} turns={turns}: {result[0]:.1f} s", flush=True)
    finally:
        for server in servers.values():
            server.stop()
    print("| stage | turns | last prompt tokens | cache off (s) | cache on (s) | off / on |")
    print("|---|---:|---:|---:|---:|---:|")
    for stage, turns in (("early", 1), ("late", 3)):
        off = statistics.median(seconds for seconds, _ in results[("off", turns)])
        on = statistics.median(seconds for seconds, _ in results[("on", turns)])
        tokens = max(n for _, n in results[("on", turns)])
        print(f"| {stage} | {turns} | {tokens} | {off:.1f} | {on:.1f} | {off / on:.2f}x |")


if __name__ == "__main__":
    main()
