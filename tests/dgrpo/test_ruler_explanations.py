"""ART 0.5.23's RULER shows the judge the agent's tools and returns the judge's explanation of each score;
``ruler_score_group`` logs it on each trajectory. The judge is the scripted OpenAI-compatible server on
127.0.0.1 (tests/activities/openai_stub.py: its answers explain each score with "scripted"), the seam a real
judge fills in tests/activities/test_judge.py."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import openai
import pytest

import dgrpo as art
from dgrpo.rewards import ruler, ruler_score_group
from schemas.exchanges import ChatCompletionsExchange, TrajectoryExchanges
from tests.dgrpo.model_endpoints_stub import chat_completion
from tests.dgrpo.ruler_group import group

sys.path.insert(0, str(Path(__file__).parents[1] / "activities"))
from openai_stub import StubServer, openai_stub

JUDGE = "hosted_vllm/judge"
TOOLS = [{"type": "function", "function": {"name": "make_move", "parameters": {"type": "object"}}}]


@pytest.fixture
def stub() -> Iterator[StubServer]:
    with openai_stub() as server:
        yield server


def prompt(stub: StubServer, call: int = 0) -> str:
    return str(stub.requests[call]["messages"][-1]["content"])


async def test_ruler_returns_each_explanation_and_shows_the_judge_the_tools(stub: StubServer) -> None:
    lists = [t.messages() for t in group().trajectories]
    scores = await ruler(lists, JUDGE, {"api_base": stub.base_url}, tools=TOOLS)
    assert [(s.trajectory_id, s.score, s.explanation) for s in scores] == [
        ("1", 0.9, "scripted"),
        ("2", 0.1, "scripted"),
    ]
    tools_shown = prompt(stub).split("<available_tools>\n", 1)[1].split("\n</available_tools>", 1)[0]
    assert json.loads(tools_shown) == TOOLS

    stub.script.append('{"scores": [{"trajectory_id": "1", "explanation": "kept its word", "score": 0.8}, '
                       '{"trajectory_id": "2", "score": 0.3}]}')  # fmt: skip
    scores = await ruler(lists, JUDGE, {"api_base": stub.base_url})
    assert [s.explanation for s in scores] == ["kept its word", ""]
    assert "<available_tools>" not in prompt(stub, 1)


async def test_ruler_score_group_logs_each_explanation_and_shows_the_first_trajectorys_tools(
    stub: StubServer,
) -> None:
    given = group()
    given.trajectories[0].tools = TOOLS
    judged = await ruler_score_group(given, JUDGE, {"api_base": stub.base_url})
    assert judged is not None
    assert [t.logs for t in judged.trajectories] == [["RULER explanation: scripted"]] * 2
    assert [t.metrics["ruler_score"] for t in judged.trajectories] == [0.9, 0.1]
    assert '"name": "make_move"' in prompt(stub)
    assert all(t.logs == [] for t in given.trajectories)  # the caller's group is left as it was
    assert isinstance(judged, art.TrajectoryGroup)


def captured(answer: str) -> art.Trajectory:
    """A trajectory as ART 0.5.23's ``with art.trajectory():`` records it: one Chat Completions exchange whose
    request offered ``TOOLS`` (a captured trajectory holds no ``tools`` of its own)."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    exchange = ChatCompletionsExchange(
        request={"model": "agent", "messages": [{"role": "user", "content": "2+2?"}], "tools": TOOLS},
        response=openai.types.chat.ChatCompletion.model_validate(chat_completion("agent", answer)),
        start_time=start,
        end_time=start + timedelta(seconds=1),
    )
    return art.Trajectory(exchanges=TrajectoryExchanges(chat_completions=[exchange]))


async def test_the_judge_sees_the_tools_a_captured_trajectorys_requests_offered(stub: StubServer) -> None:
    judged = await ruler_score_group(
        art.TrajectoryGroup([captured("4, correct"), captured("5")]), JUDGE, {"api_base": stub.base_url}
    )
    assert judged is not None and [t.reward for t in judged.trajectories] == [0.9, 0.1]
    assert '"name": "make_move"' in prompt(stub)
