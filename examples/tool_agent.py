"""A multi-turn tool-using agent: look an item's price up in a catalog, then answer with it.

The rollout offers one tool, ``lookup_price(item)``, reads the ``tool_calls`` the server parsed from
the model's ``<tool_call>{json}</tool_call>``, runs them against ``PriceCatalog``, appends the results as
``tool`` messages and asks again, for at most ``MAX_TURNS`` assistant turns. One worked example episode
(a call, its result, the answer) precedes the question so a 135M model sees the protocol.

Reward, with partial credit so groups differ from step 0:

- 0.05 for structured output (a ``<tool...>`` tag or a JSON object: the base model imitates the
  example's ``<tool_response>`` before it ever writes a call),
- 0.15 for attempting a call (``<tool_call>`` written, even if its JSON does not parse),
- 0.2 for a well-formed call (the server parsed it into ``tool_calls``),
- 0.2 for calling ``lookup_price`` with an item of the catalog (the asked one or not),
- 0.4 when the final answer contains the asked item's price.

Measured on the base model through our CPU server (6 scenarios x 4): mean reward 0.06; most replies
imitate the example's ``<tool_response>`` (0.05), 8% write ``<tool_call>`` (0.2), none parse yet, and
half the groups have reward variance. Learning starts from the rare ``<tool_call>`` attempts, so this
task wants groups of 8 or more.

Run spec: ``task.rollout = "examples.tool_agent:rollout"``, ``task.scenarios = "examples.tool_agent:scenarios"``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from openai import AsyncOpenAI

from schemas.trajectory import Choice, Trajectory

MAX_TURNS = 3
MAX_TOKENS = 48
CATALOG: dict[str, int] = {
    "anvil": 42,
    "bucket": 7,
    "candle": 3,
    "drum": 58,
    "easel": 25,
    "flute": 19,
    "globe": 31,
    "hammer": 12,
    "kettle": 16,
    "ladder": 64,
    "mirror": 27,
    "pillow": 9,
}
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "lookup_price",
            "description": "Look up the price of an item in the store's catalog, in dollars.",
            "parameters": {
                "type": "object",
                "properties": {"item": {"type": "string", "description": "The item's name, e.g. 'globe'."}},
                "required": ["item"],
            },
        },
    }
]
EXAMPLE_ITEM = "globe"
EXAMPLE_EPISODE: list[dict[str, Any]] = [
    {"role": "user", "content": f"How much does a {EXAMPLE_ITEM} cost?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_example",
                "type": "function",
                "function": {"name": "lookup_price", "arguments": json.dumps({"item": EXAMPLE_ITEM})},
            }
        ],
    },
    {
        "role": "tool",
        "tool_call_id": "call_example",
        "content": json.dumps({"item": EXAMPLE_ITEM, "price": CATALOG[EXAMPLE_ITEM]}),
    },
    {"role": "assistant", "content": f"A {EXAMPLE_ITEM} costs ${CATALOG[EXAMPLE_ITEM]}."},
]
STRUCTURE_CREDIT = 0.05
ATTEMPT_CREDIT = 0.15
WELL_FORMED_CREDIT = 0.2
RIGHT_TOOL_CREDIT = 0.2
ANSWER_CREDIT = 0.4
_STRUCTURE = re.compile(r"<tool|\{.*\}", re.DOTALL)


class RolloutModel(Protocol):
    @property
    def name(self) -> str: ...

    def openai_client(self) -> AsyncOpenAI: ...


def scenarios() -> list[dict[str, Any]]:
    """One question per catalog item except the worked example's."""
    return [
        {"id": f"price-{item}", "item": item, "price": price}
        for item, price in CATALOG.items()
        if item != EXAMPLE_ITEM
    ]


class PriceCatalog:
    """The tool environment: executes ``lookup_price`` calls; errors are returned to the model, not raised."""

    def __init__(self, catalog: dict[str, int] | None = None) -> None:
        self.catalog = dict(CATALOG if catalog is None else catalog)

    def execute(self, name: str, arguments: str) -> dict[str, Any]:
        if name != "lookup_price":
            return {"error": f"unknown tool {name!r}; the only tool is lookup_price"}
        try:
            args = json.loads(arguments) if arguments else {}
        except json.JSONDecodeError:
            return {"error": "arguments are not valid JSON"}
        item = str(args.get("item", "")).strip().lower() if isinstance(args, dict) else ""
        if item not in self.catalog:
            return {"error": f"no item {item!r} in the catalog"}
        return {"item": item, "price": self.catalog[item]}


@dataclass
class Episode:
    """What happened in one rollout, for the reward."""

    structured: bool = False
    """Some reply held a ``<tool...>`` tag or a JSON object (the base model often writes ``<tool_response>``)."""
    attempted_call: bool = False
    well_formed_calls: int = 0
    catalog_calls: int = 0
    final_answer: str = ""
    tool_results: list[dict[str, Any]] = field(default_factory=list)


def answer_has_price(answer: str, price: int) -> bool:
    return str(price) in re.findall(r"\d+", answer)


def score_episode(episode: Episode, price: int) -> float:
    """The reward of an episode whose asked item costs ``price`` (see the module doc)."""
    called = episode.attempted_call or episode.well_formed_calls > 0
    reward = STRUCTURE_CREDIT * (episode.structured or called)
    reward += ATTEMPT_CREDIT * called
    reward += WELL_FORMED_CREDIT * (episode.well_formed_calls > 0)
    reward += RIGHT_TOOL_CREDIT * (episode.catalog_calls > 0)
    reward += ANSWER_CREDIT * answer_has_price(episode.final_answer, price)
    return round(reward, 6)


async def rollout(model: RolloutModel, scenario: dict[str, Any]) -> Trajectory:
    """Ask for a price; run the model's tool calls for up to ``MAX_TURNS`` turns; score the episode."""
    env = PriceCatalog()
    client = model.openai_client()
    trajectory = Trajectory(
        messages_and_choices=[
            *EXAMPLE_EPISODE,
            {"role": "user", "content": f"How much does a {scenario['item']} cost?"},
        ],
        tools=TOOLS,
        metadata={"scenario_id": str(scenario.get("id", "")), "item": str(scenario["item"])},
    )
    episode = Episode()
    for _ in range(MAX_TURNS):
        completion = await client.chat.completions.create(
            model=model.name,
            messages=trajectory.messages(),  # type: ignore[arg-type]
            tools=TOOLS,  # type: ignore[arg-type]
            max_tokens=MAX_TOKENS,
            temperature=1.0,
        )
        choice = completion.choices[0]
        trajectory.messages_and_choices.append(Choice.model_validate(choice))
        content = choice.message.content or ""
        calls = choice.message.tool_calls or []
        episode.attempted_call |= "<tool_call>" in content or bool(calls)
        episode.structured |= _STRUCTURE.search(content) is not None
        if not calls:
            episode.final_answer = content
            break
        for call in calls:
            function = call.function  # type: ignore[union-attr]
            episode.well_formed_calls += 1
            result = env.execute(function.name, function.arguments)
            episode.catalog_calls += "price" in result
            episode.tool_results.append(result)
            trajectory.messages_and_choices.append(
                {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)}
            )
    trajectory.reward = score_episode(episode, int(scenario["price"]))
    trajectory.metrics = {
        "tool_calls": episode.well_formed_calls,
        "catalog_calls": episode.catalog_calls,
        "answered": answer_has_price(episode.final_answer, int(scenario["price"])),
        "turns": len(trajectory.choices()),
    }
    return trajectory
