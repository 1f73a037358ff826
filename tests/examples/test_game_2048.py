"""examples/game_2048.py (ART's 2048, ported): its game rules and shaped reward, and two real training
steps of SmolLM2-135M on the CPU, their numbers read back from the run's metrics Parquet."""

from __future__ import annotations

import random
import statistics
from pathlib import Path

import pytest

from dgrpo.model import run_id_of
from examples import game_2048 as g
from tests.examples.stored_run import stored_run


def test_a_move_slides_and_merges_each_pair_once() -> None:
    board = [[2, 2, 2, 2], [4, 0, 4, 8], [0, 0, 0, 2], [2, 4, 8, 16]]
    assert g.slid(board, "left") == [[4, 4, 0, 0], [8, 8, 0, 0], [2, 0, 0, 0], [2, 4, 8, 16]]
    assert g.slid(board, "right") == [[0, 0, 4, 4], [0, 0, 8, 8], [0, 0, 0, 2], [2, 4, 8, 16]]
    assert g.slid(board, "up") == [[2, 2, 2, 2], [4, 4, 4, 8], [2, 0, 8, 2], [0, 0, 0, 16]]
    assert g.slid(board, "down")[3] == [2, 4, 8, 16]
    assert g.render_board(board).splitlines()[1] == "4|_|4|8"


def test_a_full_board_without_pairs_is_over() -> None:
    stuck = [[2, 4, 2, 4], [4, 2, 4, 2], [2, 4, 2, 4], [4, 2, 4, 2]]
    assert not g.can_move(stuck)
    assert g.can_move(g.new_board(random.Random(0)))
    assert g.total_board_value(g.new_board(random.Random(0))) in (4, 6, 8)


@pytest.mark.parametrize(
    ("reply", "move"),
    [
        ("<move>Left</move>", "left"),
        ("I go up. <move>down</move> then left", "down"),  # the tag wins
        ("Let's go up, then right.", "right"),  # else the last direction named
    ],
)
def test_a_move_is_the_tag_or_the_last_direction_named(reply: str, move: str) -> None:
    assert g.parse_move(reply) == move


def test_a_reply_naming_no_direction_is_no_move() -> None:
    with pytest.raises(ValueError, match="no move"):
        g.parse_move("upward and leftover")


def test_rewards_rank_wins_then_progress_then_format() -> None:
    start = [[2, 2], [0, 0]]
    assert g.board_reward(start, 16) == pytest.approx(0 + 0.2 * 1 / 5)  # max 2 -> 0; total 4 of 16 x 4
    assert g.board_reward([[16, 0], [0, 0]], 16) == 2.0
    assert g.board_reward([[8, 4], [0, 0]], 16) > g.board_reward([[4, 4], [0, 0]], 16)


@pytest.mark.slow
async def test_it_trains_two_steps_and_logs_its_games(
    held_backend: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--home", str(held_backend), "--steps", "2", "--group-size", "3", "--max-moves", "2"]
    sizes = ["--max-tokens", "8", "--winning-value", "64", "--learning-rate", "2e-4"]
    gathered = await g.train(g.parse_args([*argv, *sizes]))
    assert "tutorial-001 is at step 2" in capsys.readouterr().out
    records, checkpoints = stored_run(held_backend, run_id_of("2048", "tutorial-001"))
    assert checkpoints[-1] == 2  # delete_checkpoints kept the newest before each step
    for step, groups in enumerate(gathered):
        trajectories = [t for group in groups for t in group]
        assert len({t.reward for t in trajectories}) > 1  # a learning signal in every step's group
        trained = records[step + 1]  # model.train's numbers for the step it produced
        assert trained["train/reward"] == pytest.approx(statistics.fmean(t.reward for t in trajectories))
        assert trained["train/num_moves"] == pytest.approx(
            statistics.fmean(t.metrics["num_moves"] for t in trajectories)
        )
        assert trained["data/step_num_trajectories"] == 3
        assert trained["loss/train"] == trained["loss/train"]  # a number, not NaN
