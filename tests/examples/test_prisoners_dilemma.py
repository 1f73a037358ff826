"""examples/prisoners_dilemma.py (ART's example, ported): its payoff rules, and two real training steps of
SmolLM2-135M served by vLLM (its CPU build) and trained on the CPU, with its three ``model.log`` splits read
back from the run's metrics."""

from __future__ import annotations

from pathlib import Path

import pytest

from dgrpo.model import run_id_of
from examples import prisoners_dilemma as pd
from tests.examples.stored_run import stored_run


@pytest.mark.parametrize(
    ("content", "move"),
    [
        ("I will cooperate.", "cooperate"),
        ("Cooperate at first, then DEFECT", "defect"),
        ("I'd rather not say", "none"),
        (None, "none"),
    ],
)
def test_a_move_is_the_answers_last_action_word(content: str | None, move: str) -> None:
    assert pd.action(content) == move


def test_payoffs_as_in_art() -> None:
    assert pd.payoffs("cooperate", "cooperate") == (3, 3)
    assert pd.payoffs("cooperate", "defect") == (0, 5)
    assert pd.payoffs("defect", "defect") == (1, 1)
    assert pd.payoffs("none", "defect") == (0, 5)  # ART's defaults when a player gave no move
    assert pd.payoffs("cooperate", "none") == (3, 0)


@pytest.mark.extended  # beyond CI's 30 minutes (issue 23): run with `pytest -m extended`
async def test_it_trains_two_steps_on_vllm_with_only_the_engine_variable_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The ported program unchanged, on its own ``LocalBackend`` whose workers serve with vLLM (CPU build)
    because ``DGRPO_ENGINE=vllm``: two steps trained, its three ``model.log`` splits read back from the run's
    metrics, both checkpoints stored, and vLLM served the games."""
    monkeypatch.setenv("DGRPO_ENGINE", "vllm")
    home = tmp_path / "home"
    argv = ["--home", str(home), "--steps", "2", "--rounds", "1", "--games", "2", "--max-tokens", "8"]
    assert await pd.main(pd.parse_args([*argv, "--learning-rate", "2e-4"])) == 0
    assert "001 is at step 2" in capsys.readouterr().out
    records, checkpoints = stored_run(home, run_id_of("prisoners-dilemma", "001"))
    assert checkpoints == [1, 2]
    for step in (0, 1):  # model.log at the step the games were played with
        assert records[step]["versus-self/data/step_num_trajectories"] == 4  # 2 games, 2 players
        assert records[step]["versus-base/data/step_num_trajectories"] == 2
        assert 0 <= records[step]["base-model/reward"] <= 5 * 1
    for step in (1, 2):  # model.train's numbers for the step it produced
        assert records[step]["data/step_num_trajectories"] == 6
        assert "loss/train" in records[step]
    (served,) = (home / "logs").glob("serve-*.log")  # the one inference server the workers started
    log = served.read_text(errors="replace")
    assert "(APIServer pid=" in log and "POST /v1/chat/completions" in log, log[-3000:]  # vLLM's, answering


def test_an_answer_naming_no_move_earns_a_little_by_how_close_it_came() -> None:
    assert pd.format_credit("I cooperate") == 0.0  # a move: its payoff is the reward
    near, far = pd.format_credit("co-operation"), pd.format_credit("Hello there!")
    assert 0.0 < far < near <= 0.5
