"""The judge: lenient parsing, one re-ask, fallback, dedupe and cache — against a scripted OpenAI-compatible
server (the seam) and against the real CPU server with SmolLM2 as the judge."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator

import pytest
from openai import AsyncOpenAI
from openai_stub import MODEL, StubServer, openai_stub
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.judge import (
    JudgeActivities,
    JudgeEndpoints,
    Judgement,
    MalformedJudgement,
    parse_judgements,
    ruler_score_group,
)
from activities.object_store import ObjectStore
from activities.trajectory_store import download_groups, upload_groups, verified_bytes
from schemas import layout
from schemas.activities import JudgeInput
from schemas.config import JudgeConfig
from schemas.errors import CONFIG_ERROR
from schemas.settings import ENV_S3_SECRET_KEY
from schemas.trajectory import Trajectory, TrajectoryGroup

QUESTION = [{"role": "user", "content": "What is 2 + 2?"}]


def traj(answer: str, reward: float = 0.0) -> Trajectory:
    return Trajectory(
        messages_and_choices=[*QUESTION, {"role": "assistant", "content": answer}], reward=reward
    )


def group() -> TrajectoryGroup:
    # four trajectories, two distinct: the judge must see only two
    return TrajectoryGroup(
        [traj("4, correct", 0.3), traj("5", 0.2), traj("4, correct", 0.3), traj("5", 0.2)],
        metadata={"scenario_id": "q1"},
    )


@pytest.fixture
def stub() -> Iterator[StubServer]:
    with openai_stub() as server:
        yield server


@pytest.mark.parametrize(
    "reply",
    [
        '{"scores": [{"trajectory_id": "1", "score": 0.2}, {"trajectory_id": "2", "score": 0.9}]}',
        'Sure! ```json\n{"scores": [{"trajectory_id": "2", "score": 0.9}, {"trajectory_id": "1", "score": 0.2}]}\n```',
        "Here you go: [0.2, 0.9] hope that helps",
        '{"1": 0.2, "2": 0.9}',
        '{"scores": [{"trajectory_id": "trajectory 1", "score": "0.2"}, {"id": 2, "score": 0.9}]}',
    ],
)
def test_parse_judgements_reads_lenient_json(reply: str) -> None:
    assert [j.score for j in parse_judgements(reply, 2)] == [0.2, 0.9]


@pytest.mark.parametrize(
    ("reply", "scores"),
    [
        ("[0.2, 0.9]", [0.2, 0.9]),
        ("[2, 9]", [0.2, 0.9]),  # a 0-10 scale
        ("[20, 90]", [0.2, 0.9]),  # a 0-100 scale
        ('["2/10", "9/10"]', [0.2, 0.9]),  # fractions
        ('["20%", "90%"]', [0.2, 0.9]),  # percentages
        ("[0.5, 7]", [0.05, 0.7]),  # one scale for the whole reply: the order and ratios are the judge's
        ("[-1, 0.9]", [0.0, 0.9]),  # clamped
        ("[150, 90]", [1.0, 0.9]),  # beyond 100: read on 0-100, clamped
        (
            '{"scores": [{"trajectory_id": "2", "score": "9/10"}, {"trajectory_id": "1", "score": 7}]}',
            [0.7, 0.9],
        ),
    ],
)
def test_parse_judgements_brings_every_score_to_0_1(reply: str, scores: list[float]) -> None:
    assert [j.score for j in parse_judgements(reply, 2)] == pytest.approx(scores)


@pytest.mark.parametrize(
    ("reply", "problem"),
    [
        ("I think the first one is better.", "no JSON"),
        ('{"scores": [0.5]}', "Expected 2 scores, but got 1"),
        ('{"scores": [0.5, "NaN"]}', "finite number"),
        ('{"scores": [0.5, "8/0"]}', "must be a number"),
        (
            '{"scores": [{"trajectory_id": "1", "score": 0.5}, {"trajectory_id": "1", "score": 0.2}]}',
            "ids \\['1', '2'\\], but got \\['1', '1'\\]",
        ),
        ('{"scores": [0.5, true]}', "must be a number"),
    ],
)
def test_parse_judgements_says_what_is_malformed(reply: str, problem: str) -> None:
    with pytest.raises(MalformedJudgement, match=problem):
        parse_judgements(reply, 2)


@pytest.mark.parametrize(
    ("reply", "explanations"),
    [
        (
            '{"scores": [{"trajectory_id": "2", "explanation": "5 is wrong", "score": 0.1}, '
            '{"trajectory_id": "1", "explanation": "right", "score": 0.9}]}',
            ["right", "5 is wrong"],
        ),
        (
            '{"scores": [{"trajectory_id": "1", "score": 0.9}, {"trajectory_id": "2", "score": 0.1}]}',
            ["", ""],
        ),
        ("[0.9, 0.1]", ["", ""]),
    ],
)
def test_parse_judgements_keeps_each_explanation_with_its_score(reply: str, explanations: list[str]) -> None:
    assert parse_judgements(reply, 2) == [Judgement(0.9, explanations[0]), Judgement(0.1, explanations[1])]


TOOLS = [{"type": "function", "function": {"name": "add_numbers", "parameters": {"type": "object"}}}]


async def test_the_judge_sees_the_agents_tools_and_each_trajectory_logs_its_explanation(
    stub: StubServer,
) -> None:
    with_tools = TrajectoryGroup(
        [t.model_copy(update={"tools": TOOLS}) for t in group().trajectories], metadata={"scenario_id": "q1"}
    )
    judged = await ruler_score_group(with_tools, MODEL, base_url=stub.base_url)
    prompt = stub.requests[0]["messages"][1]["content"]
    assert "<available_tools>" in prompt and '"name": "add_numbers"' in prompt
    assert prompt.index("<available_tools>") < prompt.index("<trajectory id=")
    assert [t.logs for t in judged.trajectories] == [["RULER explanation: scripted"]] * 4
    assert all(t.logs == [] for t in with_tools.trajectories)  # the group given is left as it was

    await ruler_score_group(group(), MODEL, base_url=stub.base_url)
    assert "<available_tools>" not in stub.requests[1]["messages"][1]["content"]


async def test_ruler_scores_dedupes_identical_trajectories(stub: StubServer) -> None:
    judged = await ruler_score_group(group(), MODEL, base_url=stub.base_url)
    assert stub.calls == 1
    prompt = stub.requests[0]["messages"][1]["content"]
    assert prompt.count("<trajectory id=") == 2 and "What is 2 + 2?" in prompt
    assert [t.reward for t in judged.trajectories] == [0.9, 0.1, 0.9, 0.1]
    assert [t.metrics["original_reward"] for t in judged.trajectories] == [0.3, 0.2, 0.3, 0.2]
    assert not any(t.metrics["judge_fallback"] for t in judged.trajectories)
    assert judged.metadata == {"scenario_id": "q1"}


async def test_malformed_reply_gets_one_corrective_reask(stub: StubServer) -> None:
    stub.script = ["the first answer is better"]
    judged = await ruler_score_group(group(), MODEL, base_url=stub.base_url)
    assert stub.calls == 2
    reask = stub.requests[1]["messages"]
    assert reask[-2] == {"role": "assistant", "content": "the first answer is better"}
    assert "not valid: the reply contains no JSON" in reask[-1]["content"]
    assert [t.reward for t in judged.trajectories] == [0.9, 0.1, 0.9, 0.1]


async def test_twice_malformed_keeps_rollout_rewards_and_flags_fallback(stub: StubServer) -> None:
    stub.script = ["nonsense", '{"scores": [0.2]}']
    judged = await ruler_score_group(group(), MODEL, base_url=stub.base_url)
    assert stub.calls == 2
    assert [t.reward for t in judged.trajectories] == [0.3, 0.2, 0.3, 0.2]
    assert all(t.metrics["judge_fallback"] for t in judged.trajectories)


async def run_judge(store: ObjectStore, base_url: str, kind: str = "both", **judge: str) -> JudgeInput:
    ref = upload_groups(store, [group(), TrajectoryGroup([traj("4, correct", 1.0)])], "r1", 3)
    return JudgeInput(
        run_id="r1",
        step=3,
        trajectories=ref,
        judge=JudgeConfig(kind=kind, base_url=base_url, **judge),  # type: ignore[arg-type]
        base_model_name="unused",
    )


def allowing(store: ObjectStore, stub: StubServer) -> JudgeActivities:
    """A control worker whose operator allowed the stub as a judge endpoint."""
    return JudgeActivities(store, endpoints=JudgeEndpoints(base_urls=(stub.base_url,)))


async def test_judge_activity_scores_writes_scored_parquet_and_caches(
    object_store: ObjectStore, stub: StubServer
) -> None:
    input = await run_judge(object_store, stub.base_url)
    acts = allowing(object_store, stub)
    ref = await ActivityEnvironment().run(acts.judge, input)
    assert ref.ref.uri == object_store.uri(layout.scored_key("r1", 3))
    assert stub.calls == 1  # the one-trajectory group is not judged: nothing to compare
    groups = download_groups(object_store, ref.ref.uri)
    assert [t.reward for t in groups[0].trajectories] == [0.9, 0.1, 0.9, 0.1]
    assert groups[1].trajectories[0].reward == 1.0
    assert ref.reward_mean == pytest.approx((0.9 + 0.1 + 0.9 + 0.1 + 1.0) / 5)
    assert [t.logs for t in groups[0].trajectories] == [["RULER explanation: scripted"]] * 4
    assert len(object_store.list("runs/r1/judge_cache/")) == 1
    # a retried step reads the cache: no new judge call, same result, explanations included
    again = await ActivityEnvironment().run(allowing(object_store, stub).judge, input)
    assert stub.calls == 1
    assert again.ref.sha256 == ref.ref.sha256


async def test_a_judge_cache_entry_written_before_explanations_is_still_read(
    object_store: ObjectStore, stub: StubServer
) -> None:
    input = await run_judge(object_store, stub.base_url)
    await ActivityEnvironment().run(allowing(object_store, stub).judge, input)
    (key,) = object_store.list("runs/r1/judge_cache/")
    object_store.put_bytes(key, json.dumps({"scores": [0.7, 0.2]}).encode())  # the format before explanations
    object_store.delete_prefix(layout.scored_key("r1", 3))
    again = await ActivityEnvironment().run(allowing(object_store, stub).judge, input)
    assert stub.calls == 1  # read from the cache, not asked again
    judged = download_groups(object_store, again.ref.uri)[0].trajectories
    assert [t.reward for t in judged] == [0.7, 0.2, 0.7, 0.2]
    assert all(t.logs == [] for t in judged)  # no explanation was cached, none is made up


async def test_a_late_judge_attempt_never_changes_what_its_retry_recorded(
    object_store: ObjectStore, stub: StubServer
) -> None:
    """Attempt 1 outlives its heartbeat; attempt 2 scores the step and the workflow records its ref; then
    attempt 1 finishes with other scores (its cache entries gone, the judge answering otherwise). The
    recorded ref must still read back, byte for byte."""
    input = await run_judge(object_store, stub.base_url)
    retry = ActivityEnvironment()
    retry.info = dataclasses.replace(retry.info, attempt=2)
    recorded = await retry.run(allowing(object_store, stub).judge, input)
    assert recorded.ref.uri == object_store.uri(layout.scored_key("r1", 3, attempt=2))
    object_store.delete_prefix("runs/r1/judge_cache/")
    stub.script.append(
        '{"scores": [{"trajectory_id": "1", "score": 0.6}, {"trajectory_id": "2", "score": 0.4}]}'
    )
    late = await ActivityEnvironment().run(allowing(object_store, stub).judge, input)
    assert late.ref.sha256 != recorded.ref.sha256  # the late attempt scored otherwise
    verified_bytes(object_store, recorded.ref)  # still the object the workflow recorded, or this raises
    assert [t.reward for t in download_groups(object_store, recorded.ref.uri)[0].trajectories] == [
        0.9,
        0.1,
    ] * 2


async def test_judge_kind_rollout_keeps_the_rollout_rewards(
    object_store: ObjectStore, stub: StubServer
) -> None:
    input = await run_judge(object_store, stub.base_url, kind="rollout")
    ref = await ActivityEnvironment().run(JudgeActivities(object_store).judge, input)
    assert ref == input.trajectories and stub.calls == 0


async def test_a_hostile_judge_endpoint_never_gets_the_workers_secret(
    object_store: ObjectStore, stub: StubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run spec naming its own host and the S3 secret's variable: refused before any request is made."""
    monkeypatch.setenv(ENV_S3_SECRET_KEY, "the-s3-secret")
    input = await run_judge(object_store, stub.base_url, kind="ruler", api_key_env=ENV_S3_SECRET_KEY)
    for endpoints in (JudgeEndpoints(), JudgeEndpoints(base_urls=(stub.base_url,))):
        acts = JudgeActivities(object_store, "http://127.0.0.1:9/v1", endpoints)
        with pytest.raises(ApplicationError) as refused:
            await ActivityEnvironment().run(acts.judge, input)
        assert refused.value.type == CONFIG_ERROR and refused.value.non_retryable
        assert "--judge-base-url" in refused.value.message or "--judge-key-env" in refused.value.message
    assert stub.calls == 0  # the listener never heard from the worker, let alone its secret
    assert not object_store.exists(layout.scored_key("r1", 3))


async def test_smollm2_as_judge_never_crashes(cpu_server: str) -> None:
    """The real server: a 135M judge mostly writes malformed JSON; the re-ask and fallback handle it."""
    client = AsyncOpenAI(base_url=cpu_server, api_key="dgrpo")
    models = (await client.models.list()).data
    judged = await ruler_score_group(group(), models[0].id, client=client, max_tokens=64)
    await client.close()
    rewards = [t.reward for t in judged.trajectories]
    if judged.trajectories[0].metrics["judge_fallback"]:
        assert rewards == [0.3, 0.2, 0.3, 0.2]
    else:
        assert all(0.0 <= r <= 1.0 for r in rewards) and rewards[0] == rewards[2]
    json.dumps([t.model_dump() for t in judged.trajectories])
