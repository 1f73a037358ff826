"""ART's ``art.langgraph`` on a real CPU server: a LangGraph agent's rollout wrapped by ``wrap_rollout`` returns
its trajectory holding the chat completions its ``init_chat_model`` chat model made (messages in order, the
choices with logprobs and token ids, the tools offered), concurrent rollouts apart; the names and signatures
are ART's; without LangChain, ``init_chat_model`` says which ``pip install`` provides it."""

from __future__ import annotations

import asyncio
import inspect
import sys
from pathlib import Path
from typing import TypedDict

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph

import dgrpo as art
from dgrpo.langgraph import init_chat_model, wrap_rollout
from dgrpo.local import LocalBackend

SERVED_MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def model(held_backend: Path) -> art.Model:
    """A model on the CPU server of the session's LocalBackend (tests/conftest.py), serving the base model."""
    server_url = LocalBackend(path=held_backend).inference_url()
    return art.Model(
        name="lg-agent", project="langgraph", inference_base_url=server_url, inference_model_name=SERVED_MODEL
    )


class Chat(TypedDict):
    messages: list[BaseMessage]


@tool
def lookup(word: str) -> str:
    """Look a word up in the dictionary."""
    return f"{word}: a word"


async def two_turn_rollout(model: art.Model, seed: int) -> art.Trajectory:
    """A LangGraph graph of two nodes, each one call of the chat model: an answer, then a follow-up question."""
    chat_model = init_chat_model(model.name, max_tokens=4, seed=seed)

    async def answer(state: Chat) -> Chat:
        return {"messages": [*state["messages"], await chat_model.ainvoke(state["messages"])]}

    async def follow_up(state: Chat) -> Chat:
        messages = [*state["messages"], HumanMessage("And another?")]
        return {"messages": [*messages, await chat_model.ainvoke(messages)]}

    graph = StateGraph(Chat)
    graph.add_node("answer", answer)
    graph.add_node("follow_up", follow_up)
    graph.add_edge(START, "answer")
    graph.add_edge("answer", "follow_up")
    graph.add_edge("follow_up", END)
    final = await graph.compile().ainvoke(
        {"messages": [SystemMessage("Answer in one word."), HumanMessage(f"Name colour number {seed}.")]}
    )
    replies = [m.content for m in final["messages"] if isinstance(m, AIMessage)]
    return art.Trajectory(reward=seed, metadata={"replies": replies}, messages_and_choices=[])


async def test_a_wrapped_langgraph_rollout_records_its_chat_completions(model: art.Model) -> None:
    trajectories = await asyncio.gather(*(wrap_rollout(model, two_turn_rollout)(model, s) for s in (1, 2)))

    for seed, trajectory in zip((1, 2), trajectories, strict=True):
        assert trajectory.reward == seed  # the rollout's own trajectory, filled in
        assert [(m["role"], m["content"]) for m in trajectory.messages() if m["role"] != "assistant"] == [
            ("system", "Answer in one word."),
            ("user", f"Name colour number {seed}."),
            ("user", "And another?"),
        ]  # this rollout's calls only, though both ran at once
        assert [type(e) is dict for e in trajectory.messages_and_choices] == [True, True, False, True, False]
        choices = trajectory.choices()
        assert [c.message["content"] for c in choices] == trajectory.metadata["replies"]
        for choice in choices:
            assert choice.token_ids and choice.prompt_token_ids
            assert len(choice.sampled_logprobs() or []) == len(choice.token_ids) <= 4
        assert trajectory.additional_histories == [] and trajectory.tools is None


async def test_tools_bound_to_the_chat_model_are_the_trajectorys_tools(model: art.Model) -> None:
    async def rollout() -> art.Trajectory:
        chat_model = init_chat_model(max_tokens=3).bind_tools([lookup])
        await chat_model.ainvoke([HumanMessage("What is a cat? Use the dictionary.")])
        return art.Trajectory(messages_and_choices=[])

    trajectory = await wrap_rollout(model, rollout)()

    assert [m["role"] for m in trajectory.messages()] == ["user", "assistant"]
    assert trajectory.tools is not None
    assert [t["function"]["name"] for t in trajectory.tools] == ["lookup"]
    assert trajectory.tools[0]["function"]["parameters"]["properties"] == {"word": {"type": "string"}}
    assert trajectory.choices()[0].token_ids


