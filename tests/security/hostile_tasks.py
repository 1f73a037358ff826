"""Task code for the bad-input table: the one module the table's inference worker may import task code from.

Scenarios carry the reward a rollout returns, so one rollout function covers every bad reward. The other
names are what a hostile run spec might point at inside an allowed module: things it merely imported
(``getcwd``, ``imported_sleep``) and callables that are not plain functions (``Scenarios``).
"""

from __future__ import annotations

from asyncio import sleep as imported_sleep  # noqa: F401  (a coroutine function defined elsewhere)
from os import getcwd  # noqa: F401  (a function defined elsewhere)
from typing import Any

from schemas.trajectory import Choice, ChoiceLogprobs, TokenLogprob, Trajectory


def scenarios() -> list[dict[str, Any]]:
    return [{"id": f"s{i}", "reward": float(i)} for i in range(3)]


def nan_scenarios() -> list[dict[str, Any]]:
    return [{"id": "fine", "reward": 0.5}, {"id": "broken", "reward": "nan"}]


def inf_scenarios() -> list[dict[str, Any]]:
    return [{"id": "broken", "reward": "inf"}]


def negative_inf_scenarios() -> list[dict[str, Any]]:
    return [{"id": "broken", "reward": "-inf"}]


def huge_scenarios() -> list[dict[str, Any]]:
    return [{"id": "broken", "reward": 1e200}]


def just_too_big_scenarios() -> list[dict[str, Any]]:
    return [{"id": "broken", "reward": 1_000_001.0}]


def placeholder_logprob_scenarios() -> list[dict[str, Any]]:
    return [{"id": "fine", "reward": 0.5}, {"id": "broken", "reward": 1.0, "logprob": -9999.0}]


def raising_scenarios() -> list[dict[str, Any]]:
    raise RuntimeError("the scenario source is down")


def not_dict_scenarios() -> list[Any]:
    return ["a string, not a scenario"]


class Scenarios:
    """A class is callable, but calling it runs its constructor: not a plain function."""

    def __init__(self) -> None:
        self.items = scenarios()


async def rollout(model: Any, scenario: dict[str, Any]) -> Trajectory:
    """Returns the scenario's ``reward`` (a number or the string of one, such as ``"nan"``); with a
    ``logprob``, its answer is a choice the rollout built itself, sampled (it says) at that logprob."""
    answer: Any = {"role": "assistant", "content": "done"}
    if "logprob" in scenario:
        answer = Choice(
            message=answer,
            token_ids=[100],
            prompt_token_ids=[1, 2],
            logprobs=ChoiceLogprobs(content=[TokenLogprob(token="done", logprob=float(scenario["logprob"]))]),
        )
    return Trajectory(
        messages_and_choices=[{"role": "user", "content": f"scenario {scenario['id']}"}, answer],
        reward=float(scenario["reward"]),
    )
