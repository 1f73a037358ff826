"""``dgrpo.utils``' ART submodules: strip_logprobs, the trajectory Parquet log, litellm choices."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import dgrpo as art
from dgrpo.utils.litellm import convert_litellm_choice_to_openai
from dgrpo.utils.strip_logprobs import strip_logprobs
from dgrpo.utils.trajectory_logging import read_trajectory_groups_parquet, write_trajectory_groups_parquet


def test_strip_logprobs_copies_without_them() -> None:
    nested = [1, 2]
    given: dict[str, Any] = {
        "logprobs": [0.1],
        "keep": nested,
        "items": [{"logprobs": 1, "a": 1}, ({"logprobs": 2}, {"b": 2})],
    }
    stripped = strip_logprobs(given)
    assert stripped == {"keep": [1, 2], "items": [{"a": 1}, ({}, {"b": 2})]}
    assert isinstance(stripped["items"][1], tuple) and given["logprobs"] == [0.1]
    stripped["keep"].append(3)
    assert nested == [1, 2]  # a deep copy
    obj = SimpleNamespace(logprobs=[0.5], inner={"logprobs": 1, "x": 2})
    out = strip_logprobs(obj)
    assert (out.logprobs, out.inner, obj.logprobs) == (None, {"x": 2}, [0.5])
    assert [strip_logprobs(v) for v in (None, 3, "s", ())] == [None, 3, "s", ()]


def test_strip_logprobs_returns_what_it_cannot_copy(caplog: pytest.LogCaptureFixture) -> None:
    class Uncopyable:
        logprobs = "kept"

        def __deepcopy__(self, memo: dict[int, Any]) -> Any:
            raise RecursionError("too deep")

    obj = Uncopyable()
    with caplog.at_level(logging.WARNING):
        assert strip_logprobs(obj) is obj
    assert "Failed to deepcopy object in strip_logprobs: too deep" in caplog.text


def test_trajectory_log_round_trips_messages_choices_tools_and_group_fields(tmp_path: Path) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{}"}}
    choice = {"finish_reason": "stop", "index": 0, "message": {"role": "assistant", "content": "Hi 你好"}}
    trajectory = art.Trajectory(
        messages_and_choices=[
            {"role": "user", "content": "find"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "content": "found", "tool_call_id": "c1"},
            choice,
        ],
        tools=[{"type": "function", "function": {"name": "search"}}],
        reward=0.5,
        metrics={"turns": 2},
        metadata={"scenario": "s1"},
        logs=["note"],
    )
    groups = [
        art.TrajectoryGroup(
            [trajectory, ValueError("dropped")], metadata={"g": 1}, metrics={"m": 0.5}, logs=["gl"]
        ),
        art.TrajectoryGroup([art.Trajectory(reward=1.0)]),
    ]
    path = tmp_path / "log.parquet"
    write_trajectory_groups_parquet(groups, path)
    first, second = read_trajectory_groups_parquet(path)
    back = first.trajectories[0]
    assert back.messages() == [
        {"role": "user", "content": "find"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "found", "tool_call_id": "c1"},
        {"role": "assistant", "content": "Hi 你好"},  # a choice comes back as its message
    ]
    assert (back.reward, back.metrics, back.metadata, back.logs, back.tools) == (
        0.5, {"turns": 2}, {"scenario": "s1"}, ["note"], trajectory.tools
    )  # fmt: skip
    assert (first.metadata, first.metrics, first.logs, first.exceptions) == ({"g": 1}, {"m": 0.5}, ["gl"], [])
    assert second.trajectories[0].reward == 1.0
    write_trajectory_groups_parquet([], tmp_path / "empty.parquet")
    assert read_trajectory_groups_parquet(tmp_path / "empty.parquet") == []


def test_a_litellm_choice_becomes_an_openai_choice() -> None:
    litellm_like = SimpleNamespace(
        finish_reason="tool_calls",
        index=0,
        message=SimpleNamespace(
            role="assistant",
            content=None,
            tool_calls=[
                SimpleNamespace(
                    id="c1", type="function", function=SimpleNamespace(name="play", arguments='{"m": 1}')
                )
            ],
        ),
        logprobs={"content": [{"token": "a", "bytes": [97], "logprob": -0.1, "top_logprobs": []}]},
    )
    choice = convert_litellm_choice_to_openai(litellm_like)
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls is not None
    assert choice.message.tool_calls[0].function.name == "play"  # type: ignore[union-attr]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    assert choice.logprobs.content[0].logprob == -0.1
    with pytest.raises(TypeError, match="only a non-streaming litellm choice"):
        convert_litellm_choice_to_openai(SimpleNamespace(delta={"content": "x"}, index=0, finish_reason=None))


def test_jsonl_logs_round_trip_and_migrate_to_parquet(tmp_path: Path) -> None:
    from openai.types.chat.chat_completion import Choice as OpenAIChoice

    from dgrpo.utils.trajectory_migration import (
        deserialize_trajectory_groups,
        migrate_jsonl_to_parquet,
        migrate_model_dir,
        serialize_trajectory_groups,
    )

    sampled = OpenAIChoice.model_validate(
        {
            "finish_reason": "stop",
            "index": 0,
            "message": {"role": "assistant", "content": "4"},
            "logprobs": {"content": [{"token": "4", "logprob": -0.1, "bytes": [52], "top_logprobs": []}]},
        }
    )
    group = art.TrajectoryGroup(
        [
            art.Trajectory(
                messages_and_choices=[{"role": "user", "content": "2+2?"}, sampled], reward=1.0, logs=["x"]
            )
        ]
    )
    text = serialize_trajectory_groups([group, art.TrajectoryGroup([])])
    assert "logprob" not in text  # the log leaves logprobs out
    back = deserialize_trajectory_groups(text)
    assert [len(g.trajectories) for g in back] == [1, 0]
    assert back[0].trajectories[0].messages()[1]["content"] == "4" and back[0].trajectories[0].logs == ["x"]

    log_dir = tmp_path / "model" / "trajectories" / "train"
    log_dir.mkdir(parents=True)
    (log_dir / "0001.jsonl").write_text(text)
    (log_dir / "0002.jsonl").write_text("not json {")
    (log_dir / "notes.txt").write_text("skipped")
    result = migrate_model_dir(tmp_path / "model")
    assert (result.files_migrated, len(result.errors)) == (1, 1) and "0002.jsonl" in result.errors[0]
    assert not (log_dir / "0001.jsonl").exists() and (log_dir / "0002.jsonl").exists()
    assert read_trajectory_groups_parquet(log_dir / "0001.parquet")[0].trajectories[0].reward == 1.0
    assert migrate_jsonl_to_parquet(log_dir / "notes.txt").files_skipped == 1
    kept = migrate_jsonl_to_parquet(log_dir / "0002.jsonl", dry_run=True)
    assert kept.files_migrated == 1 and not (log_dir / "0002.parquet").exists()
    assert migrate_jsonl_to_parquet(log_dir / "0001.jsonl").errors  # already migrated: reported, not raised
