"""ART 0.5's trajectory capture on a real CPU server: ``capture_auto_trajectory`` records exactly the rollout's
own chat completions (in order, with logprobs and token ids; concurrent and nested rollouts apart; nothing
outside), ``yield_trajectory`` hands a built trajectory over, and rollouts written that way train a step."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import openai
import pytest

import dgrpo as art
from dgrpo.local import LocalBackend
from schemas.trajectory import Choice

SERVED_MODEL = "smollm2-135m-instruct"
TOOLS = [
    {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}
]


@pytest.fixture(scope="module")
def server_url(held_backend: Path) -> str:
    """The CPU server of the session's LocalBackend (tests/conftest.py), serving the base model."""
    return LocalBackend(path=held_backend).inference_url()


@pytest.fixture
def model(server_url: str) -> art.Model:
    return art.Model(
        name="agent", project="capture", inference_base_url=server_url, inference_model_name=SERVED_MODEL
    )


async def ask(model: art.Model, messages: list[Any], **kwargs: Any) -> Any:
    completion = await model.openai_client().chat.completions.create(
        model=model.name, messages=messages, max_tokens=5, temperature=1.0, seed=len(str(messages)), **kwargs
    )
    return completion.choices[0]


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def sampled(choice: Any) -> Choice:
    """A returned openai choice as dgrpo trains on it (token ids lifted)."""
    return Choice.model_validate(choice)


async def test_a_rollouts_calls_are_its_trajectory_in_order_with_logprobs_and_token_ids(
    model: art.Model,
) -> None:
    returned: list[Any] = []

    async def rollout() -> None:
        messages: list[Any] = [{"role": "system", "content": "Answer in one word."}, user("Name a colour.")]
        returned.append(await ask(model, messages))
        messages += [{"role": "assistant", "content": returned[0].message.content}, user("And another?")]
        returned.append(await ask(model, messages))
        art.auto_trajectory(required=True).reward = 0.5

    traj = await art.capture_auto_trajectory(rollout())

    assert traj.messages_and_choices[2] is not returned[0]  # recorded from the wire, not the caller's object
    assert [m["content"] for m in traj.messages() if m["role"] != "assistant"] == [
        "Answer in one word.", "Name a colour.", "And another?"
    ]  # fmt: skip
    assert [type(e) is dict for e in traj.messages_and_choices] == [True, True, False, True, False]
    assert traj.choices() == [sampled(c) for c in returned]
    for choice in traj.choices():
        assert choice.token_ids and choice.prompt_token_ids
        assert len(choice.sampled_logprobs() or []) == len(choice.token_ids)
    assert traj.additional_histories == [] and traj.tools is None
    assert traj.reward == 0.5 and traj.metrics["duration"] > 0


async def test_calls_that_do_not_continue_the_conversation_go_to_additional_histories(
    model: art.Model,
) -> None:
    async def rollout() -> None:
        chat: list[Any] = [user("Add 2 and 3.")]
        chat.append(sampled(await ask(model, chat, tools=TOOLS)).message)
        chat.append(user("Again."))
        chat.append(sampled(await ask(model, chat, tools=TOOLS)).message)
        await ask(model, [*chat, user("Once more.")])  # continues the messages, without tools: another one
        await ask(model, [user("Something else.")], tools=TOOLS)

    traj = await art.capture_auto_trajectory(rollout())

    assert [m["role"] for m in traj.messages()] == ["user", "assistant", "user", "assistant"]
    assert traj.tools == TOOLS
    no_tools, other = traj.additional_histories
    assert (no_tools.messages()[0], no_tools.tools, len(no_tools.choices())) == (
        user("Add 2 and 3."),
        None,
        1,
    )
    assert (other.messages()[0], other.tools, len(other.choices())) == (user("Something else."), TOOLS, 1)


async def test_concurrent_and_nested_rollouts_capture_only_their_own_calls(model: art.Model) -> None:
    async def single(word: str) -> None:
        choice = await ask(model, [user(f"Say {word}.")])
        await ask(model, [user(f"Say {word}."), sampled(choice).message, user(f"{word} again.")])

    async def outer() -> art.Trajectory:
        await ask(model, [user("Say outer.")])
        inner = await art.capture_auto_trajectory(single("inner"))
        assert art.auto_trajectory() is not inner and art.auto_trajectory() is not None
        return inner

    inner_holder: list[art.Trajectory] = []

    async def outer_rollout() -> None:
        inner_holder.append(await outer())

    trajs = await asyncio.gather(
        *(art.capture_auto_trajectory(single(w)) for w in ("red", "green", "blue")),
        art.capture_auto_trajectory(outer_rollout()),
    )
    for word, traj in zip(("red", "green", "blue"), trajs, strict=False):
        users = [m["content"] for m in traj.messages() if m["role"] == "user"]
        assert users == [f"Say {word}.", f"{word} again."] and len(traj.choices()) == 2
        assert traj.additional_histories == []
    outer_traj, (inner,) = trajs[3], inner_holder
    assert [m["content"] for m in outer_traj.messages()][:1] == ["Say outer."] and len(
        outer_traj.choices()
    ) == 1
    assert outer_traj.additional_histories == []
    assert [m["content"] for m in inner.messages() if m["role"] == "user"] == ["Say inner.", "inner again."]


