"""``PipelineTrainer`` run in this process (a rollout the workers cannot import): rollouts here, batches
trained through ``backend.train``, logged with ``model.log`` to the model's real local files.

``StepBackend`` stands in at the ``backend.train`` seam, which ``LocalBackend`` fills in
tests/dgrpo/test_pipeline_trainer_real.py (a closure rollout on the real stack)."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import dgrpo as art
from dgrpo.costs import track_api_cost
from dgrpo.metrics import MetricsBuilder
from dgrpo.pipeline_trainer import PipelineTrainer, keep_recent_and_top, make_group_rollout_fn
from dgrpo.types import LocalTrainResult
from examples.arithmetic import rollout, scenarios
from schemas.config import TaskQueues


class StepBackend:
    """``backend.train``: records each batch and its keywords, and returns the next step."""

    def __init__(self, seconds: float = 0.0) -> None:
        self.batches: list[list[art.TrajectoryGroup]] = []
        self.options: list[dict[str, Any]] = []
        self.seconds = seconds
        self.on_train: Any = None
        self.task_queues = TaskQueues()

    async def train(self, model: Any, groups: Any, **options: Any) -> LocalTrainResult:
        self.batches.append(list(groups))
        self.options.append(options)
        await asyncio.sleep(self.seconds)
        if self.on_train is not None:
            self.on_train()
        return LocalTrainResult(step=len(self.batches), metrics={"loss/train": 0.25})


def model(tmp_path: Path) -> art.TrainableModel:
    return art.TrainableModel(name="loop", project="here", base_model="m", base_path=str(tmp_path))


def group(rewards: list[float], version: int | None = None) -> art.TrajectoryGroup:
    return art.TrajectoryGroup(
        art.Trajectory(
            reward=r, initial_policy_version=version, messages_and_choices=[{"role": "user", "content": "q"}]
        )
        for r in rewards
    )


def history(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "here" / "models" / "loop" / "history.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def in_process(
    tmp_path: Path, backend: StepBackend, rollout_fn: Any, items: Any, **kwargs: Any
) -> PipelineTrainer:
    return PipelineTrainer(model(tmp_path), backend, rollout_fn, items, {"bonus": 1.0}, **kwargs)  # type: ignore[arg-type]


async def test_a_closure_rollout_trains_each_batch_through_backend_train(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    backend = StepBackend()

    async def grouped(m: Any, scenario: dict[str, Any], config: dict[str, float]) -> art.TrajectoryGroup:
        return group([0.0, scenario["i"] + config["bonus"]])  # the config crosses: it is this process's

    async def evaluate(m: Any, step: int, config: Any) -> list[art.Trajectory]:
        return [art.Trajectory(reward=0.5, messages_and_choices=[{"role": "user", "content": "e"}])]

    items = [{"i": i, "metadata": {"scenario_id": f"s{i}", "tags": ["x"]}} for i in range(6)]
    with caplog.at_level(logging.WARNING):
        trainer = in_process(
            tmp_path, backend, grouped, items, eval_fn=evaluate, min_batch_size=2, max_batch_size=2,
            num_rollout_workers=2, learning_rate=3e-5, loss_fn="ppo", eval_every_n_steps=2,
        )  # fmt: skip
    assert not trainer.durable and "runs in this process" in caplog.text and "group function" in caplog.text
    await trainer.run_stages(0)

    assert [len(b) for b in backend.batches] == [2, 2, 2]
    assert backend.options[0] == {"learning_rate": 3e-5, "loss_fn": "ppo"}
    trained = [g for b in backend.batches for g in b]
    assert sorted(str(g.metadata["scenario_id"]) for g in trained) == [f"s{i}" for i in range(6)]
    assert all("scenario_tags" not in g.metadata for g in trained)  # only scalar metadata is kept
    assert all(t.initial_policy_version is not None for g in trained for t in g.trajectories)
    rows = history(tmp_path)
    train = {r["step"]: r for r in rows if "train/reward" in r}
    assert sorted(train) == [1, 2, 3]
    assert train[1]["loss/train"] == 0.25 and train[1]["train/discarded_stale_groups"] == 0.0
    assert "train/steps_off_policy" in train[1] and "time/step_trainer_s" in train[1]
    evals = sorted(r["step"] for r in rows if "val/reward" in r)
    assert evals == [0, 2]  # at the start, then every 2 steps (ART has no final eval)


async def test_stale_and_zero_variance_groups_are_dropped_counted_and_logged(tmp_path: Path) -> None:
    backend = StepBackend()
    trainer = in_process(
        tmp_path, backend, lambda *_: asyncio.sleep(0), [], min_batch_size=1, max_batch_size=3, max_steps_off_policy=1,
        max_steps=1,
    )  # fmt: skip
    queue: asyncio.Queue[art.TrajectoryGroup | None] = asyncio.Queue()
    trainer._output_queue = queue
    fresh = group([0.0, 1.0], version=2)
    for g in (group([0.0, 1.0], version=0), group([1.0, 1.0], version=2), fresh, None):
        queue.put_nowait(g)
    trainer.state.next_training_step = trainer.state.policy_version = 2

    await trainer._training_stage()

    assert backend.batches == [[fresh]]  # version 0 is more than one step behind step 2
    rows = history(tmp_path)
    assert next(r for r in rows if "train/reward" in r)["train/discarded_stale_groups"] == 1.0
    assert next(r for r in rows if "discarded/reward" in r)["discarded/reward"] == 1.0


async def test_rollouts_wait_for_the_policy_within_max_steps_off_policy(tmp_path: Path) -> None:
    backend = StepBackend(seconds=0.05)
    started: list[tuple[int, int]] = []

    async def grouped(m: Any, scenario: Any, config: Any) -> art.TrajectoryGroup:
        started.append((trainer.state.policy_version, trainer.state.next_training_step))
        await asyncio.sleep(0.01)
        return group([0.0, 1.0])  # versions left unset: the trainer stamps the policy it sampled

    trainer = in_process(
        tmp_path, backend, grouped, range(8), min_batch_size=1, max_batch_size=1, max_steps_off_policy=0,
        num_rollout_workers=3,
    )  # fmt: skip
    await trainer.run_stages(0)

    # Off-policy limit 0: no rollout starts while a step newer than the served policy is in training.
    assert len(started) == 8 and all(version >= in_training for version, in_training in started)
    assert len(backend.batches) >= 2
    for step, batch in enumerate(backend.batches, start=1):
        assert batch[0].trajectories[0].initial_policy_version == step - 1


async def test_a_rollout_that_always_fails_stops_training_and_collapse_stops_it_too(tmp_path: Path) -> None:
    async def broken(m: Any, scenario: Any, config: Any) -> art.TrajectoryGroup:
        return art.TrajectoryGroup([ValueError("no server")])

    trainer = in_process(tmp_path, StepBackend(), broken, range(3), min_batch_size=1)
    with pytest.raises(ExceptionGroup) as failed:
        await trainer.run_stages(0)
    assert "all 1 rollouts of a group failed; the first: ValueError: no server" in str(
        failed.value.exceptions
    )

    async def flat(m: Any, scenario: Any, config: Any) -> art.TrajectoryGroup:
        return group([1.0, 1.0])

    backend = StepBackend()
    trainer = in_process(tmp_path, backend, flat, range(100), min_batch_size=1, discard_queue_multiplier=3)
    await trainer.run_stages(0)
    assert backend.batches == [] and trainer.state.done  # 3 groups in a row with nothing to learn


async def test_request_stop_ends_the_loop_while_it_waits_for_groups(tmp_path: Path) -> None:
    backend = StepBackend()

    async def first_then_hang(m: Any, scenario: int, config: Any) -> art.TrajectoryGroup:
        if scenario > 0:
            await asyncio.Event().wait()  # a rollout that never ends: training waits for groups
        return group([0.0, 1.0])

    trainer = in_process(
        tmp_path, backend, first_then_hang, iter(range(10)), min_batch_size=1, max_batch_size=1
    )
    backend.on_train = lambda: asyncio.get_running_loop().call_later(0.05, trainer.request_stop)
    await asyncio.wait_for(trainer.run_stages(0), timeout=10)
    assert len(backend.batches) == 1


def test_the_mode_is_a_training_run_when_the_workers_can_run_the_rollout(tmp_path: Path) -> None:
    backend = StepBackend()
    durable = in_process(tmp_path, backend, make_group_rollout_fn(rollout, n=2), scenarios()[:4])
    assert durable.durable and durable.run_spec().task.rollout == "examples.arithmetic:rollout"
    forced = in_process(
        tmp_path, backend, make_group_rollout_fn(rollout, n=2), scenarios()[:4], durable=False
    )
    assert not forced.durable
    with pytest.raises(art.UnsupportedArtOption, match="group function"):
        in_process(tmp_path, backend, lambda *_: None, scenarios()[:4], durable=True)
    with pytest.raises(art.UnsupportedArtOption, match="read by a TrainingRun's workers"):
        in_process(tmp_path, backend, lambda *_: None, "scenarios.jsonl")
    with pytest.raises(art.UnsupportedArtOption, match=r"model\.delete_checkpoints"):
        in_process(
            tmp_path,
            backend,
            lambda *_: None,
            [],
            checkpoint_retention_strategy=keep_recent_and_top(recent=1, top=0),
        )
    with pytest.raises(ValueError, match="max_batch_size must be >= min_batch_size"):
        in_process(tmp_path, backend, lambda *_: None, [], min_batch_size=3, max_batch_size=2)


async def test_rollouts_record_costs_as_train_and_evals_as_eval(tmp_path: Path) -> None:
    contexts: list[str] = []

    @track_api_cost(source="judge/score", provider="openai", model_name="some/judge", prompt_price_per_million=1.0,
                    completion_price_per_million=2.0)  # fmt: skip
    async def judge() -> Any:
        contexts.append(MetricsBuilder.get_active().cost_context)
        return SimpleNamespace(usage=SimpleNamespace(prompt_tokens=100, completion_tokens=50))

    async def grouped(m: Any, scenario: Any, config: Any) -> art.TrajectoryGroup:
        await judge()
        return group([0.0, 1.0])

    async def evaluate(m: Any, step: int, config: Any) -> list[art.Trajectory]:
        await judge()
        return [art.Trajectory(reward=1.0, messages_and_choices=[{"role": "user", "content": "e"}])]

    trainer = in_process(tmp_path, StepBackend(), grouped, range(1), eval_fn=evaluate, min_batch_size=1)
    await trainer.run_stages(0)

    assert sorted(contexts) == ["eval", "train"]
    rows = history(tmp_path)
    val = next(r for r in rows if "val/reward" in r)
    assert val["costs/eval/judge/score"] == pytest.approx(200e-6) and "time/step_eval_s" in val
    assert next(r for r in rows if "train/reward" in r)["costs/train/judge/score"] == pytest.approx(200e-6)
