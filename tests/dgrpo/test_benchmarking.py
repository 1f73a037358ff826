"""``dgrpo.utils.benchmarking.load_trajectories``: the trajectories ``model.log`` wrote under a project, read
back as one polars table to compare models by."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from openai.types.chat.chat_completion import Choice as OpenAIChoice

import dgrpo as art
from dgrpo.utils.benchmarking.load_trajectories import load_trajectories
from dgrpo.utils.trajectory_logging import write_trajectory_groups_parquet
from schemas import layout

SAMPLED = OpenAIChoice.model_validate(
    {
        "finish_reason": "tool_calls",
        "index": 0,
        "message": {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}],
        },
    }
)


def group(reward: float, scenario: str) -> art.TrajectoryGroup:
    trajectory = art.Trajectory(
        messages_and_choices=[{"role": "user", "content": "2+2?"}, SAMPLED],
        reward=reward,
        metrics={"correct": reward, "turns": 2},
        metadata={"seed": 7},
        logs=["ok"],
    )
    return art.TrajectoryGroup(
        [trajectory, trajectory], metadata={"scenario": scenario}, metrics={"judge": 0.5}
    )


def log(base: Path, model: str, split: str, step: int, groups: list[art.TrajectoryGroup]) -> None:
    path = layout.art_trajectories_path(layout.art_model_dir(base, "proj", model), split, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_trajectory_groups_parquet(groups, path)


async def test_every_logged_trajectory_is_one_row_with_its_metrics_and_metadata(tmp_path: Path) -> None:
    log(tmp_path, "b", "val", 10, [group(1.0, "s1")])
    log(tmp_path, "a", "train", 2, [group(0.0, "s2"), group(1.0, "s3")])
    log(tmp_path, "a", "train", 1, [group(0.5, "s4")])
    (tmp_path / "proj" / "models" / "a" / "trajectories" / "train" / "notes.parquet").write_text("not a step")

    df = await load_trajectories("proj", art_path=str(tmp_path))
    assert df.height == 8
    assert df.select("model", "split", "step").unique(maintain_order=True).rows() == [
        ("a", "train", 1),
        ("a", "train", 2),
        ("b", "val", 10),
    ]
    # Groups are numbered across the table, one number per (model, split, step, group).
    assert df["group_number"].to_list() == [1, 1, 2, 2, 3, 3, 4, 4]
    assert df["group_metadata_scenario"].to_list()[:4] == ["s4", "s4", "s2", "s2"]
    assert df["metric_turns"].dtype == df["group_metric_judge"].dtype == pl.Float64
    assert (df["metric_correct"][2], df["group_metric_judge"][0], df["metadata_seed"][0]) == (0.0, 0.5, "7")
    user, sampled = df["messages"][0]
    assert (user["role"], user["trainable"], sampled["trainable"]) == ("user", False, True)
    assert sampled["tool_calls"][0]["function"] == {"name": "add", "arguments": "{}"}
    assert df["logs"][0].to_list() == ["ok"]

    only_b = await load_trajectories("proj", models=["b"], art_path=str(tmp_path))
    assert only_b["model"].unique().to_list() == ["b"] and only_b["group_number"].to_list() == [1, 1]


async def test_nothing_logged_is_an_empty_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert (await load_trajectories("proj", art_path=str(tmp_path))).is_empty()
    log(tmp_path / layout.ART_BASE_PATH, "a", "val", 0, [group(1.0, "s")])
    assert (await load_trajectories("proj", models=["other"], art_path=str(tmp_path / ".art"))).is_empty()
    monkeypatch.chdir(tmp_path)  # without art_path: the models' own default base_path
    assert (await load_trajectories("proj")).height == 2
