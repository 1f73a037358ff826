"""dgrpo.retry: ART's decorator, on async and plain functions."""

from __future__ import annotations

import pytest

import dgrpo
import dgrpo.utils  # imports the decorator's module: ``dgrpo.retry`` must stay the decorator


class Flaky(Exception):
    pass


async def test_async_rollout_retried_until_it_succeeds() -> None:
    calls: list[int] = []
    retried: list[tuple[str, int]] = []

    @dgrpo.retry(
        max_attempts=3, delay=0, exceptions=(Flaky,), on_retry=lambda e, n: retried.append((str(e), n))
    )
    async def rollout(x: int) -> int:
        calls.append(x)
        if len(calls) < 3:
            raise Flaky(f"try {len(calls)}")
        return x * 2

    assert await rollout(21) == 42
    assert calls == [21, 21, 21]
    assert retried == [("try 1", 1), ("try 2", 2)]
    assert rollout.__name__ == "rollout"


async def test_the_last_failure_is_raised_after_max_attempts() -> None:
    calls = 0

    @dgrpo.retry(max_attempts=2, delay=0.001, backoff_factor=1.0, exceptions=(Flaky,))
    async def rollout() -> None:
        nonlocal calls
        calls += 1
        raise Flaky(f"attempt {calls}")

    with pytest.raises(Flaky, match="attempt 2"):
        await rollout()
    assert calls == 2


def test_other_exceptions_are_not_retried_and_plain_functions_work() -> None:
    calls = 0

    @dgrpo.retry(delay=0, exceptions=(Flaky,))
    def judge() -> None:
        nonlocal calls
        calls += 1
        raise KeyError("not flaky")

    with pytest.raises(KeyError):
        judge()
    assert calls == 1


def test_dgrpo_retry_is_the_decorator_whatever_was_imported() -> None:
    assert dgrpo.retry is dgrpo.utils.retry and callable(dgrpo.retry)


def test_bad_arguments_say_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="max_attempts=0"):
        dgrpo.retry(max_attempts=0)
    with pytest.raises(TypeError, match="tuple of exception classes"):
        dgrpo.retry(exceptions=("ValueError",))  # type: ignore[arg-type]
