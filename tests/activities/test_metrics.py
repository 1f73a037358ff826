"""The metrics activity: per-run Parquet (idempotent per step), reward-curve PNG, W&B offline, and the
numbers TrainingRun sends it under ART's metric names, read back from both."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from temporalio.testing import ActivityEnvironment

from activities.metrics import MetricsActivities, read_metrics, record_step
from activities.object_store import ObjectStore
from schemas import layout
from schemas.activities import MetricsInput
from schemas.run_state import StepSummary
from tests.wandb_records import history
from workflows.bookkeeping import step_metrics

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def metrics_input(step: int, reward: float, wandb: bool = False, **extra: float) -> MetricsInput:
    return MetricsInput(
        run_id="m1",
        project="demo",
        model_name="agent-001",
        step=step,
        metrics={"train/reward": reward, "train/reward_std_dev": 0.1, **extra},
        wandb=wandb,
    )


async def test_metrics_parquet_replaces_a_retried_step_and_draws_the_curve(
    object_store: ObjectStore, tmp_path: Path
) -> None:
    acts = MetricsActivities(object_store, local_dir=tmp_path)
    env = ActivityEnvironment()
    await env.run(acts.log_metrics, metrics_input(1, 0.2))
    await env.run(acts.log_metrics, metrics_input(2, 0.3, **{"loss/train": 0.5}))
    await env.run(acts.log_metrics, metrics_input(1, 0.25))  # a retry of step 1 replaces its row
    rows = read_metrics(object_store, "m1")
    assert [(r["step"], r["train/reward"]) for r in rows] == [(1, 0.25), (2, 0.3)]
    assert rows[0]["loss/train"] is None and rows[1]["loss/train"] == 0.5
    assert rows[0]["run_id"] == "m1" and rows[0]["model_name"] == "agent-001"
    assert object_store.get_bytes(layout.reward_curve_key("m1")).startswith(PNG_MAGIC)
    assert (tmp_path / "m1" / "reward_curve.png").read_bytes().startswith(PNG_MAGIC)


async def test_two_writers_at_once_lose_no_row_and_no_column(object_store: ObjectStore) -> None:
    """The metrics activity and a client's ``model.log`` write a run's metrics at the same time (20 writes
    each, the same steps, their own columns): every step keeps both writers' numbers, in the objects and in
    the Parquet rebuilt from them. A read-modify-write of one object kept about half."""
    run_id = "m-concurrent"

    def writer(column: str) -> None:
        for step in range(1, 21):
            record_step(object_store, run_id, "agent-001", step, {column: float(step)})

    await asyncio.gather(asyncio.to_thread(writer, "train/reward"), asyncio.to_thread(writer, "val/reward"))
    rows = read_metrics(object_store, run_id)
    assert [r["step"] for r in rows] == list(range(1, 21))
    assert all(r["train/reward"] == r["val/reward"] == float(r["step"]) for r in rows), rows
    record_step(object_store, run_id, "agent-001", 3, {"train/reward": 0.5})  # a retry replaces its value
    parquet = pq.read_table(pa.BufferReader(object_store.get_bytes(layout.metrics_key(run_id)))).to_pylist()
    assert [(r["step"], r["train/reward"], r["val/reward"]) for r in parquet][2] == (3, 0.5, 3.0)
    assert len(parquet) == 20


def training_run_step(step: int, reward: float) -> dict[str, float]:
    """What TrainingRun sends the activity for a step: 3 groups of 4, one rollout failed, one group flat."""
    summary = StepSummary(
        step=step,
        reward_mean=reward,
        reward_std=0.5,
        n_trajectories=11,
        n_exceptions=1,
        n_groups_zero_variance=1,
        policy_step=step - 1,
        loss=0.25 * step,
        seconds={"rollouts": 2.0, "train": 3.0, "step": 6.0},
        train_metrics={
            "loss/mean_importance_ratio": 1.0002,
            "loss/clip_fraction": 0.01,
            "loss/grad_norm": 0.7,
        },
    )
    return step_metrics(summary, n_groups=3, dropped_stale_groups=2)


async def test_training_run_metrics_reach_wandb_and_parquet_under_arts_names(
    object_store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    acts = MetricsActivities(object_store, local_dir=tmp_path, wandb_dir=tmp_path / "wandb")
    for step, reward in ((1, 0.2), (2, 0.4)):
        inp = MetricsInput(
            run_id="m1",
            project="demo",
            model_name="agent-001",
            step=step,
            metrics=training_run_step(step, reward),
        )
        await ActivityEnvironment().run(acts.log_metrics, inp)
    run = acts.wandb.runs["m1"]
    assert run.id == "m1" and run.settings.mode == "offline"
    acts.wandb.close()
    expected = {
        "train/reward": 0.4,
        "train/reward_std_dev": 0.5,
        "train/exception_rate": 1 / 12,
        "data/step_num_trajectories": 12.0,
        "data/step_num_groups_submitted": 3.0,
        "data/step_num_groups_trainable": 2.0,
        "discarded/step/zero_variance_groups": 1.0,
        "discarded/cum/stale_groups": 2.0,
        "offpolicy/policy_age_steps": 0.0,
        "loss/train": 0.5,
        "loss/mean_importance_ratio": 1.0002,
        "loss/clip_fraction": 0.01,
        "loss/grad_norm": 0.7,
        "time/step_wall_s": 6.0,
        "time/step_train_s": 3.0,
    }
    (offline_run,) = (tmp_path / "wandb" / "m1" / "wandb").glob("offline-run-*-m1")
    logged = history(offline_run)
    assert [row["training_step"] for row in logged] == [1, 2]  # ART's x-axis
    assert {k: logged[1][k] for k in expected} == pytest.approx(expected)
    assert logged[0]["train/reward"] == pytest.approx(0.2)
    parquet = read_metrics(object_store, "m1")
    assert {k: parquet[1][k] for k in expected} == pytest.approx(expected)
    assert "reward_mean" not in parquet[1] and "seconds/step" not in parquet[1]


async def test_a_wandb_failure_never_fails_the_step(object_store: ObjectStore, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where W&B wants a directory")
    acts = MetricsActivities(object_store, local_dir=tmp_path, wandb_dir=blocker)
    await ActivityEnvironment().run(acts.log_metrics, metrics_input(1, 0.2, wandb=True))
    assert [r["step"] for r in read_metrics(object_store, "m1")] == [1]
