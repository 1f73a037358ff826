"""ART 0.5.23's capture: ``art.trajectory(...)``, ``art.trajectory_group(...)``, ``art.current_trajectory`` and
``art.no_capture`` record each call a rollout begins into its own trajectory as an exchange, over httpx, httpx2
(openai's clients), aiohttp and requests, for the four endpoints, plain or streamed; and such a trajectory
trains as the policy's conversation (dgrpo/capture/exchange_training.py). The endpoint is a local stub
(tests/dgrpo/model_endpoints_stub.py); the 0.5.23-style program that trains on the real stack is
tests/examples/test_art_0523_program.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import anthropic
import httpx
import openai
import pytest
import pytest_asyncio
import requests
from pydantic import ValidationError

import dgrpo as art
from dgrpo.capture.exchange_training import PolicyNames, trainable_groups
from dgrpo.errors import NoTrainableChoiceError
from schemas.exchanges import ChatCompletionsExchange, TrajectoryExchanges
from tests.dgrpo.model_endpoints_stub import chat_completion, response, serve

USER = {"role": "user", "content": "Say hi."}


@pytest_asyncio.fixture
async def endpoint() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    async for served in serve():
        yield served


async def chat(base_url: str, model: str = "agent", **kwargs: Any) -> str:
    client = openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0)
    reply = await client.chat.completions.create(model=model, messages=[USER], **kwargs)
    if kwargs.get("stream"):
        return "".join([c.choices[0].delta.content or "" async for c in reply if c.choices])
    return reply.choices[0].message.content or ""


# ---- scopes ------------------------------------------------------------------------------------------
async def test_scopes_nest_are_task_local_and_name_the_innermost() -> None:
    with pytest.raises(RuntimeError, match="no trajectory is capturing"):
        art.current_trajectory(require=True)
    assert art.current_trajectory() is None
    seen: list[Any] = []

    async def rollout(tag: str) -> None:
        await asyncio.sleep(0.01 if tag == "a" else 0)
        seen.append((tag, art.current_trajectory(require=True)))
        art.current_trajectory(require=True).reward = 1.0 if tag == "a" else 2.0

    first, second = await asyncio.gather(art.trajectory(rollout("a")), art.trajectory(rollout("b")))
    assert dict(seen) == {"a": first, "b": second} and (first.reward, second.reward) == (1.0, 2.0)
    assert "duration" in first.metrics  # finished on leaving its scope
    with art.Trajectory() as outer:
        inner = await art.trajectory(rollout("b"))
        assert art.current_trajectory() is outer and inner is not outer
    with pytest.raises(TypeError, match="coroutine object"):
        await art.trajectory(asyncio.ensure_future(rollout("a")))  # type: ignore[arg-type]


def test_scopes_must_exit_in_the_order_they_were_entered() -> None:
    first, second = art.Trajectory(), art.Trajectory()
    first.__enter__()
    second.__enter__()
    with pytest.raises(RuntimeError, match="must exit in the order"):
        first.__exit__(None, None, None)
    second.__exit__(None, None, None)
    first.__exit__(None, None, None)
    assert art.current_trajectory() is None


async def test_the_innermost_scope_records_and_no_capture_hides_the_enclosing_ones(endpoint: Any) -> None:
    base_url, _ = endpoint
    with art.Trajectory() as outer:
        await chat(base_url)
        nested = await art.trajectory(chat(base_url))  # the innermost scope records it, only it
        with art.no_capture():
            assert art.current_trajectory() is None
            await chat(base_url)
            inner = await art.trajectory(chat(base_url))
        await chat(base_url)

    def replies(trajectory: art.Trajectory) -> list[str | None]:
        return [e.response.choices[0].message.content for e in trajectory.exchanges.chat_completions]

    assert (replies(outer), replies(nested), replies(inner)) == (
        ["reply 1", "reply 5"],
        ["reply 2"],
        ["reply 4"],
    )


# ---- trajectory_group ----------------------------------------------------------------------------------
async def test_a_group_keeps_order_runs_a_shared_rollout_once_and_records_or_raises_errors() -> None:
    runs: list[str] = []

    async def rollout(tag: str, fail: bool = False) -> art.Trajectory:
        runs.append(tag)
        await asyncio.sleep(0.02 if tag == "slow" else 0)
        if fail:
            raise ValueError(f"{tag} failed")
        return art.Trajectory(reward=float(len(tag)))

    given = art.Trajectory(reward=9.0)
    shared = rollout("ab")
    group = await art.trajectory_group(
        [rollout("slow"), shared, given, shared, rollout("x", fail=True)],
        exceptions=[KeyError("given")],
        metadata={"scenario": 1},
        return_exceptions=True,
    )
    assert [t.reward for t in group.trajectories] == [4.0, 2.0, 9.0, 2.0]
    assert sorted(runs) == ["ab", "slow", "x"]  # the shared coroutine ran once
    assert [e.type for e in group.exceptions] == ["ValueError", "KeyError"]  # the rollouts' first
    assert group.metadata == {"scenario": 1}

    cancelled = asyncio.Event()

    async def never_finishes() -> art.Trajectory:
        try:
            await asyncio.sleep(60)
        finally:
            cancelled.set()
        raise AssertionError("unreachable")

    with pytest.raises(ValueError, match="x failed"):
        await art.trajectory_group([never_finishes(), rollout("x", fail=True)])
    assert cancelled.is_set()


async def test_gathered_groups_of_captured_rollouts(endpoint: Any) -> None:
    base_url, _ = endpoint

    async def rollout(scenario: int) -> None:
        await chat(base_url)
        art.current_trajectory(require=True).reward = scenario

    groups = await art.gather_trajectory_groups(
        art.trajectory_group([art.trajectory(rollout(s)) for _ in range(2)]) for s in (1, 2)
    )
    assert [[t.reward for t in g] for g in groups] == [[1, 1], [2, 2]]
    assert all(
        len(t.exchanges.chat_completions) == 1 and not t.messages_and_choices for g in groups for t in g
    )


# ---- transports -----------------------------------------------------------------------------------
async def test_chat_completions_over_openai_httpx_aiohttp_and_requests(endpoint: Any) -> None:
    base_url, received = endpoint
    url = f"{base_url}/chat/completions"
    body = {"model": "agent", "messages": [USER]}

    async def rollout() -> None:
        await chat(base_url)  # openai >= 3: httpx2
        await chat(base_url, stream=True)
        async with httpx.AsyncClient() as client:  # httpx itself
            (await client.post(url, json=body)).raise_for_status()
        async with aiohttp.ClientSession() as session, session.post(url, json=body) as reply:
            await reply.json()
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, json={**body, "stream": True}) as reply,
        ):
            async for _ in reply.content.iter_any():
                pass
        await asyncio.to_thread(lambda: requests.post(url, json=body, timeout=30).raise_for_status())
        with pytest.raises(openai.InternalServerError):
            await chat(base_url, user="fail")  # not 2xx: no exchange

    started = datetime.now(UTC)
    captured = await art.trajectory(rollout())
    calls = captured.exchanges.chat_completions
    assert [e.response.choices[0].message.content for e in calls] == [f"reply {n}" for n in range(1, 7)]
    assert len(received) == 7
    assert [e.request.get("stream", False) for e in calls] == [False, True, False, False, True, False]
    assert all(e.model == "agent" and e.request["messages"] == [USER] for e in calls)
    assert all(started <= e.start_time <= e.end_time <= datetime.now(UTC) for e in calls)
    streamed = calls[1].response.choices[0]
    assert (streamed.model_extra or {})["token_ids"] == [7, 8] and streamed.finish_reason == "stop"
    assert calls[1].response.usage is not None and calls[1].response.usage.total_tokens == 5


async def test_a_stream_read_only_in_part_is_not_an_exchange(endpoint: Any) -> None:
    base_url, _ = endpoint

    async def rollout() -> None:
        client = openai.AsyncOpenAI(base_url=base_url, api_key="x")
        stream = await client.chat.completions.create(model="agent", messages=[USER], stream=True)
        async for _ in stream:
            break
        await stream.close()

    assert not (await art.trajectory(rollout())).exchanges


async def test_completions_responses_and_messages_plain_and_streamed(endpoint: Any) -> None:
    base_url, _ = endpoint
    openai_client = openai.AsyncOpenAI(base_url=base_url, api_key="x")
    claude = anthropic.AsyncAnthropic(base_url=base_url.removesuffix("/v1"), api_key="x")

    async def rollout() -> None:
        for stream in (False, True):
            reply = await openai_client.completions.create(model="agent", prompt="Hi", stream=stream)
            if stream:
                async for _ in reply:  # type: ignore[union-attr]
                    pass
            answer = await openai_client.responses.create(model="agent", input="Hi", stream=stream)
            if stream:
                async for _ in answer:  # type: ignore[union-attr]
                    pass
            said = await claude.messages.create(
                model="claude",
                max_tokens=5,
                messages=[USER],
                stream=stream,  # type: ignore[call-overload]
            )
            if stream:
                async for _ in said:
                    pass

    exchanges = (await art.trajectory(rollout())).exchanges
    assert [e.response.choices[0].text for e in exchanges.completions] == ["reply 1", "reply 4"]
    assert [e.response.output_text for e in exchanges.responses] == ["reply 2", "reply 5"]
    assert [e.response.content[0].text for e in exchanges.messages] == ["reply 3", "reply 6"]
    assert {e.model for e in exchanges.messages} == {"claude"} and not exchanges.chat_completions


async def test_an_exchange_is_not_added_to_a_trajectory_holding_messages(endpoint: Any) -> None:
    base_url, _ = endpoint
    with art.Trajectory(messages_and_choices=[USER]) as legacy:
        await chat(base_url)
    assert not legacy.exchanges and legacy.messages_and_choices == [USER]
    # and 0.5.18's capture, nested in a 0.5.23 scope, records messages and choices as before
    with art.Trajectory() as outer:
        inner = await art.capture_auto_trajectory(chat(base_url))
    assert [m["content"] for m in inner.messages()] == ["Say hi.", "reply 2"] and not outer.exchanges


# ---- the exchange-based Trajectory -------------------------------------------------------------------
def exchange(model: str, text: str, at: int, messages: list[Any] | None = None) -> ChatCompletionsExchange:
    start = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=at)
    return ChatCompletionsExchange(
        request={"model": model, "messages": messages or [USER]},
        response=openai.types.chat.ChatCompletion.model_validate(chat_completion(model, text)),
        start_time=start,
        end_time=start + timedelta(seconds=1),
    )


def captured(*exchanges: ChatCompletionsExchange, reward: float = 0.0) -> art.Trajectory:
    return art.Trajectory(exchanges=TrajectoryExchanges(chat_completions=list(exchanges)), reward=reward)


def test_exchanges_and_messages_are_never_both_held() -> None:
    with pytest.raises(ValidationError, match="either captured exchanges or messages_and_choices"):
        art.Trajectory(exchanges=TrajectoryExchanges(chat_completions=[exchange("a", "x", 0)]), tools=[])
    assert "exchanges" not in art.Trajectory(messages_and_choices=[USER]).model_dump()  # stored as before


def test_model_copy_keeps_the_exchanges_of_the_models_selected() -> None:
    trajectory = captured(exchange("agent@1", "a", 0), exchange("agent-b", "b", 1), exchange("judge", "j", 2))

    def models(copy: art.Trajectory) -> list[str | None]:
        return [e.model for e in copy.exchanges.chat_completions]

    assert models(trajectory.model_copy(include_models="agent*")) == ["agent@1", "agent-b"]
    assert models(trajectory.model_copy(include_models="agent*", exclude_models=["agent-b"])) == ["agent@1"]
    assert models(trajectory.model_copy(include_models=[])) == []
    assert models(trajectory.model_copy(exclude_models="judge")) == ["agent@1", "agent-b"]
    # an exact captured name is taken as a name, not a pattern; update wins unfiltered
    odd = captured(exchange("a[1]", "x", 0), exchange("a1", "y", 1))
    assert models(odd.model_copy(include_models="a[1]")) == ["a[1]"]
    assert models(trajectory.model_copy(include_models="none", update={"reward": 3.0})) == []
    copy = trajectory.model_copy(include_models="judge")
    copy.exchanges.chat_completions.clear()
    assert len(trajectory.exchanges.chat_completions) == 3  # fresh lists


def test_a_captured_conversation_reads_as_messages() -> None:
    second_turn = [USER, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "Again."}]
    trajectory = captured(exchange("agent", "hi", 0), exchange("agent", "hi again", 1, second_turn))
    assert [m["content"] for m in trajectory.messages()] == ["Say hi.", "hi", "Again.", "hi again"]
    with pytest.raises(ValueError, match="not one Chat Completions conversation"):
        captured(exchange("agent", "a", 0), exchange("agent", "b", 1)).messages()


# ---- as dgrpo trains it --------------------------------------------------------------------------------
POLICY = PolicyNames(alias="agent", served="smollm2-base", prefixes=("agent", "proj-agent"))


def test_the_policys_calls_become_messages_and_choices_with_token_ids() -> None:
    second_turn = [USER, {"role": "assistant", "content": "mine"}, {"role": "user", "content": "More."}]
    trajectory = captured(
        exchange("opponent", "theirs", 0),
        exchange("agent", "mine", 1),
        exchange("proj-agent@3", "more", 2, second_turn),
        reward=0.5,
    )
    [group] = trainable_groups([art.TrajectoryGroup([trajectory])], POLICY)
    [trained] = group.trajectories
    assert not trained.exchanges and trained.reward == 0.5
    assert [m["content"] for m in trained.messages()] == ["Say hi.", "mine", "More.", "more"]
    assert [c.token_ids for c in trained.choices()] == [[7, 8], [7, 8]]
    assert [c.prompt_token_ids for c in trained.choices()] == [[1, 2, 3], [1, 2, 3]]
    assert len(trajectory.exchanges.chat_completions) == 3 and not trajectory.messages_and_choices  # a copy


def test_the_served_base_name_is_the_policy_only_where_nothing_names_it_otherwise() -> None:
    base_only = captured(exchange("smollm2-base", "b", 0))
    [[trained]] = [g.trajectories for g in trainable_groups([art.TrajectoryGroup([base_only])], POLICY)]
    assert [c.message["content"] for c in trained.choices()] == ["b"]
    both = captured(exchange("smollm2-base", "opponent", 0), exchange("agent", "policy", 1))
    [[trained]] = [g.trajectories for g in trainable_groups([art.TrajectoryGroup([both])], POLICY)]
    assert [c.message["content"] for c in trained.choices()] == ["policy"]


def test_calls_that_cannot_train_are_refused_saying_why() -> None:
    with pytest.raises(
        NoTrainableChoiceError, match=r"calls to \['judge'\] but none to the policy.*model='agent'"
    ):
        trainable_groups([art.TrajectoryGroup([captured(exchange("judge", "j", 0))])], POLICY)
    other = art.Trajectory(
        exchanges=TrajectoryExchanges(
            responses=[
                {
                    "request": {"model": "agent", "input": "Hi"},
                    "response": openai.types.responses.Response.model_validate(response("agent", "x")),
                    "start_time": datetime.now(UTC),
                    "end_time": datetime.now(UTC),
                }
            ]
        )
    )
    with pytest.raises(NoTrainableChoiceError, match="through the responses endpoint"):
        trainable_groups([art.TrajectoryGroup([other])], POLICY)
