"""Trajectory and TrajectoryGroup as ART programs use them: openai Choices appended mid-rollout, len/iter."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from openai.types.chat.chat_completion import ChatCompletion

from schemas.trajectory import Choice, History, Trajectory, TrajectoryGroup


def completion(content: str, token_ids: list[int]) -> ChatCompletion:
    """What the openai SDK returns from our server: vLLM's token ids ride along as extras."""
    return ChatCompletion.model_validate(
        {
            "id": "c",
            "object": "chat.completion",
            "created": 0,
            "model": "policy",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": content},
                    "logprobs": {"content": [{"token": content, "logprob": -0.5, "top_logprobs": []}]},
                    "token_ids": token_ids,
                }
            ],
            "prompt_token_ids": [1, 2],
        }
    )


def two_turns() -> Trajectory:
    traj = Trajectory(messages_and_choices=[{"role": "user", "content": "2+2?"}], reward=0)
    traj.messages_and_choices.append(completion("4", [7]).choices[0])
    traj.messages_and_choices.append({"role": "user", "content": "and 3+3?"})
    traj.messages_and_choices.append(completion("6", [9]).choices[0])
    return traj


def test_an_openai_choice_appended_after_construction_is_a_trainable_choice() -> None:
    traj = two_turns()
    assert [(c.message["content"], c.token_ids) for c in traj.choices()] == [("4", [7]), ("6", [9])]
    assert traj.messages() == [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "and 3+3?"},
        {"role": "assistant", "content": "6"},
    ]
    # What the store writes and reads back: the appended choices survive as choices.
    back = Trajectory.model_validate_json(traj.model_dump_json())
    assert [c.token_ids for c in back.choices()] == [[7], [9]]
    assert all(isinstance(item, dict | Choice) for item in back.messages_and_choices)


def test_an_appended_message_model_is_context_and_junk_is_refused() -> None:
    traj = Trajectory(messages_and_choices=[{"role": "user", "content": "hi"}])
    traj.messages_and_choices.append(completion("hello", [3]).choices[0].message)
    assert traj.choices() == []
    assert traj.messages()[1] == {"role": "assistant", "content": "hello"}
    traj.messages_and_choices.append("free text")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"holds a str; append chat messages as dicts"):
        traj.messages()


def test_for_logging_marks_the_trainable_turns() -> None:
    logged = two_turns().for_logging()
    assert [m["trainable"] for m in logged["messages"]] == [False, True, False, True]
    assert logged["messages"][1]["content"] == "4"


async def test_finish_track_duration_and_log() -> None:
    traj = Trajectory()
    async with traj.track_duration("tool"):
        await asyncio.sleep(0.01)
    async with traj.track_duration("tool"):
        await asyncio.sleep(0.01)
    traj.log("called the tool twice")
    assert traj.finish() is traj
    assert traj.metrics["tool_duration"] >= 0.02
    assert traj.metrics["duration"] >= traj.metrics["tool_duration"]
    assert traj.logs == ["called the tool twice"]
    assert "start_time" not in traj.model_dump()


def test_additional_histories_round_trip() -> None:
    history = History(messages_and_choices=[{"role": "user", "content": "summarise"}])
    history.messages_and_choices.append(completion("short", [4]).choices[0])
    traj = Trajectory(additional_histories=[history])
    back = Trajectory.model_validate_json(traj.model_dump_json())
    assert back.additional_histories[0].messages()[-1] == {"role": "assistant", "content": "short"}
    assert back.additional_histories[0].choices()[0].token_ids == [4]


def test_a_tool_call_sent_back_with_its_arguments_reserialized_continues_the_conversation() -> None:
    def tool_call(arguments: str) -> dict[str, Any]:
        return {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": arguments}}

    def called(arguments: str) -> Choice:
        message = {"role": "assistant", "content": None, "tool_calls": [tool_call(arguments)]}
        return Choice(finish_reason="tool_calls", message=message, token_ids=[7])

    asked = {"role": "user", "content": "What is a cat?"}
    answered = {"role": "tool", "content": "cat: a word", "tool_call_id": "call_1"}
    traj = Trajectory()
    traj.add_turn([asked], None, called('{"word":"cat"}'))  # as the model wrote it
    # LangChain (art.langgraph) sends the call back as json.dumps of the arguments it parsed: other spacing
    sent_back = {"role": "assistant", "content": None, "tool_calls": [tool_call('{"word": "cat"}')]}
    traj.add_turn([asked, sent_back, answered], None, called('{"word":"dog"}'))
    assert traj.additional_histories == []
    assert [m["role"] for m in traj.messages()] == ["user", "assistant", "tool", "assistant"]
    # other arguments are another conversation
    other = {"role": "assistant", "content": None, "tool_calls": [tool_call('{"word": "cow"}')]}
    traj.add_turn([asked, other, answered], None, called("{}"))
    assert len(traj.additional_histories) == 1


async def test_group_len_and_iteration_are_over_finished_trajectories() -> None:
    async def rollout(reward: float) -> Trajectory:
        if reward < 0:
            raise ValueError("boom")
        return Trajectory(reward=reward)

    group = TrajectoryGroup(rollout(r) for r in (1.0, 2.0, -1.0))
    assert len(group) == 0 and group.pending == 3
    await group
    assert len(group) == 2
    assert sorted(t.reward for t in group) == [1.0, 2.0]
    assert len(group.exceptions) == 1
    assert [e.type for e in TrajectoryGroup([], exceptions=[KeyError("k")]).exceptions] == ["KeyError"]
    group.log("one rollout raised")
    group.metrics["judge_calls"] = 1
    data: dict[str, Any] = group.model_dump()
    assert data["logs"] == ["one rollout raised"] and data["metrics"] == {"judge_calls": 1}


def test_sdk_objects_given_to_the_constructor_stay_as_given_and_junk_is_refused() -> None:
    sampled = completion("4", [7]).choices[0]
    traj = Trajectory(messages_and_choices=[{"role": "user", "content": "2+2?"}, sampled])
    assert traj.messages_and_choices[1] is sampled  # ART code reads choice.message.content
    assert traj.choices()[0].token_ids == [7]
    with pytest.raises(ValueError, match="role"):
        Trajectory(messages_and_choices=[{"content": "no role"}])
    with pytest.raises(ValueError, match="role"):
        Trajectory.model_validate_json('{"messages_and_choices": [{"content": "no role"}]}')


def test_an_unknown_keyword_is_dropped_with_a_warning_as_art_drops_it_but_stored_rows_stay_strict() -> None:
    with pytest.warns(UserWarning, match="ignores keyword argument\\(s\\) 'scenario'.*metadata="):
        made = Trajectory(
            messages_and_choices=[{"role": "user", "content": "hi"}], reward=0.5, scenario={"id": 3}
        )
    assert made.reward == 0.5 and "scenario" not in made.model_dump()
    with pytest.raises(ValueError, match="reward"), pytest.warns(UserWarning, match="'scenario'"):
        Trajectory(reward="high", scenario=1)  # the fields it knows are still validated
    row = {**made.model_dump(mode="json"), "scenario": {"id": 3}}
    with pytest.raises(ValueError, match="scenario"):
        Trajectory.model_validate(row)  # what is read from storage or a workflow is checked, not trimmed
    with pytest.raises(ValueError, match="scenario"):
        TrajectoryGroup.model_validate({"trajectories": [row]})
