"""``model.log`` writes ART 0.5.23's files when the program is a 0.5.23 program (``DGRPO_ART_VERSION=0.5.23``
here; ``TrainableModel(run_name=...)`` too), and ART 0.5.18's otherwise: the history row's keys, the
throughput's inputs, and the trajectories Parquet's version 2 (which reads back exactly, captured exchanges
included). No stack: an unregistered model writes its local files as ART's does."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import openai
import pyarrow.parquet as pq
import pytest

import dgrpo as art
from dgrpo.model_log.dialect import ENV_ART_VERSION
from dgrpo.utils.trajectory_logging import file_version, read_trajectory_groups_parquet
from schemas import layout
from schemas.exchanges import ChatCompletionsExchange, TrajectoryExchanges
from tests.dgrpo.model_endpoints_stub import chat_completion

USER = {"role": "user", "content": "Say hi."}


def groups() -> list[art.TrajectoryGroup]:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    captured = art.Trajectory(
        exchanges=TrajectoryExchanges(
            chat_completions=[
                ChatCompletionsExchange(
                    request={"model": "agent", "messages": [USER]},
                    response=openai.types.chat.ChatCompletion.model_validate(chat_completion("agent", "hi")),
                    start_time=start,
                    end_time=start,
                )
            ]
        ),
        reward=1.0,
        metrics={"turns": 1},
        metadata={"scenario": {"id": 7}},  # 0.5.23's metadata holds any JSON value
    )
    legacy = art.Trajectory(messages_and_choices=[USER, {"role": "assistant", "content": "yo"}], reward=0.0)
    return [
        art.TrajectoryGroup([captured, legacy], metrics={"judge_agreement": 0.5}),
        art.TrajectoryGroup([], exceptions=[ValueError("every rollout failed")]),
    ]


async def logged(tmp_path: Path) -> tuple[dict[str, Any], Path]:
    model = art.Model(name="agent", project="dialect", base_path=str(tmp_path))
    trained = {"loss/train": 0.5, "reward/judge": 0.25, "data/step_trainable_assistant_tokens": 100.0,
               "time/step_backend_train_s": 2.0}  # fmt: skip
    await model.log(groups(), metrics=trained, step=1, split="train")
    folder = layout.art_model_dir(tmp_path, "dialect", "agent")
    [row] = [json.loads(line) for line in (folder / layout.ART_HISTORY_FILE).read_text().splitlines()]
    return row, layout.art_trajectories_path(folder, "train", 1)


async def test_the_0523_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_ART_VERSION, "0.5.23")
    row, parquet = await logged(tmp_path)
    assert row["train/group/judge_agreement"] == 0.5 and "train/group_judge_agreement" not in row
    assert row["train/reward/judge"] == 0.25 and "reward/judge" not in row  # reward is no section in 0.5.23
    assert row["loss/train"] == 0.5 and row["training_step"] == row["step"] == 1
    assert "time/wall_clock_sec" not in row
    assert row["throughput/avg_trainer_tok_per_s"] == 50.0  # 100 tokens in 2 s of backend.train
    assert row["train/exception_rate"] == pytest.approx(1 / 3)

    assert file_version(parquet) == 2
    table = pq.read_table(parquet).to_pylist()
    assert [(r["group_index"], r["trajectory_index"]) for r in table] == [(0, 0), (0, 1), (1, None)]
    assert table[0]["messages"] is None and [m["content"] for m in table[1]["messages"]] == ["Say hi.", "yo"]
    read = read_trajectory_groups_parquet(parquet)
    assert [g.model_dump() for g in read] == [g.model_dump() for g in groups()]  # exact, exchanges included
    response = read[0].trajectories[0].exchanges.chat_completions[0].response
    assert isinstance(response, openai.types.chat.ChatCompletion)


async def test_the_0518_files_by_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_ART_VERSION, raising=False)
    row, parquet = await logged(tmp_path)
    assert row["train/group_judge_agreement"] == 0.5 and row["reward/judge"] == 0.25
    assert "time/wall_clock_sec" in row and "throughput/avg_trainer_tok_per_s" not in row
    assert file_version(parquet) == 1 and "trajectory_json" not in pq.read_schema(parquet).names


async def test_an_unknown_version_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_ART_VERSION, "0.6")
    model = art.Model(name="agent", project="dialect", base_path=str(tmp_path))
    with pytest.raises(ValueError, match=r"DGRPO_ART_VERSION='0.6': give one of 0.5.18, 0.5.23"):
        await model.log(metrics={"loss/train": 1.0}, step=1, split="train")


async def test_a_model_that_names_its_run_writes_0523_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV_ART_VERSION, raising=False)
    named = art.TrainableModel(name="agent", run_name="agent-r2", project="dialect", base_path=str(tmp_path))
    assert named.local_log().dialect.version == "0.5.23"
    assert art.TrainableModel(name="agent", project="dialect").local_log().dialect.version == "0.5.18"
