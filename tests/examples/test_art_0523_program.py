"""A program written as ART 0.5.23 programs are: the rollout calls the policy through ``model.openai_client()``
and sets ``art.current_trajectory(require=True).reward``; ``art.trajectory(...)`` captures its calls, groups
come from ``art.trajectory_group(...)`` under ``art.gather_trajectory_groups``, each step is
``backend.train(model, groups, ...)`` then ``model.log(groups, metrics=result.metrics, step=result.step)``.
Two real steps of SmolLM2-135M on the examples' shared LocalBackend, read back from the run's metrics Parquet
and the model's history.jsonl (0.5.23's rows: the model names its run). The CI runs it on Python 3.11 and,
client only, on 3.12 (marker ``art_compat``: .ci/run, docs/art-0523.md)."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Awaitable
from pathlib import Path

import pytest

import dgrpo as art
from examples.shaping import closeness
from schemas import layout
from tests.examples.stored_run import stored_run

WORDS = ["apple", "river", "stone", "cloud"]
"""Each scenario asks for one word back; the reward is how close the reply came to it."""


async def rollout(model: art.TrainableModel, word: str) -> None:
    client = model.openai_client()
    reply = await client.chat.completions.create(
        model=model.name,
        messages=[{"role": "user", "content": f"Reply with the single word '{word}' and nothing else."}],
        max_tokens=6,
        temperature=1.0,
    )
    trajectory = art.current_trajectory(require=True)
    trajectory.reward = closeness(reply.choices[0].message.content or "", [word])
    trajectory.metadata["word"] = word


def group(model: art.TrainableModel, word: str, size: int) -> Awaitable[art.TrajectoryGroup]:
    return art.trajectory_group(art.trajectory(rollout(model, word)) for _ in range(size))


async def train(home: Path, steps: int) -> tuple[art.TrainableModel, list[list[art.TrajectoryGroup]]]:
    backend = art.LocalBackend(path=str(home))
    model = art.TrainableModel(
        name="word",
        run_name="word-0523",
        project="art-0523",
        base_model="smollm2-135m-instruct",
        base_path=str(home / "art"),
    )
    await model.register(backend)
    trained = []
    for step in range(steps):
        groups = await art.gather_trajectory_groups(
            [group(model, word, 3) for word in WORDS[2 * step : 2 * step + 2]], pbar_desc=None
        )
        result = await backend.train(model, groups, learning_rate=2e-4)
        await model.log(groups, metrics=result.metrics, step=result.step, split="train")
        trained.append(groups)
    return model, trained


@pytest.mark.slow
@pytest.mark.art_compat
async def test_a_0523_program_with_captured_rollouts_trains_two_steps(held_backend: Path) -> None:
    started = time.monotonic()
    model, trained = await train(held_backend, steps=2)
    print(f"the 0.5.23 program trained 2 steps in {time.monotonic() - started:.0f} s")
    assert await model.get_step() == 2
    records, checkpoints = stored_run(held_backend, model.run_id)
    assert checkpoints[-1] == 2
    for step, groups in enumerate(trained, start=1):
        trajectories = [t for g in groups for t in g]
        # what was trained came from the captured exchanges: one policy call each, its token ids kept
        assert all(
            len(t.exchanges.chat_completions) == 1 and not t.messages_and_choices for t in trajectories
        )
        assert all((t.exchanges.chat_completions[0].response.choices[0].model_extra or {}).get("token_ids")
                   for t in trajectories)  # fmt: skip
        assert records[step]["train/reward"] == pytest.approx(
            statistics.fmean(t.reward for t in trajectories)
        )
        assert records[step]["data/step_num_trajectories"] == 6
    # run_name given: model.log wrote ART 0.5.23's history rows, under the run's name
    history = model_history(model)
    assert [row["step"] for row in history if "train/reward" in row] == [1, 2]
    assert all("time/wall_clock_sec" not in row for row in history)
    assert all(row["throughput/avg_trainer_tok_per_s"] > 0 for row in history)  # type: ignore[operator]


def model_history(model: art.TrainableModel) -> list[dict[str, object]]:
    path = layout.art_model_dir(model.base_path, model.project, "word-0523") / layout.ART_HISTORY_FILE
    return [json.loads(line) for line in path.read_text().splitlines()]
