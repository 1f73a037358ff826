"""RULER's structural retries, as in ART 0.5.23: the prompt names the count and ids of the score objects, a
malformed answer goes back to the judge with a correction saying what was wrong, and once the answers allowed
(``_STRUCTURAL_ATTEMPTS``, 2) are spent a ``ValueError`` says what the last one got wrong. Each answer is
paid for. The judge is the scripted OpenAI-compatible server on 127.0.0.1 (tests/activities/openai_stub.py),
the seam a real judge fills in tests/activities/test_judge.py."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import dgrpo as art
from activities import judge
from dgrpo.metrics import MetricsBuilder
from dgrpo.rewards import JudgeFailed, ruler, ruler_score_group
from tests.dgrpo.ruler_group import group

sys.path.insert(0, str(Path(__file__).parents[1] / "activities"))
from openai_stub import USAGE, StubServer, openai_stub

ruler_module = importlib.import_module(
    "dgrpo.rewards.ruler"
)  # the module (dgrpo.rewards.ruler is the function)
PRICED = "openai/gpt-4.1"
PER_CALL = (USAGE["prompt_tokens"] * 2.0 + USAGE["completion_tokens"] * 8.0) / 1e6  # gpt-4.1's prices


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> Iterator[StubServer]:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with openai_stub() as server:
        yield server


def answer(*ids: str) -> str:
    """A well-formed JSON answer scoring the trajectories ``ids`` (whatever the group was)."""
    return json.dumps({"scores": [{"trajectory_id": i, "explanation": "-", "score": 0.5} for i in ids]})


async def judged_with_costs(stub: StubServer) -> tuple[art.TrajectoryGroup | None, dict[str, float]]:
    builder = MetricsBuilder(cost_context="train")
    token = builder.activate()
    try:
        judged = await ruler_score_group(group(), PRICED, {"api_base": stub.base_url})
    finally:
        token.var.reset(token)
    return judged, await builder.flush()


@pytest.mark.parametrize(
    ("first", "correction"),
    [
        (
            answer("1"),
            "had 1 score object; expected 2. Missing trajectory IDs: 2. Duplicate trajectory IDs: none",
        ),
        (answer("1", "2", "3"), "had 3 score objects; expected 2. Missing trajectory IDs: none. Duplicate"),
        (  # every id is there, one twice: dgrpo's parser once kept the last score and went on
            answer("1", "2", "2"),
            "Missing trajectory IDs: none. Duplicate trajectory IDs: 2. Unexpected trajectory IDs: none",
        ),
        (answer("1", "7"), "Duplicate trajectory IDs: none. Unexpected trajectory IDs: 7. Return one"),
    ],
    ids=["missing", "extra", "duplicate", "unexpected"],
)
async def test_a_structurally_wrong_answer_is_sent_back_corrected_and_the_second_scores_the_group(
    stub: StubServer, first: str, correction: str
) -> None:
    stub.script = [first]  # then the stub's well-formed answer: 0.9 for "correct", else 0.1
    judged, metrics = await judged_with_costs(stub)
    assert judged is not None and [t.reward for t in judged] == [0.9, 0.1]
    assert [t.metrics["independent_reward"] for t in judged] == [0.0, 1.0]
    asked, again = (r["messages"] for r in stub.requests)
    assert (
        "Return exactly 2 score objects" in asked[0]["content"] and "omissions: 1, 2" in asked[0]["content"]
    )
    assert again[:2] == asked
    assert again[2] == {"role": "assistant", "content": first}
    assert again[3]["role"] == "user" and correction in again[3]["content"]
    assert "using each trajectory ID exactly once: 1, 2." in again[3]["content"]
    assert metrics["costs/train/judge/ruler"] == pytest.approx(2 * PER_CALL)  # each answer is paid for


async def test_an_unparseable_answer_is_sent_back_too(stub: StubServer) -> None:
    stub.script = ["The first one is better."]
    scores = await ruler([t.messages() for t in group()], PRICED, {"api_base": stub.base_url})
    assert [s.score for s in scores] == [0.9, 0.1]
    correction = stub.requests[1]["messages"][3]["content"]
    assert "not valid: the reply contains no JSON" in correction and "ids 1, 2" in correction


async def test_scores_on_another_scale_are_brought_to_0_1_in_one_answer(stub: StubServer) -> None:
    scored = {
        "scores": [
            {"trajectory_id": "1", "explanation": "-", "score": "8/10"},
            {"trajectory_id": "2", "score": 3},
        ]
    }
    stub.script = [json.dumps(scored)]
    judged = await ruler_score_group(group(), PRICED, {"api_base": stub.base_url})
    assert judged is not None and [t.reward for t in judged] == pytest.approx([0.8, 0.3])
    assert stub.calls == 1  # read, not asked again
    stub.script = ['{"scores": [{"trajectory_id": "1", "score": 85}, {"trajectory_id": "2", "score": 120}]}']
    scores = await ruler([t.messages() for t in group()], PRICED, {"api_base": stub.base_url})
    assert [s.score for s in scores] == pytest.approx([0.85, 1.0])  # 0-100, clamped


async def test_a_judge_that_never_answers_well_raises_once_arts_attempts_are_spent(stub: StubServer) -> None:
    stub.reply = lambda body: answer("1")
    with pytest.raises(
        JudgeFailed, match=r"Expected 2 scores, but got 1 \(.*no valid judgement in 2 answers"
    ):
        await ruler_score_group(group(), PRICED, {"api_base": stub.base_url})
    assert stub.calls == 2  # ART's _STRUCTURAL_ATTEMPTS
    assert "Missing trajectory IDs: 2" in stub.requests[1]["messages"][3]["content"]
    with pytest.raises(ValueError, match=r"Expected trajectory ids \['1', '2'\], but got \['1', '1'\]"):
        stub.reply = lambda body: answer("1", "1")
        await ruler([t.messages() for t in group()], PRICED, {"api_base": stub.base_url})
    assert stub.calls == 4
    stub.reply = lambda body: "no idea"
    assert (
        await ruler_score_group(group(), PRICED, {"api_base": stub.base_url}, swallow_exceptions=True) is None
    )
    assert stub.calls == 6


async def test_a_good_first_answer_is_one_request(stub: StubServer) -> None:
    judged, metrics = await judged_with_costs(stub)
    assert judged is not None and [t.reward for t in judged] == [0.9, 0.1]
    assert stub.calls == 1 and len(stub.requests[0]["messages"]) == 2
    assert metrics["costs/train/judge/ruler"] == pytest.approx(PER_CALL)


async def test_the_number_of_answers_is_rulers_structural_attempts(
    stub: StubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ruler_module, "_STRUCTURAL_ATTEMPTS", 3)
    stub.script = [answer("1"), answer("2")]
    judged = await ruler_score_group(group(), PRICED, {"api_base": stub.base_url})
    assert judged is not None and [t.reward for t in judged] == [0.9, 0.1]
    assert stub.calls == 3 and len(stub.requests[2]["messages"]) == 6  # both faults and corrections, in order
    assert "Missing trajectory IDs: 1" in stub.requests[2]["messages"][5]["content"]


async def test_the_judge_activitys_parser_retries_the_same_way_and_falls_back(stub: StubServer) -> None:
    """The control worker's judge (activities/judge.py) shares the prompt, the checks and the corrections; when
    the answers are spent it keeps the rollout rewards (``judge_fallback``) instead of failing the run."""
    stub.script = [answer("2", "2")]
    judged = await judge.ruler_score_group(group(), "stub-judge", base_url=stub.base_url)
    assert [t.reward for t in judged] == [0.9, 0.1]
    assert "Duplicate trajectory IDs: 2" in stub.requests[1]["messages"][3]["content"]
    stub.reply = lambda body: answer("1")
    kept = await judge.ruler_score_group(group(), "stub-judge", base_url=stub.base_url)
    assert [t.reward for t in kept] == [0.0, 1.0] and all(t.metrics["judge_fallback"] for t in kept)
    assert stub.calls == 4
