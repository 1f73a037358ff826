"""examples/rock_paper_tool_use.py (ART's rock-paper-tool-use, ported): how a reply's move is read and a
round won, and two real training steps of SmolLM2-135M on the CPU against the base model, their numbers
read back from the run's metrics Parquet."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest
from openai.types.chat.chat_completion import Choice

from dgrpo.model import run_id_of
from examples import rock_paper_tool_use as rps
from tests.examples.stored_run import stored_run


def choice(content: str | None, *calls: tuple[str, str]) -> Choice:
    tool_calls: list[dict[str, Any]] = [
        {"id": f"call-{i}", "type": "function", "function": {"name": name, "arguments": arguments}}
        for i, (name, arguments) in enumerate(calls)
    ]
    message = {"role": "assistant", "content": content, "tool_calls": tool_calls or None}
    return Choice.model_validate({"index": 0, "finish_reason": "stop", "message": message})


@pytest.mark.parametrize(
    ("reply", "move"),
    [
        (choice(None, ("play_move", '{"move": "paper"}')), ("paper", True)),
        (choice("rock!", ("other_tool", '{"move": "paper"}')), ("rock", False)),  # not the game's tool
        (choice("hmm", ("play_move", '{"move": "lizard"}')), ("none", False)),  # not a move
        (choice("hmm", ("play_move", "not json")), ("none", False)),
        (choice("Rock, or maybe Scissors."), ("scissors", False)),  # the last move named
        (choice(None), ("none", False)),
    ],
)
def test_a_move_comes_from_the_tool_else_the_text(reply: Choice, move: tuple[str, bool]) -> None:
    assert rps.get_move(reply) == move


def test_round_winner() -> None:
    assert rps.round_winner("rock", "scissors") == 0
    assert rps.round_winner("rock", "paper") == 1
    assert rps.round_winner("none", "paper") == 1  # no move loses to any move
    assert rps.round_winner("scissors", "none") == 0
    assert rps.round_winner("none", "none") is None
    assert rps.round_winner("paper", "paper") is None


@pytest.mark.slow
async def test_it_trains_two_steps_and_logs_its_games(
    held_backend: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "--home",
        str(held_backend),
        "--steps",
        "2",
        "--group-size",
        "3",
        "--wins",
        "2",
        "--max-rounds",
        "2",
    ]
    sizes = ["--max-tokens", "8", "--learning-rate", "2e-4"]
    gathered = await rps.train(rps.parse_args([*argv, *sizes]))
    assert "001 is at step 2" in capsys.readouterr().out
    records, checkpoints = stored_run(held_backend, run_id_of("rock-paper-tool-use", "001"))
    assert checkpoints == [1, 2]
    for step, trajectories in enumerate(gathered):
        assert len({t.reward for t in trajectories}) > 1  # a learning signal in every step's group
        for trajectory in trajectories:  # multi-turn: the policy's own choices, with the game's tool
            assert len(trajectory.choices()) >= 1 and trajectory.tools == rps.TOOLS
        trained = records[step + 1]  # model.train's numbers for the step it produced
        assert trained["train/reward"] == pytest.approx(statistics.fmean(t.reward for t in trajectories))
        assert trained["train/wins"] == pytest.approx(
            statistics.fmean(t.metrics["wins"] for t in trajectories)
        )
        assert trained["data/step_num_trajectories"] == 3
        assert trained["loss/train"] == trained["loss/train"]  # a number, not NaN
