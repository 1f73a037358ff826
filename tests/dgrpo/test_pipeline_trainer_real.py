"""ART's ``PipelineTrainer`` on the real stack and SmolLM2-135M: two pipelined durable steps of the
arithmetic task, with ``eval_fn`` run here and logged as ``val`` next to the run's ``train`` numbers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import dgrpo as art
from activities.retention import metrics_by_step
from dgrpo.local import LocalBackend
from dgrpo.pipeline_trainer import PipelineTrainer, make_group_rollout_fn
from examples.arithmetic import rollout, scenarios

pytestmark = pytest.mark.slow


async def evaluate(model: art.TrainableModel, step: int, config: Any) -> list[art.TrajectoryGroup]:
    group = art.TrajectoryGroup(rollout(model, scenarios()[40]) for _ in range(2))
    return await art.gather_trajectory_groups([group], pbar_desc=f"eval {step}")


async def test_pipeline_trainer_trains_two_pipelined_steps_and_evaluates(held_backend: Path) -> None:
    with LocalBackend(path=held_backend) as backend:  # the session's, reused
        model = art.TrainableModel(name="pipe", project="art-pipeline", base_model="smollm2-135m-instruct")
        await model.register(backend)
        trainer = PipelineTrainer(
            model,
            backend,
            make_group_rollout_fn(rollout, n=3),
            scenarios()[:4],
            None,
            eval_fn=evaluate,
            min_batch_size=2,
            learning_rate=2e-4,
        )
        status = await trainer.train()
        step = await model.get_step()
        records = metrics_by_step(backend.object_store(), model.run_id)
    assert (status.mode, status.step, status.phase, step) == ("pipelined", 2, "done", 2)
    assert [h.step for h in status.history] == [1, 2]
    for s in (1, 2):  # TrainingRun's numbers under ART's names
        assert records[s]["data/step_num_trajectories"] == 6
        assert 0.0 <= records[s]["train/reward"] <= 1.0
    # eval_fn ran at the start and at the end (ART's eval_at_start, and the final step)
    assert records[0]["val/data/step_num_trajectories"] == 2 and "val/reward" in records[0]
    assert records[2]["val/data/step_num_trajectories"] == 2 and "val/reward" in records[2]


async def test_a_closure_rollout_trains_in_this_process_through_backend_train(
    held_backend: Path, tmp_path: Path
) -> None:
    seen: list[int] = []

    async def grouped(
        model: art.TrainableModel, scenario: dict[str, Any], config: Any
    ) -> art.TrajectoryGroup:
        seen.append(scenario["answer"])  # a closure: the workers could not import it
        return await art.TrajectoryGroup(rollout(model, scenario) for _ in range(3))

    with LocalBackend(path=held_backend) as backend:  # the session's, reused
        model = art.TrainableModel(
            name="here",
            project="art-pipeline",
            base_model="smollm2-135m-instruct",
            base_path=str(tmp_path),
        )
        await model.register(backend)
        trainer = PipelineTrainer(
            model, backend, grouped, scenarios()[:4], None, min_batch_size=2, max_batch_size=2,
            learning_rate=2e-4, eval_fn=None,
        )  # fmt: skip
        assert not trainer.durable
        await trainer.train()
        step = await model.get_step()
    rows = [
        json.loads(line)
        for line in (tmp_path / "art-pipeline/models/here/history.jsonl").read_text().splitlines()
    ]
    trained = [r["step"] for r in rows if "train/reward" in r]
    assert len(seen) == 4 and 1 <= step <= 2 and trained == list(range(1, step + 1))
