"""ART 0.5.23's capture API: ``art.trajectory(coro)``, ``art.trajectory_group(...)``,
``art.current_trajectory(require=)`` and ``art.no_capture()``.

    async def rollout(model, scenario) -> None:
        client = model.openai_client()
        reply = await client.chat.completions.create(model=model.name, messages=...)
        art.current_trajectory(require=True).reward = score(reply)

    group = await art.trajectory_group(art.trajectory(rollout(model, s)) for _ in range(8))

``with trajectory:`` (``Trajectory.__enter__``, schemas/trajectory.py) makes it the context's innermost capture
scope: each call to a model endpoint begun inside it is recorded into it as an exchange
(dgrpo/capture/transports.py). Scopes are task-local: a task started inside one copies it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Literal, overload

from dgrpo.capture.transports import install
from schemas.trajectory import CAPTURE_SCOPES, ROLLOUT_DONE, ExceptionRecord, Trajectory, TrajectoryGroup


@overload
def current_trajectory(*, require: Literal[True]) -> Trajectory: ...


@overload
def current_trajectory(*, require: bool = False) -> Trajectory | None: ...


def current_trajectory(*, require: bool = False) -> Trajectory | None:
    """The innermost trajectory capturing in this context (``art.trajectory``, ``with trajectory:``, or
    ``capture_auto_trajectory``); None outside one, or ``RuntimeError`` with ``require=True``."""
    scopes = CAPTURE_SCOPES.get()
    if scopes:
        return scopes[-1].trajectory
    if require:
        raise RuntimeError(
            "no trajectory is capturing in this context: run the rollout as `await art.trajectory(rollout(...))` "
            "or inside `with art.Trajectory() as trajectory:`"
        )
    return None


@contextmanager
def no_capture() -> Iterator[None]:
    """Hide the enclosing capture scopes: calls begun inside are recorded nowhere, unless a scope is
    entered inside (which captures as usual)."""
    token = CAPTURE_SCOPES.set(())
    try:
        yield
    finally:
        CAPTURE_SCOPES.reset(token)


async def trajectory(coroutine: Coroutine[Any, Any, object]) -> Trajectory:
    """Run ``coroutine`` (a coroutine object, not yet awaited) inside a new trajectory's capture scope and
    return the trajectory: its exchanges, and whatever the rollout set on ``current_trajectory()``."""
    if isinstance(coroutine, asyncio.Future) or not isinstance(coroutine, Coroutine):
        raise TypeError(
            f"art.trajectory takes a coroutine object (`art.trajectory(rollout(...))`), not a "
            f"{type(coroutine).__name__}: a task or future already runs in its own context, outside the capture"
        )
    install()
    with Trajectory() as captured:
        await coroutine
    return captured


async def trajectory_group(
    trajectories: Iterable[Trajectory | BaseException | Awaitable[Trajectory]],
    *,
    exceptions: Iterable[BaseException | ExceptionRecord] = (),
    metadata: dict[str, Any] | None = None,
    metrics: dict[str, float | int | bool] | None = None,
    logs: list[str] | None = None,
    return_exceptions: bool = False,
) -> TrajectoryGroup:
    """A group of the given trajectories and of those the awaitables return, in the order given.

    Awaitables run concurrently, outside any enclosing capture (``no_capture``); one object given twice runs
    once and fills both places. A rollout that raises an ``Exception`` cancels the others and the error
    propagates, or with ``return_exceptions=True`` is kept in the group's ``exceptions`` (after those given);
    anything else (``KeyboardInterrupt``, cancellation) always propagates.
    """
    given = list(exceptions)
    for error in given:
        _raise_if_not_exception(error)
    items = list(trajectories)
    results: list[Trajectory | BaseException | None] = [None] * len(items)
    with no_capture():
        tasks: dict[int, asyncio.Future[Any]] = {}
        places: dict[asyncio.Future[Any], list[int]] = {}
        for index, item in enumerate(items):
            if isinstance(item, Trajectory | BaseException):
                _raise_if_not_exception(item)
                results[index] = item
                continue
            task = tasks.get(id(item))
            if task is None:
                task = tasks[id(item)] = asyncio.ensure_future(item)
                places[task] = []
            places[task].append(index)
        try:
            pending = set(places)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    outcome = _outcome(task, return_exceptions)
                    for index in places[task]:
                        results[index] = outcome
        except BaseException:
            for task in places:
                task.cancel()
            await asyncio.gather(*places, return_exceptions=True)
            raise
    return TrajectoryGroup(
        [r for r in results if isinstance(r, Trajectory)],
        exceptions=[*(r for r in results if isinstance(r, BaseException)), *given],  # the rollouts' first
        metadata=metadata or {},
        metrics=metrics or {},
        logs=logs or [],
    )


def _raise_if_not_exception(item: object) -> None:
    if isinstance(item, BaseException) and not isinstance(item, Exception):
        raise item


def _outcome(task: asyncio.Future[Any], return_exceptions: bool) -> Trajectory | Exception:
    """A finished rollout's trajectory, or its exception when the group keeps exceptions; reported to the
    enclosing ``gather_trajectory_groups``' progress bar."""
    error = task.exception()  # raises CancelledError for a cancelled task: that propagates
    if error is not None:
        if not return_exceptions or not isinstance(error, Exception):
            raise error
        _report(error)
        return error
    result = task.result()
    if not isinstance(result, Trajectory):
        raise TypeError(
            f"art.trajectory_group awaits trajectories, and one returned a {type(result).__name__}"
        )
    _report(result)
    return result


def _report(result: Trajectory | BaseException) -> None:
    if (done := ROLLOUT_DONE.get()) is not None:
        done(result)
