"""The example tasks' scenarios, reward functions and tool environment (the model path is in
tests/activities/test_rollouts.py, against the real server)."""

from __future__ import annotations

import json

import pytest

from examples import arithmetic, tool_agent
from schemas.config import RunSpec, load_run_spec


def test_arithmetic_scenarios_are_fixed_dicts() -> None:
    items = arithmetic.scenarios()
    assert len(items) == 81 and items == arithmetic.scenarios()
    assert items[0] == {"id": "add-1-1", "a": 1, "b": 1, "answer": 2}
    assert len({s["id"] for s in items}) == 81


@pytest.mark.parametrize(
    ("reply", "reward", "bare", "exact"),
    [
        ("7", 1.0, True, True),
        (" 7.\n", 1.0, True, True),
        ("8", 0.65, True, False),
        ("9", 0.475, True, False),
        ("11", 0.3, True, False),
        ("The answer is 7", 0.7, False, True),
        ("3 + 4 = 7", 0.0, False, False),  # the first number counts: answer first
        ("seven", 0.0, False, False),
        ("", 0.0, False, False),
    ],
)
def test_arithmetic_reward_has_partial_credit(reply: str, reward: float, bare: bool, exact: bool) -> None:
    score = arithmetic.score_answer(reply, 7)
    assert (score.bare_number, score.exact) == (bare, exact)
    assert score.reward == pytest.approx(reward)


def test_tool_catalog_executes_lookups_and_reports_errors_to_the_model() -> None:
    env = tool_agent.PriceCatalog()
    assert env.execute("lookup_price", json.dumps({"item": "Anvil "})) == {"item": "anvil", "price": 42}
    assert "unknown tool" in env.execute("buy", "{}")["error"]
    assert "not valid JSON" in env.execute("lookup_price", "{item: anvil")["error"]
    assert "no item 'unicorn'" in env.execute("lookup_price", json.dumps({"item": "unicorn"}))["error"]
    assert "no item ''" in env.execute("lookup_price", "[]")["error"]


def test_tool_scenarios_exclude_the_worked_example() -> None:
    items = tool_agent.scenarios()
    assert len(items) == len(tool_agent.CATALOG) - 1
    assert all(
        s["item"] != tool_agent.EXAMPLE_ITEM and s["price"] == tool_agent.CATALOG[s["item"]] for s in items
    )


@pytest.mark.parametrize(
    ("episode", "reward"),
    [
        (tool_agent.Episode(), 0.0),
        (tool_agent.Episode(structured=True), 0.05),
        (tool_agent.Episode(attempted_call=True), 0.2),
        (tool_agent.Episode(attempted_call=True, well_formed_calls=1), 0.4),
        (tool_agent.Episode(attempted_call=True, well_formed_calls=1, catalog_calls=1), 0.6),
        (
            tool_agent.Episode(
                attempted_call=True, well_formed_calls=1, catalog_calls=1, final_answer="$42."
            ),
            1.0,
        ),
        (tool_agent.Episode(final_answer="It costs 42 dollars"), 0.4),
        (tool_agent.Episode(final_answer="It costs 420 dollars"), 0.0),
    ],
)
def test_tool_reward_has_partial_credit(episode: tool_agent.Episode, reward: float) -> None:
    assert tool_agent.score_episode(episode, 42) == pytest.approx(reward)


@pytest.mark.parametrize("path", ["examples/run.json", "examples/run.toml", "examples/tool_agent.toml"])
def test_example_run_specs_load(path: str) -> None:
    spec = load_run_spec(path)
    assert isinstance(spec, RunSpec)
    module = tool_agent if "tool_agent" in path else arithmetic
    assert spec.task.rollout == f"{module.__name__}:rollout"
    assert spec.task.scenarios == f"{module.__name__}:scenarios"


def test_run_json_is_the_contract_example() -> None:
    with open("examples/run.json") as f:
        data = json.load(f)
    assert data == {
        "run_id": "demo-1",
        "model": {"name": "agent-001", "project": "demo", "base_model": "smollm2-135m-instruct"},
        "task": {"rollout": "examples.arithmetic:rollout", "scenarios": "examples.arithmetic:scenarios"},
        "steps": 3,
        "groups_per_step": 2,
        "group_size": 4,
        "train": {"learning_rate": 1e-5},
        "mode": "sync",
    }
