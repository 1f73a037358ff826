"""A task for checking a model's shape, not its skill: a conversation with a tool call, played by a model with
random weights (base_models/random_shapes.py) in tests/workflows/test_production_shapes.py and in the GPU script
deploy/gpu/production_shapes.py.

A random model never writes a well-formed ``<tool_call>``, so the call is the conversation's: the assistant's
earlier turn calls ``lookup_price`` (examples/tool_agent.py's tool), the catalog answers it, and the model is
asked twice, with the tool offered (the server renders it through the model's chat template and parses the
reply for calls). Run spec: ``task.rollout = "examples.shape_check:rollout"``, ``task.scenarios =
"examples.shape_check:scenarios"``. The reward is a hash of what the model wrote: it means nothing, but it differs between
rollouts, so every group has something for GRPO to train on.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from examples.tool_agent import TOOLS, PriceCatalog, RolloutModel
from schemas.trajectory import Choice, Trajectory

MAX_TOKENS = 12
ITEMS = ("anvil", "bucket", "candle", "drum", "easel", "flute")


def scenarios() -> list[dict[str, Any]]:
    """One question per item; a scenario may say ``max_tokens`` (each reply's, default ``MAX_TOKENS``)."""
    return [{"id": f"price-{item}", "item": item} for item in ITEMS]


def text_reward(texts: list[str]) -> float:
    """A number in [0, 1) that depends on every character the model wrote (and on nothing else)."""
    digest = hashlib.sha256("\x00".join(texts).encode()).digest()
    return int.from_bytes(digest[:4], "big") / 2**32


async def rollout(model: RolloutModel, scenario: dict[str, Any]) -> Trajectory:
    item = str(scenario["item"])
    arguments = json.dumps({"item": item})
    call = {"id": "call_0", "type": "function", "function": {"name": "lookup_price", "arguments": arguments}}
    result = PriceCatalog().execute("lookup_price", arguments)
    trajectory = Trajectory(
        messages_and_choices=[
            {"role": "system", "content": "You sell things. Use the tool for prices."},
            {"role": "user", "content": f"How much does a {item} cost?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_0", "content": json.dumps(result)},
        ],
        tools=TOOLS,
        metadata={"scenario_id": str(scenario["id"])},
    )
    client = model.openai_client()
    texts = []
    for follow_up in (None, "And two of them?"):
        if follow_up is not None:
            trajectory.messages_and_choices.append({"role": "user", "content": follow_up})
        completion = await client.chat.completions.create(
            model=model.name,
            messages=trajectory.messages(),  # type: ignore[arg-type]
            tools=TOOLS,  # type: ignore[arg-type]
            max_tokens=int(scenario.get("max_tokens", MAX_TOKENS)),
            temperature=1.0,
        )
        choice = completion.choices[0]
        trajectory.messages_and_choices.append(Choice.model_validate(choice))
        texts.append(choice.message.content or "")
    trajectory.reward = text_reward(texts)
    return trajectory
