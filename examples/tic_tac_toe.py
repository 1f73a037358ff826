"""ART's tic-tac-toe example (examples/tic_tac_toe in OpenPipe/ART), ported to durable-grpo.

Changed from ART's program: the import (``import dgrpo as art``), the model (SmolLM2-135M on this CPU, and
the base model on the same server as the comparison model instead of gpt-4o / gpt-4o-mini), and the sizes
(steps, rollouts per step, tokens per move), which are flags here. Left out: ART's optional S3 sync,
Together deployment and SkyPilot cluster, and its OpenPipe request reporting (a hosted service).

    python examples/tic_tac_toe.py --steps 2 --group-size 6

The agent plays one game per rollout against a random opponent, one chat turn per move; each move is
the policy's own ``Choice`` appended to the trajectory, and ``trajectory.messages()`` is the next prompt.

One change makes a 135M model's games differ from step 0, so GRPO has something to learn from: a game
ended by an unusable reply scores ART's -100 (plus its credit for valid moves made first) plus half of
how close the reply came to a well-formed ``<move>B2</move>`` (examples/shaping.py). Each game draws its
sides and the opponent's moves from its own seeded generator and sends ``seed=`` with every request, so
a run is repeatable.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import random
import re
from dataclasses import dataclass, field

import openai
from pydantic import BaseModel

import dgrpo as art
from dgrpo.local import LocalBackend
from examples.shaping import closeness

SIZE = 3
EMPTY = "_"
MOVE = re.compile(r"^\s*<move>\s*([A-Za-z])\s*(\d)\s*</move>\s*$")
WELL_FORMED = tuple(f"<move>{chr(ord('A') + r)}{c + 1}</move>" for r in range(SIZE) for c in range(SIZE))
FORMAT_CREDIT = 0.5
"""At most this much is added to an unusable reply's -100, by how close it came to ``WELL_FORMED``."""


# ---- the game ---------------------------------------------------------------------------------------
@dataclass
class Game:
    """A board (rows A-C, columns 1-3), who plays which symbol, and the opponent's dice."""

    agent: str
    opponent: str
    rng: random.Random
    board: list[list[str]] = field(default_factory=lambda: [[EMPTY] * SIZE for _ in range(SIZE)])

    def empty_cells(self) -> list[tuple[int, int]]:
        return [(r, c) for r in range(SIZE) for c in range(SIZE) if self.board[r][c] == EMPTY]


def new_game(rng: random.Random) -> Game:
    agent = rng.choice(["x", "o"])
    return Game(agent=agent, opponent="o" if agent == "x" else "x", rng=rng)


def render(game: Game) -> str:
    """The board as the agent sees it: a header of column numbers, then one lettered line per row."""
    lines = ["   " + "   ".join(str(c + 1) for c in range(SIZE))]
    lines += [f"{chr(ord('A') + r)}  " + " | ".join(game.board[r]) for r in range(SIZE)]
    return "\n".join(lines) + "\n"


def play_opponent(game: Game) -> None:
    row, col = game.rng.choice(game.empty_cells())
    game.board[row][col] = game.opponent


def play_agent(game: Game, reply: str) -> None:
    """Apply the agent's ``<move>B2</move>``; ValueError when it is malformed, off the board or taken."""
    found = MOVE.match(reply)
    if found is None:
        raise ValueError(f"not a <move>..</move> reply: {reply!r}")
    row, col = ord(found.group(1).upper()) - ord("A"), int(found.group(2)) - 1
    if not (0 <= row < SIZE and 0 <= col < SIZE):
        raise ValueError(f"{found.group(1)}{found.group(2)} is off the board")
    if game.board[row][col] != EMPTY:
        raise ValueError(f"{found.group(1)}{found.group(2)} is taken")
    game.board[row][col] = game.agent


def winner(board: list[list[str]]) -> str | None:
    """``x`` or ``o`` with three in a line, ``draw`` on a full board, else None."""
    lines = [*board, *([board[r][c] for r in range(SIZE)] for c in range(SIZE))]
    lines += [[board[i][i] for i in range(SIZE)], [board[i][SIZE - 1 - i] for i in range(SIZE)]]
    for line in lines:
        if line[0] != EMPTY and all(cell == line[0] for cell in line):
            return line[0]
    return "draw" if all(cell != EMPTY for row in board for cell in row) else None


# ---- the rollout (ART's, with the move budget as a size) ---------------------------------------------
class TicTacToeScenario(BaseModel):
    step: int
    seed: int = 0
    """The game's: its sides, the opponent's moves and the requests' sampling."""


MAX_MOVE_TOKENS = 12
"""ART allows 128 tokens a move; a move is about 8 tokens, and on a CPU every token counts."""


