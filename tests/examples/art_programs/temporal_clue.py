"""A program shaped as ART's ``examples/temporal_clue/temporal-clue.py``, written here in our own words: every
ART call it makes, made as it makes it, with puzzles the test writes (ART's puzzles.json is not in the
snapshot) and short answers so SmolLM2-135M trains two steps on a CPU.

``art.TrainableModel(..., _internal_config={"init_args": {"gpu_memory_utilization": 0.775}})`` (a plain dict,
accepted with one warning), ``with LocalBackend() as backend``, ``_experimental_pull_from_s3(model, s3_bucket=
os.environ["BACKUP_BUCKET"], verbose=True)`` before ``register``, ``get_step``, two ``gather_trajectory_groups``
at once (``pbar_desc="val"`` and ``"train"``), ``model.log(val_groups)``, ``model.delete_checkpoints()``,
``_experimental_push_to_s3(model, s3_bucket=..., verbose=True)``, ``backend.train(model, groups,
learning_rate=)``, ``model.log(groups, metrics=, step=, split="train")``; a rollout with ``art.Messages``, the
model's ``openai_client()``, and ``art.Trajectory(messages_and_choices=[*messages, choice], reward=, metrics=)``.
"""

from __future__ import annotations

import asyncio
import os
import re
from typing import Any

import dgrpo as art
from dgrpo.local import LocalBackend

BASE_MODEL = "smollm2-135m-instruct"
STEPS = 2
STRIDE = 1
"""Puzzles per training step."""


def puzzles() -> list[dict[str, Any]]:
    """Small clue puzzles: a prompt and the answers it asks for."""
    people = ["Mr. Green", "Mrs. Peacock", "Colonel Mustard", "Miss Scarlet"]
    return [
        {
            "prompt": f"Who had the candlestick at {hour}:00? Answer: (A) name, (B) room.",
            "solution": {"A": people[hour % 4], "B": "library"},
        }
        for hour in range(1, 6)
    ]


async def rollout(model: art.TrainableModel, puzzle: dict[str, Any], seed: int) -> art.Trajectory:
    messages: art.Messages = [{"role": "user", "content": puzzle["prompt"]}]
    client = model.openai_client()
    chat_completion = await client.chat.completions.create(
        messages=messages, model=model.get_inference_name(), max_tokens=10, seed=seed
    )
    choice = chat_completion.choices[0]
    content = choice.message.content or ""
    num_correct = sum(
        bool(re.search(rf"\({key}\)\s*{re.escape(value)}", content, re.IGNORECASE))
        for key, value in puzzle["solution"].items()
    )
    acc = num_correct / len(puzzle["solution"])
    shaped = len(set(content.lower().split())) / 100  # partial credit, so a group's rewards differ
    return art.Trajectory(messages_and_choices=[*messages, choice], reward=acc + shaped, metrics={"acc": acc})


async def train(home: str) -> tuple[art.TrainableModel, list[list[art.TrajectoryGroup]]]:
    """The program; returns the model and each step's training groups."""
    all_puzzles = puzzles()
    val_puzzles, train_puzzles = all_puzzles[:1], all_puzzles[1:]
    model = art.TrainableModel(
        name="001",
        project="art-temporal-clue",
        base_model=BASE_MODEL,
        _internal_config={"init_args": {"gpu_memory_utilization": 0.775}},
    )
    trained = []
    with LocalBackend(path=home) as backend:
        await backend._experimental_pull_from_s3(model, s3_bucket=os.environ["BACKUP_BUCKET"], verbose=True)
        await model.register(backend)
        for i in range(await model.get_step(), STEPS):
            val_groups, train_groups = await asyncio.gather(
                art.gather_trajectory_groups(
                    (
                        art.TrajectoryGroup(rollout(model, p, 1000 * i + k) for k in range(2))
                        for p in val_puzzles
                    ),
                    pbar_desc="val",
                ),
                art.gather_trajectory_groups(
                    (
                        art.TrajectoryGroup(rollout(model, p, 1000 * i + 10 + k) for k in range(3))
                        for p in train_puzzles[i * STRIDE : (i + 1) * STRIDE]
                    ),
                    pbar_desc="train",
                ),
            )
            await model.log(val_groups)
            await model.delete_checkpoints()
            await backend._experimental_push_to_s3(model, s3_bucket=os.environ["BACKUP_BUCKET"], verbose=True)
            result = await backend.train(model, train_groups, learning_rate=1e-4)
            await model.log(train_groups, metrics=result.metrics, step=result.step, split="train")
            trained.append(train_groups)
    return model, trained
