"""ART's 2048 example (examples/2048 in OpenPipe/ART: train.py + rollout.py), ported to durable-grpo.

Changed from ART's program: the import (``import dgrpo as art``), the model (SmolLM2-135M on this CPU) and
the sizes, which are flags here: the winning tile (ART: 2048), a cap on moves per game (ART plays to the
end), tokens per move (ART: 128), rollouts per step (ART: 18) and steps (ART: 40). Left out: ART's S3
backup (checkpoints already live in S3 here) and its weave tracing.

    python examples/game_2048.py --steps 2 --group-size 4 --max-moves 3

Two changes make a 135M model's games differ from step 0, so GRPO has something to learn from:

- A reply without ART's ``<move>left</move>`` still moves when it names a direction (its last one wins).
- ART scores a game ended by an unusable reply -1 whatever the board; here such a game scores -1 plus the
  board's progress (ART's own partial credit for a finished game) plus half of how close the reply came
  to a well-formed ``<move>..</move>`` (examples/shaping.py), so no two different failures tie.

Each rollout draws its tiles from its own seeded generator and sends ``seed=`` with every request, so a
run is repeatable: concurrent games never share one random stream.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import re

import openai

import dgrpo as art
from dgrpo.local import LocalBackend
from examples.shaping import closeness

BASE_MODEL = "smollm2-135m-instruct"
DIRECTIONS = ("left", "right", "up", "down")
XML_MOVE = re.compile(r"<move>\s*(left|right|up|down)\s*</move>", re.IGNORECASE)
ANY_DIRECTION = re.compile(r"\b(left|right|up|down)\b", re.IGNORECASE)
WELL_FORMED = tuple(f"<move>{d}</move>" for d in DIRECTIONS)
FORMAT_CREDIT = 0.5
"""At most this much of an unusable reply's -1 is earned back by how close it came to ``WELL_FORMED``."""

Board = list[list[int]]
"""Rows of tile values; 0 is an empty cell."""


# ---- the game ---------------------------------------------------------------------------------------
def new_board(rng: random.Random, size: int = 4) -> Board:
    board = [[0] * size for _ in range(size)]
    spawn(board, rng)
    spawn(board, rng)
    return board


def spawn(board: Board, rng: random.Random) -> None:
    """A 2 (nine times in ten) or a 4 on a random empty cell, as the game does after every move."""
    empty = [(r, c) for r, row in enumerate(board) for c, value in enumerate(row) if value == 0]
    if empty:
        r, c = rng.choice(empty)
        board[r][c] = 2 if rng.random() < 0.9 else 4


def _slide_left(row: list[int]) -> list[int]:
    """One row pushed left: equal neighbours merge once, the rest keep their order."""
    tiles = [v for v in row if v]
    merged: list[int] = []
    i = 0
    while i < len(tiles):
        if i + 1 < len(tiles) and tiles[i] == tiles[i + 1]:
            merged.append(tiles[i] * 2)
            i += 2
        else:
            merged.append(tiles[i])
            i += 1
    return merged + [0] * (len(row) - len(merged))


def slid(board: Board, direction: str) -> Board:
    """The board after a move (no new tile yet)."""
    if direction == "left":
        return [_slide_left(row) for row in board]
    if direction == "right":
        return [_slide_left(row[::-1])[::-1] for row in board]
    columns = [list(col) for col in zip(*board, strict=True)]
    moved = slid(columns, "left" if direction == "up" else "right")
    return [list(row) for row in zip(*moved, strict=True)]


def can_move(board: Board) -> bool:
    return any(slid(board, d) != board for d in DIRECTIONS)


def max_cell_value(board: Board) -> int:
    return max(max(row) for row in board)


def total_board_value(board: Board) -> int:
    return sum(sum(row) for row in board)


def render_board(board: Board) -> str:
    return "\n".join("|".join(str(v) if v else "_" for v in row) for row in board)


def parse_move(reply: str) -> str:
    """ART's ``<move>..</move>``, else the reply's last direction word; ValueError when it names none."""
    tagged = XML_MOVE.search(reply)
    if tagged is not None:
        return tagged.group(1).lower()
    named = ANY_DIRECTION.findall(reply)
    if not named:
        raise ValueError(f"no move in {reply!r}")
    return str(named[-1]).lower()


def board_reward(board: Board, winning_value: int) -> float:
    """ART's score of a finished game: 2 for a win, else the max tile and (a fifth as much) the board's
    total, each log-scaled from 0 (all 2s) to 1 (the winning tile)."""
    max_value = max_cell_value(board)
    if max_value >= winning_value:
        return 2.0
    cells = len(board) * len(board[0])
    max_part = (math.log2(max_value) - 1) / (math.log2(winning_value) - 1)
    board_part = (math.log2(total_board_value(board)) - 1) / (math.log2(winning_value * cells) - 1)
    return max_part + 0.2 * board_part


