"""The operator's settings behind the allow-lists, read from the environment (the flags are exercised by
the real workers of test_bad_inputs.py)."""

from __future__ import annotations

import pytest

from activities.judge import JudgeEndpoints
from activities.rollouts import DEFAULT_TASK_MODULES, module_allowed, task_modules_from_env
from schemas.settings import ENV_JUDGE_BASE_URLS, ENV_JUDGE_KEY_ENVS, ENV_TASK_MODULES


def test_task_modules_default_to_the_examples_and_follow_the_environment() -> None:
    assert task_modules_from_env({}) == DEFAULT_TASK_MODULES == ("examples.",)
    assert task_modules_from_env({ENV_TASK_MODULES: " my_env., team.tasks ,"}) == ("my_env.", "team.tasks")


@pytest.mark.parametrize(
    ("module", "allowed"),
    [
        ("examples", True),
        ("examples.arithmetic", True),
        ("examples.sub.deeper", True),
        ("examples_evil", False),
        ("examplesx.arithmetic", False),
        ("os", False),
        ("", False),
    ],
)
def test_a_prefix_is_a_package_boundary(module: str, allowed: bool) -> None:
    assert module_allowed(module, ("examples.",)) is allowed
    assert module_allowed(module, ("examples",)) is allowed


def test_no_prefix_allows_nothing() -> None:
    assert not module_allowed("examples.arithmetic", ())
    assert not module_allowed("examples.arithmetic", ("", "."))


def test_judge_endpoints_default_to_none_and_follow_the_environment() -> None:
    assert JudgeEndpoints.from_env({}) == JudgeEndpoints((), ())
    env = {
        ENV_JUDGE_BASE_URLS: "https://judge.example/v1, http://10.0.0.5:8000",
        ENV_JUDGE_KEY_ENVS: "https://keyed.example/v1=JUDGE_KEY",
    }
    endpoints = JudgeEndpoints.from_env(env)
    assert endpoints.keys == (("https://keyed.example/v1", "JUDGE_KEY"),)
    assert endpoints.allows_url("https://keyed.example/v1/")
    assert endpoints.pairs("https://keyed.example/v1/", "JUDGE_KEY")
    assert not endpoints.pairs("https://judge.example/v1", "JUDGE_KEY")
    assert endpoints.allows_url("https://judge.example/v1/") and endpoints.allows_url(
        "http://10.0.0.5:8000/v1"
    )
    for other in (
        "https://judge.example.evil/v1",
        "https://judge.example/v1/../x",
        "http://10.0.0.5:8001/v1",
    ):
        assert not endpoints.allows_url(other)


def test_a_judge_key_without_its_endpoint_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match=r"names no endpoint.*URL=NAME"):
        JudgeEndpoints.from_env({ENV_JUDGE_KEY_ENVS: "JUDGE_KEY"})
