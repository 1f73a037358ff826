"""``model.log`` writes ART's metric names to the run's metrics Parquet (dgrpo's) and to W&B (the rows of
``history.jsonl``, read back offline)."""

from __future__ import annotations

from pathlib import Path

import pytest

import dgrpo as art
from activities.object_store import ObjectStore
from activities.retention import metrics_by_step
from tests.wandb_records import history


class StoreOnlyBackend(art.TemporalBackend):
    """The real object store, no workers: all ``model.log`` needs (``LocalBackend`` fills this seam)."""

    async def start(self) -> None:
        return None


def groups() -> list[art.TrajectoryGroup]:
    def traj(reward: float) -> art.Trajectory:
        return art.Trajectory(messages_and_choices=[], reward=reward, metrics={"turns": 2, "time/x_s": 4.0})

    return [
        art.TrajectoryGroup([traj(0.0), traj(1.0)]),
        art.TrajectoryGroup([traj(1.0), traj(1.0), ValueError("a rollout raised")]),
    ]


async def test_model_log_reaches_parquet_and_wandb_under_arts_names(
    object_store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    model = art.Model(name="base", project="metrics", base_path=str(tmp_path), report_metrics=["wandb"])
    await model.register(StoreOnlyBackend(s3=object_store.settings))
    await model.log(groups(), split="val")
    await model.log(metrics={"loss/train": 0.3, "lr": 1e-5}, split="train", step=1)
    model.finish_wandb()

    val = {
        "val/reward": 0.75,
        "val/reward_std_dev": 0.25,  # ART's: the mean of each group's std (0.5 and 0)
        "val/exception_rate": 0.2,
        "val/data/step_num_trajectories": 5.0,
        "val/data/step_num_groups_submitted": 2.0,
        "val/turns": 2.0,
        "time/x_s": 4.0,  # a section name is kept as it is
    }
    train = {"loss/train": 0.3, "train/lr": 1e-5}
    (offline_run,) = (tmp_path / "wandb" / model.run_id / "wandb").glob(f"offline-run-*-{model.run_id}")
    logged = history(offline_run)
    assert [row["training_step"] for row in logged] == [0, 1]
    # W&B's rows are history.jsonl's (ART's keys: a val batch's counts are data/..., as ART writes them)
    val_in_history = {**val, "data/step_num_trajectories": 5.0, "data/step_num_groups_submitted": 2.0}
    for key in ("val/data/step_num_trajectories", "val/data/step_num_groups_submitted"):
        del val_in_history[key]
    assert {k: logged[0][k] for k in val_in_history} == pytest.approx(val_in_history)
    assert {k: logged[1][k] for k in train} == pytest.approx(train)
    recorded = metrics_by_step(object_store, model.run_id)
    assert {k: recorded[0][k] for k in val} == pytest.approx(val)
    assert {k: recorded[1][k] for k in train} == pytest.approx(train)
    assert "data/step_num_groups_trainable" not in recorded[0]  # ART counts trainable groups for train only
