"""An ART program, written as ART's docs write one, run with ``import dgrpo as art`` on the real stack.

Multi-turn rollouts append each ``completion.choices[0]`` (an openai ``Choice``) and send
``traj.messages()`` back; a non-trainable ``art.Model`` baseline is logged as ``val``; step 1 trains with
ART 0.5's ``backend.train`` + ``model.log(metrics=...)``, step 2 with ``model.train``; before step 1,
batches with nothing to learn from (equal rewards, none, all failed) are skipped as ART >= 0.4.4 skips them:
nothing trained, the step still advances. The numbers are read back from the run's metrics Parquet, not just found to exist.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import openai
import pytest

import dgrpo as art
from activities.retention import metrics_by_step
from dgrpo.local import LocalBackend
from dgrpo.utils import iterate_dataset
from examples.arithmetic import EXAMPLE_TURN, scenarios, score_answer

pytestmark = pytest.mark.slow


# ---- the program (as an ART user writes it) ---------------------------------------------------------
@art.retry(exceptions=(openai.APIConnectionError,))
async def rollout(model: art.Model, scenario: dict[str, Any], seed: int) -> art.Trajectory:
    traj = art.Trajectory(
        messages_and_choices=[{"role": "system", "content": "Answer with the number only."}, *EXAMPLE_TURN],
        reward=0,
    )
    scores = []
    for turn, (a, b) in enumerate(((scenario["a"], scenario["b"]), (scenario["b"], 1))):
        traj.messages_and_choices.append({"role": "user", "content": f"What is {a} + {b}?"})
        completion = await model.openai_client().chat.completions.create(
            model=model.get_inference_name(),
            messages=traj.messages(),
            max_tokens=8,
            temperature=1.0,
            seed=seed * 2 + turn,
        )
        choice = completion.choices[0]
        traj.messages_and_choices.append(choice)
        scores.append(score_answer(choice.message.content or "", a + b).reward)
    traj.reward = sum(scores) / len(scores)
    traj.metrics["turns"] = len(scores)
    return traj.finish()


async def program(home: Path) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    with LocalBackend(path=home) as backend:
        model = art.TrainableModel(name="agent", project="art-compat", base_model="smollm2-135m-instruct")
        await model.register(backend)

        baseline = art.Model(
            name="base",
            project="art-compat",
            inference_base_url=model.inference_base_url,
            inference_model_name=model.get_inference_name(),  # step 0 is the base model itself
        )
        await baseline.register(backend)
        val = await art.gather_trajectory_groups(
            [art.TrajectoryGroup(rollout(baseline, s, seed) for seed in range(2)) for s in scenarios()[:1]],
            pbar_desc="val",
        )
        await baseline.log(val, split="val")
        seen["val_rewards"] = [t.reward for g in val for t in g]

        for batch in iterate_dataset(scenarios(), groups_per_step=2, initial_step=await model.get_step()):
            if batch.step >= 2:
                break
            groups = await art.gather_trajectory_groups(
                (
                    art.TrajectoryGroup(rollout(model, s, 100 * batch.step + seed) for seed in range(3))
                    for s in batch.items
                ),
                pbar_desc="gather",
                max_exceptions=0.5,
            )
            seen.setdefault("groups", []).append(groups)
            if batch.step == 0:
                # Batches with nothing to learn from are skipped, as in ART >= 0.4.4: steps 1-3 train nothing.
                flat = [
                    art.TrajectoryGroup([t.model_copy(update={"reward": 1.0}) for t in g]) for g in groups
                ]
                seen["skipped"] = await backend.train(model, flat, learning_rate=2e-4)
                seen["skipped_empty"] = await model.train([])
                seen["skipped_failed"] = await model.train(
                    [art.TrajectoryGroup([ValueError("rollout raised")])]
                )
                seen["step_after_skips"] = await model.get_step()
                seen["records_after_skips"] = metrics_by_step(backend.object_store(), model.run_id)
                result = await backend.train(model, groups, learning_rate=2e-4)
                await model.log(groups, metrics=result.metrics, step=result.step, split="train")
                seen["result"] = result
            else:
                await model.train(groups, config=art.TrainConfig(learning_rate=2e-4))
        seen["step"] = await model.get_step()
        seen["served"] = model.get_inference_name()
        seen["records"] = metrics_by_step(backend.object_store(), model.run_id)
        seen["baseline_records"] = metrics_by_step(backend.object_store(), baseline.run_id)
    return seen


# ---- the test ---------------------------------------------------------------------------------------
async def test_an_art_program_trains_two_steps_and_logs(held_backend: Path) -> None:
    seen = await program(held_backend)  # its LocalBackend reuses the session's workers

    first = seen["groups"][0]
    for traj in (t for g in first for t in g):
        assert [c.token_ids is not None for c in traj.choices()] == [True, True]
        roles = [m["role"] for m in traj.messages()]
        assert roles == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]

    skipped = seen["skipped"]
    assert skipped.step == 1 and skipped.checkpoint_path.endswith("/checkpoints/000001/")
    assert skipped.metrics["discarded/step/zero_variance_groups"] == 2
    assert skipped.metrics["data/step_skipped"] == 1.0 and "loss/train" not in skipped.metrics
    empty, failed = seen["skipped_empty"], seen["skipped_failed"]
    assert (empty.step, empty.trained, failed.step, failed.trained, seen["step_after_skips"]) == (
        2, False, 3, False, 3
    )  # fmt: skip
    # Each skipped batch's numbers are its own step's row (step 3: every rollout failed).
    records = seen["records_after_skips"]
    assert records[3]["train/exception_rate"] == 1.0 and records[3]["data/step_skipped"] == 1.0
    assert [records[s]["data/step_num_groups_trainable"] for s in (1, 2, 3)] == [0, 0, 0]

    result = seen["result"]
    assert result.step == 4 and result.checkpoint_path.endswith("/checkpoints/000004/")
    assert result.metrics["loss/train"] == result.metrics["loss/train"]  # a number, not NaN
    assert result.metrics["data/step_skipped"] == 0.0
    assert (seen["step"], seen["served"]) == (
        5,
        "art--compat-agent@5",
    )  # a project's "-" is doubled in run ids

    step1 = seen["records"][4]
    rewards = [t.reward for g in first for t in g]
    assert step1["train/reward"] == pytest.approx(statistics.fmean(rewards))
    assert step1["loss/train"] == pytest.approx(result.metrics["loss/train"])
    assert step1["train/reward_std_dev"] == pytest.approx(
        statistics.fmean(statistics.pstdev([t.reward for t in g]) for g in first)
    )
    assert step1["data/step_num_trajectories"] == result.metrics["data/step_num_trajectories"] > 0
    assert step1["train/turns"] == 2
    assert "train/reward" in seen["records"][5]
    assert seen["baseline_records"][0]["val/reward"] == pytest.approx(statistics.fmean(seen["val_rewards"]))
