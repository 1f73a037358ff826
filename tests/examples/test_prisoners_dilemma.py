"""examples/prisoners_dilemma.py (ART's example, ported): its payoff rules, and two real training steps of
SmolLM2-135M trained on the CPU, with its three ``model.log`` splits read back from the run's metrics: served
by our CPU engine in every test run, and by vLLM (its CPU build) in the ``extended`` tests."""

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


ARGS = ["--steps", "2", "--rounds", "1", "--games", "2", "--max-tokens", "8", "--learning-rate", "2e-4"]


def assert_trained_two_steps(home: Path, name: str) -> None:
    """Two steps trained, the program's three ``model.log`` splits at the step its games were played with,
    ``model.train``'s numbers at the step it produced, both checkpoints stored."""
    records, checkpoints = stored_run(home, run_id_of("prisoners-dilemma", name))
    assert checkpoints == [1, 2]
    for step in (0, 1):
        assert records[step]["versus-self/data/step_num_trajectories"] == 4  # 2 games, 2 players
        assert records[step]["versus-base/data/step_num_trajectories"] == 2
        assert 0 <= records[step]["base-model/reward"] <= 5 * 1
    for step in (1, 2):
        assert records[step]["data/step_num_trajectories"] == 6
        assert "loss/train" in records[step]


@pytest.mark.slow
async def test_it_trains_two_steps_on_the_examples_backend(
    held_backend: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The ported program unchanged on the examples' ``LocalBackend`` (our CPU engine)."""
    assert await pd.main(pd.parse_args(["--home", str(held_backend), "--name", "cpu", *ARGS])) == 0
    assert "cpu is at step 2" in capsys.readouterr().out
    assert_trained_two_steps(held_backend, "cpu")


@pytest.mark.extended  # beyond CI's 30 minutes (issue 23): run with `pytest -m extended`
async def test_it_trains_two_steps_on_vllm_with_only_the_engine_variable_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The ported program unchanged, on its own ``LocalBackend`` whose workers serve with vLLM (CPU build)
    because ``DGRPO_ENGINE=vllm``, and vLLM served the games."""
    monkeypatch.setenv("DGRPO_ENGINE", "vllm")
    home = tmp_path / "home"
    assert await pd.main(pd.parse_args(["--home", str(home), *ARGS])) == 0
    assert "001 is at step 2" in capsys.readouterr().out
    assert_trained_two_steps(home, "001")
    (served,) = (home / "logs").glob("serve-*.log")  # the one inference server the workers started
    log = served.read_text(errors="replace")
    assert "(APIServer pid=" in log and "POST /v1/chat/completions" in log, log[-3000:]  # vLLM's, answering


def test_an_answer_naming_no_move_earns_a_little_by_how_close_it_came() -> None:
    assert pd.format_credit("I cooperate") == 0.0  # a move: its payoff is the reward
    near, far = pd.format_credit("co-operation"), pd.format_credit("Hello there!")
    assert 0.0 < far < near <= 0.5