# ---- the rollout (ART's, with the sizes as arguments) -------------------------------------------------
SYSTEM_PROMPT = (
    "You are an excellent 2048 player. Always choose the move most likely to lead to combine cells to "
    "eventually reach the number {winning_value}. Optional moves are 'left', 'right', 'up', 'down'. Return "
    "your move as an XML object with a single property 'move', like so: <move>left</move>"
)


@art.retry(exceptions=(openai.LengthFinishReasonError, openai.APITimeoutError))
async def rollout(
    model: art.Model, step: int, seed: int, winning_value: int, max_moves: int, max_tokens: int
) -> art.Trajectory:
    rng = random.Random(seed)
    board = new_board(rng)
    trajectory = art.Trajectory(
        messages_and_choices=[
            {"role": "system", "content": SYSTEM_PROMPT.format(winning_value=winning_value)},
        ],
        metadata={"game_seed": seed, "step": step},
        reward=0,
    )
    move_number = 0
    invalid = False
    format_credit = 0.0
    while True:
        trajectory.messages_and_choices.append({"role": "user", "content": render_board(board)})
        chat_completion = await model.openai_client().chat.completions.create(
            model=model.get_inference_name(),
            messages=trajectory.messages(),  # type: ignore[arg-type]
            max_completion_tokens=max_tokens,
            seed=seed * 1_000 + move_number,
        )
        choice = chat_completion.choices[0]
        trajectory.messages_and_choices.append(choice)
        try:
            direction = parse_move(choice.message.content or "")
        except ValueError:
            invalid = True
            format_credit = FORMAT_CREDIT * closeness(choice.message.content or "", WELL_FORMED)
            break
        moved = slid(board, direction)
        if moved != board:  # a move that shifts nothing adds no tile, as in the game
            board = moved
            spawn(board, rng)
        move_number += 1
        won = max_cell_value(board) >= winning_value
        if won or not can_move(board) or move_number >= max_moves:
            break

    trajectory.reward = board_reward(board, winning_value) - (1 - format_credit if invalid else 0)
    trajectory.metrics["max_value"] = max_cell_value(board)
    trajectory.metrics["board_value"] = total_board_value(board)
    trajectory.metrics["num_moves"] = move_number
    trajectory.metrics["invalid_move"] = 1 if invalid else 0
    trajectory.metrics["win"] = 1 if max_cell_value(board) >= winning_value else 0
    return trajectory


# ---- training (ART's train.py, with the sizes as flags) ---------------------------------------------
async def train(args: argparse.Namespace) -> list[list[art.TrajectoryGroup]]:
    """Train to ``--steps``; returns each step's groups, as gathered."""
    gathered: list[list[art.TrajectoryGroup]] = []
    with LocalBackend(path=args.home) as backend:
        model = art.TrainableModel(name=args.name, project="2048", base_model=BASE_MODEL)
        await model.register(backend)
        for i in range(await model.get_step(), args.steps):
            train_groups = await art.gather_trajectory_groups(
                (
                    art.TrajectoryGroup(
                        rollout(
                            model,
                            i,
                            seed=args.seed + 100 * i + k,
                            winning_value=args.winning_value,
                            max_moves=args.max_moves,
                            max_tokens=args.max_tokens,
                        )
                        for k in range(args.group_size)
                    )
                    for _ in range(1)
                ),
                pbar_desc="gather",
                max_exceptions=args.group_size // 2,
            )
            gathered.append(train_groups)
            await model.delete_checkpoints()
            await model.train(train_groups, config=art.TrainConfig(learning_rate=args.learning_rate))
        print(f"{model.name} is at step {await model.get_step()}")
    return gathered


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", default="tutorial-001")
    p.add_argument("--home", default="./.dgrpo", help="the LocalBackend's directory")
    p.add_argument("--steps", type=int, default=40, help="ART: 40")
    p.add_argument("--group-size", type=int, default=18, help="games per step (ART: 18)")
    p.add_argument("--winning-value", type=int, default=2048, help="the tile that wins (ART: 2048)")
    p.add_argument("--max-moves", type=int, default=1_000, help="moves per game at most (ART: no limit)")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens per move (ART: 128)")
    p.add_argument("--learning-rate", type=float, default=1e-5, help="ART: 1e-5")
    p.add_argument("--seed", type=int, default=42, help="the first game's seed (ART: random.seed(42))")
    return p.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(train(parse_args()))
