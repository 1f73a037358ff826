"""The metrics activity: per-run Parquet (idempotent per step), reward-curve PNG, W&B offline."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from activities.metrics import MetricsActivities, read_metrics
from activities.object_store import ObjectStore
from schemas import layout
from schemas.activities import MetricsInput

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def metrics_input(step: int, reward: float, wandb: bool = False, **extra: float) -> MetricsInput:
    return MetricsInput(
        run_id="m1",
        project="demo",
        model_name="agent-001",
        step=step,
        metrics={"reward_mean": reward, "reward_std": 0.1, **extra},
        wandb=wandb,
    )


async def test_metrics_parquet_replaces_a_retried_step_and_draws_the_curve(
    object_store: ObjectStore, tmp_path: Path
) -> None:
    acts = MetricsActivities(object_store, local_dir=tmp_path)
    env = ActivityEnvironment()
    await env.run(acts.log_metrics, metrics_input(1, 0.2))
    await env.run(acts.log_metrics, metrics_input(2, 0.3, loss=0.5))
    await env.run(acts.log_metrics, metrics_input(1, 0.25))  # a retry of step 1 replaces its row
    rows = read_metrics(object_store, "m1")
    assert [(r["step"], r["reward_mean"]) for r in rows] == [(1, 0.25), (2, 0.3)]
    assert rows[0]["loss"] is None and rows[1]["loss"] == 0.5
    assert rows[0]["run_id"] == "m1" and rows[0]["model_name"] == "agent-001"
    assert object_store.get_bytes(layout.reward_curve_key("m1")).startswith(PNG_MAGIC)
    assert (tmp_path / "m1" / "reward_curve.png").read_bytes().startswith(PNG_MAGIC)


async def test_wandb_offline_logs_with_the_step_axis(
    object_store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    acts = MetricsActivities(object_store, local_dir=tmp_path, wandb_dir=tmp_path / "wandb")
    await ActivityEnvironment().run(acts.log_metrics, metrics_input(1, 0.2, wandb=True))
    await ActivityEnvironment().run(acts.log_metrics, metrics_input(2, 0.4, wandb=True))
    run = acts.wandb.runs["m1"]
    assert run.id == "m1" and run.settings.mode == "offline"
    acts.wandb.close()
    offline_runs = list((tmp_path / "wandb" / "m1" / "wandb").glob("offline-run-*-m1"))
    assert offline_runs and list(offline_runs[0].glob("*.wandb"))


async def test_a_wandb_failure_never_fails_the_step(object_store: ObjectStore, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where W&B wants a directory")
    acts = MetricsActivities(object_store, local_dir=tmp_path, wandb_dir=blocker)
    await ActivityEnvironment().run(acts.log_metrics, metrics_input(1, 0.2, wandb=True))
    assert [r["step"] for r in read_metrics(object_store, "m1")] == [1]
