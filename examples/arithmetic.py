"""The demo task: single-digit addition, answered with a bare number, for SmolLM2-135M-Instruct.

One worked example turn (``What is 2 + 3?`` -> ``5``) shows the format. The reward gives partial
credit so a 135M model's rollouts differ within every group from step 0:

- 0.3 when the reply is a bare integer (the format), and
- 0.7 x closeness of the reply's first integer to the answer: 1 when exact, halved per unit off,
  0 beyond 3 off.

Measured on the base model through our CPU server (``dgrpo serve``, temperature 1.0, 16 tokens,
8 scenarios x 8): mean reward 0.27 (std 0.27), 53% bare numbers, 6% exact, 80% stop before the token
limit, every group with reward variance (HF ``generate``, 8 x 8: mean 0.33, 61% bare, 9% exact).

Run spec: ``task.rollout = "examples.arithmetic:rollout"``, ``task.scenarios = "examples.arithmetic:scenarios"``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol

from openai import AsyncOpenAI

from schemas.trajectory import Choice, Trajectory

MAX_TOKENS = 16
FORMAT_WEIGHT = 0.3
CORRECT_WEIGHT = 0.7
MAX_DISTANCE = 3
EXAMPLE_TURN: list[dict[str, Any]] = [
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "5"},
]

_BARE_INT = re.compile(r"-?\d+\.?")
_INT = re.compile(r"-?\d+")


class RolloutModel(Protocol):
    """What a rollout needs of ``model`` (``activities.rollout_model.RolloutModel``, ``dgrpo.TrainableModel``)."""

    @property
    def name(self) -> str: ...

    def openai_client(self) -> AsyncOpenAI: ...


def scenarios() -> list[dict[str, Any]]:
    """Every ``a + b`` with a, b in 1..9 (81 scenarios), in a fixed order."""
    return [
        {"id": f"add-{a}-{b}", "a": a, "b": b, "answer": a + b} for a in range(1, 10) for b in range(1, 10)
    ]


@dataclass(frozen=True)
class Score:
    reward: float
    bare_number: bool
    exact: bool
    distance: int | None
    """|first integer - answer|, None when the reply has no integer."""


def score_answer(reply: str, answer: int) -> Score:
    """The reward of ``reply`` for a question whose answer is ``answer`` (see the module doc)."""
    text = reply.strip()
    bare = _BARE_INT.fullmatch(text) is not None
    numbers = _INT.findall(text)
    distance = abs(int(numbers[0]) - answer) if numbers else None
    closeness = 0.5**distance if distance is not None and distance <= MAX_DISTANCE else 0.0
    reward = FORMAT_WEIGHT * bare + CORRECT_WEIGHT * closeness
    return Score(reward=round(reward, 6), bare_number=bare, exact=distance == 0, distance=distance)


def prompt(scenario: dict[str, Any]) -> list[dict[str, Any]]:
    return [*EXAMPLE_TURN, {"role": "user", "content": f"What is {scenario['a']} + {scenario['b']}?"}]


async def rollout(model: RolloutModel, scenario: dict[str, Any]) -> Trajectory:
    """One question, one sampled answer, scored by ``score_answer``."""
    trajectory = Trajectory(
        messages_and_choices=prompt(scenario),
        metadata={"scenario_id": str(scenario.get("id", "")), "answer": int(scenario["answer"])},
    )
    completion = await model.openai_client().chat.completions.create(
        model=model.name,
        messages=trajectory.messages(),  # type: ignore[arg-type]
        max_tokens=MAX_TOKENS,
        temperature=1.0,
    )
    choice = completion.choices[0]
    trajectory.messages_and_choices.append(Choice.model_validate(choice))  # keeps token ids and logprobs
    score = score_answer(choice.message.content or "", int(scenario["answer"]))
    trajectory.reward = score.reward
    trajectory.metrics = {
        "bare_number": score.bare_number,
        "exact": score.exact,
        "finished": choice.finish_reason == "stop",
    }
    return trajectory
