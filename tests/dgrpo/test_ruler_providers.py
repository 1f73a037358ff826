"""RULER with a judge named as litellm names it (``openai/o4-mini``, ``hosted_vllm/...``, ``anthropic/...``)
reaches that provider through the environment variables litellm reads, as in ART; the provider here is the
scripted OpenAI-compatible stub on 127.0.0.1 (tests/activities/openai_stub.py), never the internet. A judge
that cannot be asked at all raises even with ``swallow_exceptions=True``: it would drop every group."""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dgrpo.rewards import JudgeUnreachable, ruler, ruler_score_group
from dgrpo.rewards.ruler import ANSWERED
from tests.dgrpo.ruler_group import group

sys.path.insert(0, str(Path(__file__).parents[1] / "activities"))
from openai_stub import StubServer, openai_stub

PROVIDER_VARIABLES = (
    "OPENAI_BASE_URL",
    "OPENAI_API_BASE",
    "OPENAI_API_KEY",
    "HOSTED_VLLM_API_BASE",
    "HOSTED_VLLM_API_KEY",
    "OPENROUTER_API_BASE",
    "OPENROUTER_API_KEY",
    "OR_API_KEY",
    "ANTHROPIC_API_BASE",
    "ANTHROPIC_BASE_URL",
    "ANTHROPIC_API_KEY",
    "DGRPO_INFERENCE_URL",
)


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> Iterator[StubServer]:
    for name in PROVIDER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    with openai_stub() as server:
        yield server


def free_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"


async def test_an_openai_judge_is_reached_through_openais_variables(
    stub: StubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", stub.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-openai")
    monkeypatch.setenv("DGRPO_INFERENCE_URL", free_port_url())  # a prefixed name never goes there
    judged = await ruler_score_group(group(), "openai/o4-mini", debug=True, swallow_exceptions=True)
    assert judged is not None and [t.reward for t in judged] == [0.9, 0.1]
    assert [t.metrics["independent_reward"] for t in judged] == [0.0, 1.0]
    [request] = stub.requests
    assert (request["model"], stub.keys[0], stub.paths[0]) == (
        "o4-mini",
        "sk-test-openai",
        "/v1/chat/completions",
    )
    assert "temperature" not in request and "max_tokens" not in request  # only what the call gives, as ART
    await ruler_score_group(
        group(), "openai/o4-mini", {"reasoning_effort": "low", "max_completion_tokens": 99}
    )
    assert (stub.requests[1]["reasoning_effort"], stub.requests[1]["max_completion_tokens"]) == ("low", 99)


async def test_hosted_vllm_and_openrouter_judges_read_their_own_variables(
    stub: StubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOSTED_VLLM_API_BASE", stub.base_url)
    scores = await ruler([t.messages() for t in group()], "hosted_vllm/Qwen/Qwen2.5-7B")
    assert [s.score for s in scores] == [0.9, 0.1]
    monkeypatch.setenv("OPENROUTER_API_BASE", stub.base_url)
    monkeypatch.setenv("OR_API_KEY", "sk-or-test")
    await ruler_score_group(group(), "openrouter/openai/o4-mini")
    assert [r["model"] for r in stub.requests] == ["Qwen/Qwen2.5-7B", "openai/o4-mini"]
    assert stub.keys[1] == "sk-or-test"


async def test_an_anthropic_judge_goes_through_litellm(
    stub: StubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_BASE", stub.base_url.removesuffix("/v1"))
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    judged = await ruler_score_group(group(), "anthropic/claude-sonnet-4-5")
    assert judged is not None and [t.reward for t in judged] == [0.9, 0.1]
    assert (stub.paths, stub.keys, stub.requests[0]["model"]) == (
        ["/v1/messages"],
        ["sk-ant-test"],
        "claude-sonnet-4-5",
    )
    monkeypatch.setitem(sys.modules, "litellm", None)  # a client without litellm: refused before any request
    with pytest.raises(JudgeUnreachable, match="reached through litellm, which is not installed"):
        await ruler_score_group(group(), "anthropic/claude-sonnet-4-5", swallow_exceptions=True)
    assert len(stub.requests) == 1


async def test_a_judge_that_cannot_be_asked_fails_loudly_even_when_swallowing(
    stub: StubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(JudgeUnreachable, match="OPENAI_API_KEY"):  # no key: ART's 2048 without its .env
        await ruler_score_group(group(), "openai/o4-mini", swallow_exceptions=True)
    with pytest.raises(JudgeUnreachable, match="HOSTED_VLLM_API_BASE"):
        await ruler_score_group(group(), "hosted_vllm/judge", swallow_exceptions=True)
    nowhere = free_port_url()
    monkeypatch.setenv("OPENAI_BASE_URL", nowhere)  # nothing listens there
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with pytest.raises(JudgeUnreachable, match=f"at {nowhere}.*cannot be asked"):
        await ruler_score_group(group(), "openai/o4-mini", swallow_exceptions=True)
    ANSWERED.add(nowhere)  # once an endpoint has answered, a lost connection is a passing failure, as in ART
    try:
        assert await ruler_score_group(group(), "openai/o4-mini", swallow_exceptions=True) is None
    finally:
        ANSWERED.discard(nowhere)
    stub.script = ["nonsense", "still nonsense"]  # a judge that answers badly drops only its group
    monkeypatch.setenv("OPENAI_BASE_URL", stub.base_url)
    assert await ruler_score_group(group(), "openai/o4-mini", swallow_exceptions=True) is None
