"""``model.log``'s local files in ART's layout and formats (dgrpo/model_log/local_files.py): ``history.jsonl``,
``trajectories/<split>/<step:04d>.parquet`` and ``state.json`` under ``<base_path>/<project>/models/<name>/``,
for a model never registered and for a registered one, whose metrics Parquet rows stay dgrpo's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import dgrpo as art
from activities.object_store import ObjectStore
from activities.retention import metrics_by_step
from dgrpo.model_log.local_files import history_key
from dgrpo.utils.trajectory_logging import read_trajectory_groups_parquet


def history(base: Path, project: str, name: str) -> list[dict[str, Any]]:
    path = base / project / "models" / name / "history.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def batch() -> list[art.TrajectoryGroup]:
    def traj(reward: float, turns: float) -> art.Trajectory:
        return art.Trajectory(
            messages_and_choices=[{"role": "user", "content": f"r={reward}"}],
            reward=reward,
            metrics={"turns": turns, "reward/shaped": reward / 2},
        )

    return [
        art.TrajectoryGroup(
            [traj(0.0, 1), traj(1.0, 3)], metrics={"judge": 0.2}, metadata={"scenario_id": "a"}
        ),
        art.TrajectoryGroup([traj(1.0, 2), ValueError("a rollout raised")], metrics={"judge": 0.6}),
    ]


async def test_log_before_register_writes_arts_files(tmp_path: Path) -> None:
    model = art.Model(name="base", project="local", base_path=str(tmp_path), report_metrics=[])
    await model.log(batch(), split="val")
    await model.log(batch(), split="val", step=7)

    model_dir = tmp_path / "local/models/base"
    assert sorted(p.name for p in (model_dir / "trajectories/val").iterdir()) == [
        "0000.parquet",
        "0007.parquet",
    ]
    loaded = read_trajectory_groups_parquet(model_dir / "trajectories/val/0000.parquet")
    assert [[t.reward for t in g.trajectories] for g in loaded] == [[0.0, 1.0], [1.0]]
    first, second = history(tmp_path, "local", "base")
    assert (first["step"], first["training_step"], second["step"]) == (0, 0, 7)
    assert first["time/wall_clock_sec"] >= 0 and "recorded_at" in first
    assert {
        k: v for k, v in first.items() if k.startswith("val/") or k.startswith("reward/")
    } == pytest.approx(
        {
            "val/reward": 2 / 3,
            "val/exception_rate": 0.25,  # one of four rollouts raised
            "val/reward_std_dev": 0.5,  # over groups of two or more trajectories: the first only
            "val/turns": 2.0,
            "val/group_judge": 0.4,  # ART's name for a group metric's mean
            "reward/shaped": 1 / 3,  # a section's name is kept
        }
    )
    assert (
        first["data/step_num_trajectories"] == 4 and first["data/cum/num_trajectories"] == 4
    )  # raised ones too
    assert second["data/cum/num_trajectories"] == 8
    assert "data/step_num_groups_trainable" not in first  # counted for train only, as in ART


async def test_running_totals_continue_in_a_model_made_again(tmp_path: Path) -> None:
    model_dir = tmp_path / "p/models/m"
    model_dir.mkdir(parents=True)
    (model_dir / "state.json").write_text(json.dumps({"dataset_offset": 12}))  # the program's own state
    first = art.Model(name="m", project="p", base_path=str(tmp_path), report_metrics=[])
    first.metrics_builder().add_data(scenario_ids=["s1"])
    await first.log(split="train", step=1, metrics={"costs/train/prefill": 0.25, "time/step_actor_s": 1.5})
    again = art.Model(name="m", project="p", base_path=str(tmp_path), report_metrics=[])
    again.metrics_builder().add_data(scenario_ids=["s2"])
    await again.log(split="train", step=2, metrics={"costs/train/prefill": 0.75, "loss/train": 0.1})

    one, two = history(tmp_path, "p", "m")
    assert (one["costs/train"], one["costs/all"], one["costs/cum/all"]) == pytest.approx((0.25, 0.25, 0.25))
    assert (one["time/cum/actor_s"], one["data/cum/num_unique_scenarios"]) == pytest.approx((1.5, 1.0))
    assert (two["costs/cum/train/prefill"], two["costs/cum/all"]) == pytest.approx((1.0, 1.0))
    assert (two["data/cum/num_unique_scenarios"], two["loss/train"]) == pytest.approx((2.0, 0.1))
    state = json.loads((model_dir / "state.json").read_text())
    assert state["dataset_offset"] == 12
    assert state["_metrics_builder_state"]["unique_scenario_ids"] == ["s1", "s2"]


def test_history_keys_follow_arts_sections_and_splits() -> None:
    assert history_key("reward/mean", "train") == "reward/mean"
    assert history_key("val/reward", "train") == "val/reward"
    assert history_key("custom", "train") == "train/custom"
    assert history_key("checkpoint/foo", "train") == "train/checkpoint/foo"
    assert history_key("loss/train", "versus-base") == "versus-base/loss/train"  # another split: all prefixed


class StoreOnlyBackend(art.TemporalBackend):
    """The real object store, no workers: all ``model.log`` needs (``LocalBackend`` fills this seam)."""

    async def start(self) -> None:
        return None


async def test_registered_model_keeps_its_parquet_rows_and_writes_the_local_files(
    object_store: ObjectStore, tmp_path: Path
) -> None:
    model = art.Model(name="base", project="both", base_path=str(tmp_path), report_metrics=[])
    await model.register(StoreOnlyBackend(s3=object_store.settings))
    returned = await model.log(batch(), split="val", metrics={"costs/eval/judge": 0.5})

    recorded = metrics_by_step(object_store, model.run_id)[0]
    dgrpo_row = {
        "val/reward": 2 / 3,
        "val/reward_std_dev": 0.5,
        "val/exception_rate": 0.25,
        "val/data/step_num_scenarios": 2.0,
        "val/data/step_num_trajectories": 4.0,
        "val/data/step_num_groups_submitted": 2.0,
        "val/turns": 2.0,
        "val/reward/shaped": 1 / 3,
        "val/group/judge": 0.4,
        "costs/eval/judge": 0.5,  # as given: dgrpo's rows sum only what the metrics builder was given
    }
    assert returned == pytest.approx(dgrpo_row)
    assert {k: v for k, v in recorded.items() if k in returned} == pytest.approx(dgrpo_row)
    assert "costs/all" not in recorded and "val/group_judge" not in recorded
    (line,) = history(tmp_path, "both", "base")
    assert (line["val/group_judge"], line["costs/all"], line["costs/cum/eval/judge"]) == pytest.approx(
        (0.4, 0.5, 0.5)
    )
    assert (tmp_path / "both/models/base/trajectories/val/0000.parquet").exists()
