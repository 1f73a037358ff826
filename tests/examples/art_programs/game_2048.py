"""A program shaped as ART's ``examples/2048`` (train.py + rollout.py) and mcp-rl's model set-up, written here
in our own words: every ART call they make, made as they make it, with a tiny game so SmolLM2-135M trains two
steps on a CPU.

- mcp-rl: a dict of ``art.TrainableModel[Config]``, each made by ``model_copy(deep=True)`` of one model and
  then renamed (``name``, ``project``) and reconfigured (``config.<field> = ...``) before ``register``;
- 2048: ``model._internal_config = art.dev.InternalModelConfig(init_args=...)`` after construction,
  ``register``, ``_experimental_pull_from_s3(model, verbose=True)``, ``get_step``, ``gather_trajectory_groups``
  with ``after_each=ruler_score_group(group, "openai/o4-mini", debug=True, swallow_exceptions=True)`` (the
  judge reached through ``OPENAI_BASE_URL``/``OPENAI_API_KEY``), ``_experimental_push_to_s3(model)``,
  ``backend.train(model, groups, learning_rate=...)``, ``model.log(groups, metrics=, step=, split="train")``;
  a rollout with ``@art.retry``, ``art.Trajectory(messages_and_choices=[system], metadata=, reward=0)``,
  ``messages_and_choices.append``, ``trajectory.messages()``, ``trajectory.metrics[...]`` and the model's own
  ``openai_client()`` asked for ``model.get_inference_name()`` with ``max_completion_tokens``.
"""

from __future__ import annotations

import random

import openai
from pydantic import BaseModel

import dgrpo as art
from dgrpo.local import LocalBackend
from dgrpo.rewards import ruler_score_group

BASE_MODEL = "smollm2-135m-instruct"
JUDGE = "openai/o4-mini"
STEPS = 2
ROLLOUTS = 3


class GameConfig(BaseModel):
    """The program's own settings, as mcp-rl's ``McpPolicyConfig``: kept on ``model.config``."""

    max_moves: int = 3
    board_size: int = 4


def board_text(rng: random.Random, size: int) -> str:
    cells = [rng.choice(["_", "2", "2", "4"]) for _ in range(size * size)]
    return "\n".join("|".join(cells[r * size : (r + 1) * size]) for r in range(size))


@art.retry(exceptions=(openai.LengthFinishReasonError,))
async def rollout(model: art.TrainableModel[GameConfig], step: int, game: int) -> art.Trajectory:
    assert model.config is not None
    rng = random.Random(step * 100 + game)
    trajectory = art.Trajectory(
        messages_and_choices=[
            {
                "role": "system",
                "content": "You play 2048. Answer with one move: <move>left</move>, right, up or down.",
            }
        ],
        metadata={"game_id": f"{step}-{game}", "step": step, "validation": False},
        reward=0,
    )
    for move in range(model.config.max_moves):
        trajectory.messages_and_choices.append(
            {"role": "user", "content": board_text(rng, model.config.board_size)}
        )
        client = model.openai_client()
        completion = await client.chat.completions.create(
            max_completion_tokens=8,
            messages=trajectory.messages(),
            model=model.get_inference_name(),
            seed=step * 1000 + game * 10 + move,
        )
        choice = completion.choices[0]
        trajectory.messages_and_choices.append(choice)
        if "<move>" in (choice.message.content or ""):
            break
    trajectory.metrics["num_moves"] = move + 1
    trajectory.metrics["replied_chars"] = sum(len(c.message["content"] or "") for c in trajectory.choices())
    return trajectory


def model_set() -> dict[str, art.TrainableModel[GameConfig]]:
    """mcp-rl's ``all_experiments.py`` pattern: one model, and copies of it renamed and reconfigured."""
    models: dict[str, art.TrainableModel[GameConfig]] = {
        "2048-001": art.TrainableModel(
            name="2048-001", project="art-2048", base_model=BASE_MODEL, config=GameConfig()
        )
    }
    models["2048-002"] = models["2048-001"].model_copy(deep=True)
    models["2048-002"].name = "2048-002"
    models["2048-002"].project = "art-2048-copies"
    assert models["2048-002"].config is not None
    models["2048-002"].config.max_moves = 1
    return models


async def train(
    home: str, name: str = "2048-002"
) -> tuple[art.TrainableModel[GameConfig], list[list[art.TrajectoryGroup]]]:
    """The program: trains ``name`` of ``model_set()`` STEPS steps; returns the model and each step's groups."""
    model = model_set()[name]
    model._internal_config = art.dev.InternalModelConfig(init_args=art.dev.InitArgs(max_seq_length=1024))
    backend = LocalBackend(path=home)
    await model.register(backend)
    await backend._experimental_pull_from_s3(model, verbose=True)
    trained: list[list[art.TrajectoryGroup]] = []
    for i in range(await model.get_step(), STEPS):
        train_groups = await art.gather_trajectory_groups(
            (art.TrajectoryGroup(rollout(model, i, game) for game in range(ROLLOUTS)) for _ in range(1)),
            after_each=lambda group: ruler_score_group(group, JUDGE, debug=True, swallow_exceptions=True),
            pbar_desc="gather",
            max_exceptions=10,
        )
        await backend._experimental_push_to_s3(model)
        result = await backend.train(model, train_groups, learning_rate=1e-4)
        await model.log(train_groups, metrics=result.metrics, step=result.step, split="train")
        trained.append(train_groups)
    await backend._experimental_push_to_s3(model)  # the last step's checkpoint too
    return model, trained