async def test_a_synchronous_invoke_is_recorded_with_token_ids_too(model: art.Model) -> None:
    async def rollout() -> art.Trajectory:
        chat_model = init_chat_model(max_tokens=3)
        await asyncio.to_thread(chat_model.invoke, [HumanMessage("Say hi.")])  # LangChain's sync client
        return art.Trajectory(messages_and_choices=[])

    trajectory = await wrap_rollout(model, rollout)()

    [choice] = trajectory.choices()
    assert choice.token_ids and choice.prompt_token_ids
    assert len(choice.sampled_logprobs() or []) == len(choice.token_ids)


async def test_a_rollout_that_makes_no_call_or_returns_no_trajectory() -> None:
    untouched = art.Trajectory(reward=0.5, messages_and_choices=[{"role": "user", "content": "hi"}])

    async def quiet() -> art.Trajectory:
        return untouched

    async def no_trajectory() -> float:
        return 1.0

    assert await wrap_rollout(art.Model(name="m", project="p"), quiet)() is untouched
    assert untouched.messages() == [{"role": "user", "content": "hi"}]
    with pytest.raises(TypeError, match=r"returns its art\.Trajectory.*no_trajectory returned a float"):
        await wrap_rollout(art.Model(name="m", project="p"), no_trajectory)()  # type: ignore[arg-type]
    with pytest.raises(LookupError, match=r"inside a rollout wrapped by art\.langgraph\.wrap_rollout"):
        init_chat_model("m")


def test_the_names_and_signatures_are_arts() -> None:
    import dgrpo.langgraph

    assert sorted(dgrpo.langgraph.__all__) == [  # ART's names
        "init_chat_model",
        "wrap_rollout",
    ]
    assert [
        (p.name, p.kind.name, p.default) for p in inspect.signature(init_chat_model).parameters.values()
    ] == [
        ("model", "POSITIONAL_OR_KEYWORD", None),
        ("model_provider", "KEYWORD_ONLY", None),
        ("configurable_fields", "KEYWORD_ONLY", None),
        ("config_prefix", "KEYWORD_ONLY", None),
        ("invoke_timeout", "KEYWORD_ONLY", 600),
        ("kwargs", "VAR_KEYWORD", inspect.Parameter.empty),
    ]
    assert list(inspect.signature(wrap_rollout).parameters) == ["model", "fn"]
    with pytest.raises(ValueError, match="configurable_fields is not supported"):
        init_chat_model(configurable_fields=("model",))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"only OpenAI-compatible .* provider 'anthropic'"):
        init_chat_model("claude", model_provider="anthropic")


def test_without_langchain_init_chat_model_names_the_pip_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "langchain_openai", None)  # as if not installed: importing it raises
    monkeypatch.delitem(sys.modules, "dgrpo.langgraph.runnable", raising=False)

    with pytest.raises(
        ImportError, match=r"langchain_openai is missing.*pip install 'langchain-core>=0\.3\.51'"
    ):
        init_chat_model()
    assert wrap_rollout  # the capture itself needs no LangChain


async def colour_rollout(model: art.TrainableModel, seed: int) -> art.Trajectory:
    """ART's LangGraph pattern: the rollout builds its chat model with init_chat_model(model.name) and returns
    its scored trajectory; the reward ranks the answers by length, so a group's rewards differ."""
    chat_model = init_chat_model(model.name, max_tokens=6, seed=seed)
    reply = await chat_model.ainvoke([HumanMessage("Name a colour in one word.")])
    return art.Trajectory(reward=-abs(len(str(reply.content)) - 4) / 4, messages_and_choices=[])


@pytest.mark.slow
async def test_wrapped_langgraph_rollouts_train_two_steps(held_backend: Path) -> None:
    with LocalBackend(path=held_backend) as backend:  # the session's, reused
        model = art.TrainableModel(name="lg-trained", project="langgraph", base_model=SERVED_MODEL)
        await model.register(backend)
        rollout = wrap_rollout(model, colour_rollout)
        results = []
        for step in range(2):
            groups = await art.gather_trajectory_groups(
                art.TrajectoryGroup(rollout(model, 100 * step + 10 * g + i) for i in range(3))
                for g in range(2)
            )
            for trajectory in (t for g in groups for t in g):
                assert [m["role"] for m in trajectory.messages()] == ["user", "assistant"]
                assert trajectory.choices()[0].token_ids
            results.append(await backend.train(model, groups, learning_rate=2e-4))
        step = await model.get_step()

    assert [r.step for r in results] == [1, 2] and step == 2
    for result in results:
        assert result.metrics["data/step_skipped"] == 0.0
        assert result.metrics["data/step_num_trajectories"] == 6
