"""examples/tic_tac_toe.py (ART's example, ported): its game rules, its multi-turn rollout against a
scripted OpenAI-compatible endpoint (the seam where the inference server plugs in), and two real
training steps of SmolLM2-135M on the CPU with the base model's ``val`` games, read back from the metrics
Parquet.

SmolLM2-135M never answers in the ``<move>..</move>`` format at first, so every game ends on its first
reply; the shaped reward (how close that reply came to the format) is what differs within a group.
"""

from __future__ import annotations

import math
import random
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import dgrpo as art
from dgrpo.model import run_id_of
from examples import tic_tac_toe as ttt
from examples.shaping import closeness
from tests.examples.stored_run import stored_run

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
    game = ttt.Game(agent="x", opponent="o", rng=random.Random(0))
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
    # The agent plays x: it moves first, so B2 is free.
    seed = next(s for s in range(100) if random.Random(s).choice(["x", "o"]) == "x")
    stub.script = ["<move>B2</move>", "I pick the corner"]
    model = art.Model(
        name="stub", project="ttt", inference_base_url=stub.base_url, inference_model_name=MODEL
    )
    traj = await ttt.rollout(model, ttt.TicTacToeScenario(step=0, seed=seed))

    assert [c.message["content"] for c in traj.choices()] == ["<move>B2</move>", "I pick the corner"]
    assert [m["role"] for m in traj.messages()] == ["system", "user", "assistant", "user", "assistant"]
    second = stub.requests[1]
    assert second["model"] == MODEL
    assert [r["seed"] for r in stub.requests] == [seed * 100, seed * 100 + 1]
    assert second["messages"][2] == {"role": "assistant", "content": "<move>B2</move>"}
    assert second["messages"][3]["content"].splitlines()[2].split(" | ")[1] == "x"  # B2 is the agent's
    assert traj.metrics["num_moves"] == 1 and traj.metrics["invalid_move"] == 1
    shaped = ttt.FORMAT_CREDIT * closeness("I pick the corner", ttt.WELL_FORMED)
    assert 0 < shaped < ttt.FORMAT_CREDIT
    assert traj.reward == pytest.approx(-100 + math.log(2) / math.log(100) + shaped)


def test_a_reply_closer_to_the_format_earns_more() -> None:
    assert closeness("<move>B2</move>", ttt.WELL_FORMED) == 1.0
    assert closeness("<move>B 2", ttt.WELL_FORMED) > closeness("B2 I guess", ttt.WELL_FORMED) > 0
    assert closeness("", ttt.WELL_FORMED) == 0.0


@pytest.mark.slow
async def test_it_trains_two_steps_and_logs_the_base_model(
    held_backend: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--path", str(held_backend), "--steps", "2", "--group-size", "3", "--learning-rate", "2e-4"]
    played = await ttt.train(ttt.parse_args([*argv, "--benchmark"]))
    assert "smollm2-ttt is at step 2" in capsys.readouterr().out
    records, checkpoints = stored_run(held_backend, run_id_of("tic-tac-toe", "smollm2-ttt"))
    assert checkpoints[-1] == 2
    for step, groups in enumerate(played.train):
        trajectories = [t for group in groups for t in group]
        assert len({t.reward for t in trajectories}) > 1  # a learning signal in every step's group
        trained = records[step + 1]  # model.train's numbers for the step it produced
        assert trained["train/reward"] == pytest.approx(statistics.fmean(t.reward for t in trajectories))
        assert trained["train/invalid_move"] == pytest.approx(
            statistics.fmean(t.metrics["invalid_move"] for t in trajectories)
        )
        assert trained["data/step_num_trajectories"] == 3
    val = [t for group in played.val for t in group]
    base, _ = stored_run(held_backend, run_id_of("tic-tac-toe", "base"))
    assert base[0]["val/reward"] == pytest.approx(statistics.fmean(t.reward for t in val))
    assert base[0]["val/data/step_num_trajectories"] == 3