@art.retry(exceptions=(openai.LengthFinishReasonError,))
async def rollout(model: art.Model, scenario: TicTacToeScenario) -> art.Trajectory:
    game = new_game(random.Random(scenario.seed))
    trajectory = art.Trajectory(
        messages_and_choices=[
            {
                "role": "system",
                "content": "You are a tic-tac-toe player playing against an opponent. Always choose the move "
                "most likely to lead to a win. Reply with your move as an XML object with one property "
                f"'move', like so: <move>A1</move>. Moves are 'A1', 'B3', 'C2', etc. You are {game.agent}.",
            }
        ],
        reward=0,
    )
    moves = 0
    invalid = False
    if game.agent == "o":
        play_opponent(game)

    while winner(game.board) is None:
        trajectory.messages_and_choices.append({"role": "user", "content": render(game)})
        completion = await model.openai_client().chat.completions.create(
            model=model.get_inference_name(),
            messages=trajectory.messages(),  # type: ignore[arg-type]
            max_completion_tokens=MAX_MOVE_TOKENS,
            seed=scenario.seed * 100 + moves,
        )
        choice = completion.choices[0]
        trajectory.messages_and_choices.append(choice)
        reply = choice.message.content or ""
        try:
            play_agent(game, reply)
        except ValueError:
            invalid = True
            # As in ART: far below any finished game, a little better for each valid move made first;
            # here also for a reply closer to the format.
            trajectory.reward = (
                -100 + math.log(moves + 1) / math.log(100) + FORMAT_CREDIT * closeness(reply, WELL_FORMED)
            )
            break
        moves += 1
        if winner(game.board) is not None:
            break
        play_opponent(game)

    result = winner(game.board)
    if result == game.agent:
        trajectory.reward, trajectory.metrics["win"] = 1, 1
    elif result == game.opponent:
        trajectory.reward, trajectory.metrics["win"] = 0, 0
    elif result == "draw":
        trajectory.reward, trajectory.metrics["win"] = 0.5, 0.5
    trajectory.metrics["num_moves"] = moves
    trajectory.metrics["invalid_move"] = 1 if invalid else 0
    return trajectory


# ---- training (ART's main, with the sizes as flags) --------------------------------------------------
@dataclass
class Played:
    """What ``train`` gathered: each step's training groups, and the base model's ``val`` games."""

    train: list[list[art.TrajectoryGroup]] = field(default_factory=list)
    val: list[art.TrajectoryGroup] = field(default_factory=list)


async def train(args: argparse.Namespace) -> Played:
    played = Played()
    backend = LocalBackend(path=args.path)
    model = art.TrainableModel(name=args.name, project="tic-tac-toe", base_model=args.base_model)
    try:
        await model.register(backend)
        for i in range(await model.get_step(), args.steps):
            train_groups = await art.gather_trajectory_groups(
                (
                    art.TrajectoryGroup(
                        rollout(model, TicTacToeScenario(step=i, seed=args.seed + 100 * i + k))
                        for k in range(args.group_size)
                    )
                    for _ in range(1)
                ),
                pbar_desc="gather",
            )
            played.train.append(train_groups)
            await model.delete_checkpoints()
            await model.train(train_groups, config=art.TrainConfig(learning_rate=args.learning_rate))

        if args.benchmark:
            # ART compares with gpt-4o(-mini) on OpenAI; here the base model on the same server.
            base = art.Model(
                name="base",
                project="tic-tac-toe",
                inference_model_name=model.get_inference_name(0),
                inference_base_url=model.inference_base_url,
            )
            await base.register(backend)
            groups = await art.gather_trajectory_groups(
                (
                    art.TrajectoryGroup(
                        rollout(base, TicTacToeScenario(step=0, seed=args.seed + k))
                        for k in range(args.group_size)
                    ),
                ),
                pbar_desc=f"gather {base.name}",
                max_exceptions=1,
            )
            await base.log(groups, split="val")
            played.val = groups
        print(f"{model.name} is at step {await model.get_step()}")
    finally:
        await backend.close()
    return played


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=2, help="train until the model is at this step (ART: 50)")
    p.add_argument("--group-size", type=int, default=6, help="games per step (ART: 96)")
    p.add_argument("--name", default="smollm2-ttt")
    p.add_argument("--base-model", default="smollm2-135m-instruct")
    p.add_argument("--learning-rate", type=float, default=5e-5)
    p.add_argument("--path", default="./.dgrpo", help="the LocalBackend's directory")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--benchmark", action="store_true", help="also play and log the base model as 'val'")
    return p.parse_args(argv)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(train(parse_args()))
