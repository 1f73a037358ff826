"""``dgrpo.metrics_taxonomy``: a batch's ``data/step_*`` counts and the average of a step's metric samples."""

from __future__ import annotations

import pytest

import dgrpo as art
from dgrpo.metrics_taxonomy import (
    TRAIN_GRADIENT_STEPS_KEY,
    average_metric_samples,
    build_data_metrics_from_summary,
    summarize_trajectory_groups,
)
from dgrpo.model_log.run_metrics import group_metrics


def test_samples_average_per_key_and_gradient_steps_must_agree() -> None:
    samples = [{"loss/train": 1.0, "loss/grad_norm": 0.5}, {"loss/train": 0.5}, {TRAIN_GRADIENT_STEPS_KEY: 2}]
    assert average_metric_samples(samples) == {
        "loss/train": 0.75,
        "loss/grad_norm": 0.5,
        TRAIN_GRADIENT_STEPS_KEY: 2,
    }
    with pytest.raises(ValueError, match="must be invariant"):
        average_metric_samples([{TRAIN_GRADIENT_STEPS_KEY: 2}, {TRAIN_GRADIENT_STEPS_KEY: 3}])


def test_a_batch_summary_counts_groups_and_scenarios_as_model_log_does() -> None:
    groups = [
        art.TrajectoryGroup(
            [art.Trajectory(reward=0.0), art.Trajectory(reward=1.0)], metadata={"scenario_id": "s1"}
        ),
        art.TrajectoryGroup(
            [art.Trajectory(reward=1.0, metadata={"scenario_id": "s2"}), ValueError("raised")]
        ),
        art.TrajectoryGroup([art.Trajectory(reward=1.0)], metadata={"scenario_id": "s1"}),
    ]
    summary = summarize_trajectory_groups(groups)
    assert (summary.num_trajectories, summary.num_groups_trainable, summary.scenario_ids) == (
        5,
        1,
        ["s1", "s2"],
    )
    counts = build_data_metrics_from_summary(summary, include_trainable_groups=True)
    assert counts == {k: v for k, v in group_metrics(groups, "train").items() if k.startswith("data/")}
    assert "data/step_num_groups_trainable" not in build_data_metrics_from_summary(
        summary, include_trainable_groups=False
    )
