"""examples/tic_tac_toe.py (ART's example, ported): its game rules, and its multi-turn rollout against a
scripted OpenAI-compatible endpoint (the seam where the inference server plugs in).

Training it needs reward variance: SmolLM2-135M never answers in the ``<move>..</move>`` format, so every
game scores ART's -100 and the step has no learning signal (see docs/art-compat.md).
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import dgrpo as art
from examples import tic_tac_toe as ttt

sys.path.insert(0, str(Path(__file__).parents[1] / "activities"))
from openai_stub import MODEL, StubServer, openai_stub


@pytest.fixture
def stub() -> Iterator[StubServer]:
    with openai_stub() as server:
        yield server


def board(*rows: str) -> list[list[str]]:
    return [list(row) for row in rows]


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        (("xxx", "o_o", "___"), "x"),
        (("ox_", "ox_", "o_x"), "o"),
        (("x_o", "_xo", "o_x"), "x"),
        (("_xo", "xo_", "o__"), "o"),
        (("xox", "xoo", "oxx"), "draw"),
        (("xo_", "___", "___"), None),
    ],
)
def test_winner(rows: tuple[str, ...], expected: str | None) -> None:
    assert ttt.winner(board(*rows)) == expected


def test_agent_moves_are_parsed_and_checked() -> None:
    game = ttt.Game(agent="x", opponent="o")
    ttt.play_agent(game, " <move>b2</move>\n")
    assert game.board[1][1] == "x"
    for reply, problem in [
        ("<move>B2</move>", "taken"),
        ("<move>D1</move>", "off the board"),
        ("B3", "not a <move>"),
        ("<move>A1</move> and more", "not a <move>"),
    ]:
        with pytest.raises(ValueError, match=problem):
            ttt.play_agent(game, reply)
    assert ttt.render(game).splitlines()[2] == "B  _ | x | _"


async def test_rollout_plays_turns_with_appended_choices(stub: StubServer) -> None:
    seed = next(s for s in range(100) if random.Random(s).choice(["x", "o"]) == "x")
    random.seed(seed)  # the agent plays x: it moves first, so B2 is free
    stub.script = ["<move>B2</move>", "I pick the corner"]
    model = art.Model(
        name="stub", project="ttt", inference_base_url=stub.base_url, inference_model_name=MODEL
    )
    traj = await ttt.rollout(model, ttt.TicTacToeScenario(step=0))

    assert [c.message["content"] for c in traj.choices()] == ["<move>B2</move>", "I pick the corner"]
    assert [m["role"] for m in traj.messages()] == ["system", "user", "assistant", "user", "assistant"]
    second = stub.requests[1]
    assert second["model"] == MODEL
    assert second["messages"][2] == {"role": "assistant", "content": "<move>B2</move>"}
    assert second["messages"][3]["content"].splitlines()[2].split(" | ")[1] == "x"  # B2 is the agent's
    assert traj.metrics["num_moves"] == 1 and traj.metrics["invalid_move"] == 1
    assert traj.reward == pytest.approx(-100 + math.log(2) / math.log(100))
