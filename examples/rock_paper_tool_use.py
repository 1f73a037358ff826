"""ART's rock-paper-tool-use example (examples/rock-paper-tool-use.ipynb in OpenPipe/ART), ported to
durable-grpo.

Changed from ART's program: the import (``import dgrpo as art``), the model (SmolLM2-135M on this CPU; the
opponent is that base model on the same server, by its served name, as ART's is its base model) and the
sizes, which are flags here: the wins that end a game (ART: 3), a cap on rounds (ART has none), tokens per
move, rollouts per step (ART: 64) and steps (ART: 1000).

    python examples/rock_paper_tool_use.py --steps 2 --group-size 4 --max-rounds 3

Both players are asked for their move through the ``play_move`` tool; a round's winner scores 1, as in
ART. Two changes make a 135M model's games differ from step 0, so GRPO has something to learn from:

- A reply without a tool call still plays the last move it names (ART's game would fail on it), and a
  reply that names none plays "none", which loses to any move.
- Every move earns up to 0.1 for its format: all of it through the tool, else as much as the reply's
  text comes close to a well-formed ``play_move`` call (examples/shaping.py), so games rarely tie.

Every request carries ``seed=``, so a run is repeatable.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re

import openai
from openai.types.chat.chat_completion import Choice

import dgrpo as art
from dgrpo.local import LocalBackend
from examples.shaping import closeness

BASE_MODEL = "smollm2-135m-instruct"
MOVES = ("rock", "paper", "scissors")
BEATS = {"rock": "scissors", "paper": "rock", "scissors": "paper"}
NAMED_MOVE = re.compile(r"\b(rock|paper|scissors)\b", re.IGNORECASE)
FORMAT_CREDIT = 0.1
"""Reward for each move's format, on top of ART's 1 per round won: all of it for a ``play_move`` call."""
WELL_FORMED = tuple(
    f'<tool_call>\n{{"name": "play_move", "arguments": {{"move": "{move}"}}}}\n</tool_call>' for move in MOVES
)

TOOLS: art.Tools = [
    {
        "type": "function",
        "function": {
            "name": "play_move",
            "description": "Play a move in rock-paper-scissors",
            "parameters": {
                "type": "object",
                "properties": {
                    "move": {"type": "string", "enum": list(MOVES), "description": "The move to play"}
                },
                "required": ["move"],
            },
        },
    }
]


def get_move(choice: Choice) -> tuple[str, bool]:
    """The move a reply plays, and whether it came through the tool: the first ``play_move`` call's
    ``move``, else the last move the text names, else "none"."""
    for call in choice.message.tool_calls or []:
        if call.type != "function" or call.function.name != "play_move":
            continue
        try:
            move = json.loads(call.function.arguments).get("move")
        except (json.JSONDecodeError, AttributeError):
            continue
        if move in MOVES:
            return move, True
    named = NAMED_MOVE.findall(choice.message.content or "")
    return (str(named[-1]).lower(), False) if named else ("none", False)


def round_winner(first: str, second: str) -> int | None:
    """0 or 1, the player whose move beats the other's ("none" loses to any move); None for a tie."""
    if first == second:
        return None
    if second == "none" or BEATS.get(first) == second:
        return 0
    return 1


@art.retry(exceptions=(openai.APITimeoutError,))
async def rollout(
    model: art.Model, opponent: str, seed: int, wins_to_end: int, max_rounds: int, max_tokens: int
) -> art.Trajectory:
    """One game of the trained model against ``opponent`` (a served model name); the model's trajectory."""
    client = model.openai_client()
    trajectories = [
        art.Trajectory(
            messages_and_choices=[
                {
                    "role": "user",
                    "content": "You are playing rock-paper-scissors with another player. "
                    "What will your first move be?",
                }
            ],
            tools=TOOLS,
            reward=0,
        )
        for _ in range(2)
    ]
    wins = [0, 0]
    tool_moves = 0
    format_score = 0.0
    for round_number in range(max_rounds):
        chat_completions = await asyncio.gather(
            *[
                client.chat.completions.create(
                    messages=trajectory.messages(),  # type: ignore[arg-type]
                    model=name,
                    tools=TOOLS,
                    max_completion_tokens=max_tokens,
                    seed=seed * 1_000 + round_number * 2 + side,
                )
                for side, (trajectory, name) in enumerate(
                    zip(trajectories, (model.get_inference_name(), opponent), strict=True)
                )
            ]
        )
        for trajectory, chat_completion in zip(trajectories, chat_completions, strict=True):
            trajectory.messages_and_choices.append(chat_completion.choices[0])
        (move1, via_tool), (move2, _) = [get_move(c.choices[0]) for c in chat_completions]
        tool_moves += via_tool
        reply = chat_completions[0].choices[0].message.content or ""
        format_score += 1.0 if via_tool else closeness(reply, WELL_FORMED)
        winner = round_winner(move1, move2)
        if winner is not None:
            wins[winner] += 1
        if max(wins) >= wins_to_end or round_number == max_rounds - 1:
            break
        for trajectory, other_move in zip(trajectories, (move2, move1), strict=True):
            trajectory.messages_and_choices.append(
                {
                    "role": "user",
                    "content": f"The other player played {other_move}. What will your next move be?",
                }
            )
    trajectory = trajectories[0]
    trajectory.reward = wins[0] + FORMAT_CREDIT * format_score
    trajectory.metrics["wins"] = wins[0]
    trajectory.metrics["losses"] = wins[1]
    trajectory.metrics["tool_moves"] = tool_moves
    return trajectory


async def train(args: argparse.Namespace) -> list[list[art.Trajectory]]:
    """Train to ``--steps``; returns each step's trajectories, as gathered."""
    gathered: list[list[art.Trajectory]] = []
    with LocalBackend(path=args.home) as backend:
        model = art.TrainableModel(name=args.name, project="rock-paper-tool-use", base_model=BASE_MODEL)
        await model.register(backend)
        opponent = model.get_inference_name(0)  # the base model, served next to the trained adapters
        for i in range(await model.get_step(), args.steps):
            trajectories = await art.gather_trajectories(
                rollout(
                    model,
                    opponent,
                    seed=args.seed + 100 * i + k,
                    wins_to_end=args.wins,
                    max_rounds=args.max_rounds,
                    max_tokens=args.max_tokens,
                )
                for k in range(args.group_size)
            )
            gathered.append(trajectories)
            await model.train(
                [art.TrajectoryGroup(trajectories)],
                config=art.TrainConfig(learning_rate=args.learning_rate),
            )
        print(f"{model.name} is at step {await model.get_step()}")
    return gathered


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", default="001")
    p.add_argument("--home", default="./.dgrpo", help="the LocalBackend's directory")
    p.add_argument("--steps", type=int, default=1_000, help="ART: 1000")
    p.add_argument("--group-size", type=int, default=64, help="games per step (ART: 64)")
    p.add_argument("--wins", type=int, default=3, help="round wins that end a game (ART: 3)")
    p.add_argument("--max-rounds", type=int, default=1_000, help="rounds per game at most (ART: no limit)")
    p.add_argument("--max-tokens", type=int, default=256, help="tokens per move (ART: the server's default)")
    p.add_argument("--learning-rate", type=float, default=5e-5, help="ART: 5e-5")
    p.add_argument("--seed", type=int, default=0, help="the first game's request seed")
    return p.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(train(parse_args()))