async def test_calls_outside_a_capture_are_not_recorded(model: art.Model, server_url: str) -> None:
    assert art.auto_trajectory() is None
    with pytest.raises(RuntimeError, match="capture_auto_trajectory"):
        art.auto_trajectory(required=True)
    sync_client = openai.OpenAI(base_url=server_url, api_key="x")

    async def rollout() -> None:
        sync_client.chat.completions.create(model=SERVED_MODEL, messages=[user("Sync hi.")], max_tokens=3)
        await asyncio.to_thread(  # a thread started inside the rollout carries its context too
            sync_client.chat.completions.create,
            model=SERVED_MODEL,
            messages=[user("Thread hi.")],
            max_tokens=3,
        )

    await ask(model, [user("Before.")])
    task = asyncio.create_task(ask(model, [user("Beside.")]))  # a task created outside the capture
    traj = await art.capture_auto_trajectory(rollout())
    await task
    await ask(model, [user("After.")])

    conversations = [traj, *traj.additional_histories]
    assert [c.messages()[0]["content"] for c in conversations] == ["Sync hi.", "Thread hi."]
    assert all(len(c.choices()) == 1 for c in conversations)


async def test_a_streamed_completion_the_server_refuses_is_no_turn(model: art.Model) -> None:
    # dgrpo's CPU server does not stream; streamed calls a server answers: test_capture_stream.py.
    async def rollout() -> None:
        with pytest.raises(openai.BadRequestError, match="stream"):
            await model.openai_client().chat.completions.create(
                model=model.name, messages=[user("Hi.")], stream=True
            )

    traj = await art.capture_auto_trajectory(rollout())
    assert traj.messages_and_choices == [] and traj.additional_histories == []


async def test_yield_trajectory_hands_the_rollouts_own_trajectory_to_its_capture() -> None:
    async def rollout(reward: float, hand_over: bool = True) -> float:
        await asyncio.sleep(0.01 * reward)
        if hand_over:
            art.yield_trajectory(art.Trajectory(messages_and_choices=[user(str(reward))], reward=reward))
        return reward

    assert await rollout(9.0) == 9.0  # outside a capture, yielding changes nothing
    trajs = await asyncio.gather(*(art.capture_yielded_trajectory(rollout(r)) for r in (3.0, 1.0, 2.0)))
    assert [(t.reward, t.messages()) for t in trajs] == [(r, [user(str(r))]) for r in (3.0, 1.0, 2.0)]
    with pytest.raises(RuntimeError, match=r"without calling art\.yield_trajectory"):
        await art.capture_yielded_trajectory(rollout(1.0, hand_over=False))


# ---- an ART 0.5 program whose rollouts never build their Trajectory -----------------------------------
async def colour_rollout(model: art.TrainableModel, seed: int) -> str:
    client = model.openai_client()
    completion = await client.chat.completions.create(
        model=model.get_inference_name(),
        messages=[user("Name a colour in one word.")],
        max_tokens=6,
        temperature=1.0,
        seed=seed,
    )
    answer = completion.choices[0].message.content or ""
    if trajectory := art.auto_trajectory():
        trajectory.reward = -abs(len(answer) - 4) / 4  # any ranking that differs within a group
    return answer


@pytest.mark.slow
async def test_captured_rollouts_train_a_step(held_backend: Path) -> None:
    with LocalBackend(path=held_backend) as backend:  # the session's, reused
        model = art.TrainableModel(name="captured", project="capture", base_model=SERVED_MODEL)
        await model.register(backend)
        groups = await art.gather_trajectory_groups(
            art.TrajectoryGroup(
                art.capture_auto_trajectory(colour_rollout(model, 10 * g + i)) for i in range(3)
            )
            for g in range(2)
        )
        result = await backend.train(model, groups, learning_rate=2e-4)
        step = await model.get_step()

    for traj in (t for g in groups for t in g):
        assert [m["role"] for m in traj.messages()] == ["user", "assistant"]
        assert traj.choices()[0].token_ids
    assert (result.step, step, result.metrics["data/step_skipped"]) == (1, 1, 0.0)
    assert result.metrics["data/step_num_trajectories"] == 6
    assert result.metrics["loss/train"] == result.metrics["loss/train"]  # a number, not NaN
