"""ART's checkpoint-retention strategies (``dgrpo.pipeline_trainer``): which steps ``keep_recent_and_top``
keeps, and how ``PipelineTrainer`` turns one into the run's ``checkpoints`` setting."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

import dgrpo as art
from dgrpo.pipeline_trainer import (
    CheckpointInfo,
    CheckpointRetentionContext,
    PipelineTrainer,
    keep_recent_and_top,
    make_group_rollout_fn,
)
from examples.arithmetic import rollout, scenarios
from schemas.config import CheckpointsSpec, TaskQueues


def checkpoints(rewards: dict[int, float | None]) -> CheckpointRetentionContext:
    infos = [
        CheckpointInfo(
            step=step,
            path=f"ckpt/{step}",
            created_at=datetime.fromtimestamp(step, UTC),
            metrics={} if reward is None else {"val/reward": reward, "train/loss": -reward},
        )
        for step, reward in rewards.items()
    ]
    return CheckpointRetentionContext(current_step=max(rewards) + 1, checkpoints=infos)


def test_keeps_the_newest_and_the_best_by_the_metric() -> None:
    context = checkpoints({4: None, 0: 0.1, 2: 0.9, 1: None, 3: 0.5, 5: None})  # not in step order
    assert keep_recent_and_top(recent=2, top=1)(context) == {2, 4, 5}
    assert keep_recent_and_top(recent=1, top=2)(context) == {2, 3, 5}
    assert keep_recent_and_top(recent=0, top=1, metric="train/loss")(context) == {0}
    assert keep_recent_and_top(recent=10, top=0)(context) == {0, 1, 2, 3, 4, 5}  # more than there are


def test_ties_go_to_the_later_step_and_an_absent_metric_keeps_only_the_newest() -> None:
    assert keep_recent_and_top(recent=0, top=1)(checkpoints({0: 0.7, 1: 0.7, 2: None})) == {1}
    assert keep_recent_and_top(recent=1, top=3, metric="nope")(checkpoints({0: 0.1, 1: 0.2})) == {1}
    assert keep_recent_and_top(recent=0, top=0)(checkpoints({0: 0.1, 1: 0.2})) == set()


def test_negative_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="recent must be >= 0"):
        keep_recent_and_top(recent=-1)
    with pytest.raises(ValueError, match="top must be >= 0"):
        keep_recent_and_top(top=-2)


def trainer(**kwargs: Any) -> PipelineTrainer:
    model = art.TrainableModel(name="agent", project="ret", base_model="smollm2-135m-instruct")
    backend = art.TemporalBackend(address="127.0.0.1:1", task_queues=TaskQueues(control="c", inference="i"))
    return PipelineTrainer(
        model, backend, make_group_rollout_fn(rollout, n=2), scenarios()[:4], None, max_steps=2, **kwargs
    )


def test_pipeline_trainer_runs_the_strategy_as_the_runs_retention() -> None:
    assert trainer().run_spec().checkpoints == CheckpointsSpec()  # no strategy: every checkpoint kept
    spec = trainer(checkpoint_retention_strategy=keep_recent_and_top(recent=2, top=1, metric="val/reward"))
    # The step just published is never deletable, so two more recent ones make keep_last 3.
    assert spec.run_spec().checkpoints == CheckpointsSpec(keep_last=3, keep_best_metric="val/reward")
    recent_only = trainer(checkpoint_retention_strategy=keep_recent_and_top(recent=0, top=0))
    assert recent_only.run_spec().checkpoints == CheckpointsSpec(keep_last=1)


def test_pipeline_trainer_refuses_what_the_run_cannot_keep() -> None:
    with pytest.raises(art.UnsupportedArtOption, match="top=0 or top=1"):
        trainer(checkpoint_retention_strategy=keep_recent_and_top(top=2))
    with pytest.raises(art.UnsupportedArtOption, match="cannot call a function of this process"):
        trainer(checkpoint_retention_strategy=lambda context: set())
    with pytest.raises(art.UnsupportedArtOption, match="after every step"):
        trainer(checkpoint_retention_strategy=keep_recent_and_top(top=1), checkpoint_retention_interval=5)
    with pytest.raises(ValueError, match="must be > 0"):
        trainer(checkpoint_retention_interval=0)
