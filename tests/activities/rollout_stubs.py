"""Scripted rollout functions at the rollouts activity's seam: no model, fixed trajectories.

The real path (``examples.arithmetic:rollout`` against the real server) is covered in test_rollouts.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import activity

from schemas.trajectory import Trajectory

NOT_CALLABLE = 3

RUNNING: list[int] = [0, 0]
"""Rollouts of ``counted`` running now, and the most that ran at once (one process's count)."""


def scenarios() -> list[dict[str, Any]]:
    return [{"id": f"s{i}", "x": i} for i in range(5)]


async def ok(model: Any, scenario: dict[str, Any]) -> Trajectory:
    """Reward = the scenario's ``x``; fails every time on a scenario with ``fail``."""
    if scenario.get("fail"):
        raise ValueError(f"scripted failure for {scenario['id']}")
    if scenario.get("sleep"):
        await asyncio.sleep(scenario["sleep"])
    return Trajectory(
        messages_and_choices=[
            {"role": "user", "content": f"x={scenario['x']}"},
            {"role": "assistant", "content": "ok"},
        ],
        reward=float(scenario["x"]),
        metadata={"served_model": model.served_model, "model_name": model.name},
    )


async def flaky(model: Any, scenario: dict[str, Any]) -> Trajectory:
    """``ok``, except that on a scenario with ``flaky`` the activity's first attempt raises (so, with
    ``max_exceptions = 0``, that attempt fails and only its shard is tried again)."""
    if scenario.get("flaky") and activity.info().attempt == 1:
        raise ConnectionError(f"scripted first-attempt failure for {scenario['id']}")
    return await ok(model, scenario)


async def stale_first_attempt(model: Any, scenario: dict[str, Any]) -> Trajectory:
    """``ok``, but the activity's first attempt scores every rollout -1: the rows of an attempt a retry replaced."""
    trajectory = await ok(model, scenario)
    return trajectory.model_copy(update={"reward": -1.0}) if activity.info().attempt == 1 else trajectory


async def counted(model: Any, scenario: dict[str, Any]) -> Trajectory:
    """``ok``, counting in ``RUNNING`` how many run at once (each lasts a little while)."""
    RUNNING[0] += 1
    RUNNING[1] = max(RUNNING[1], RUNNING[0])
    try:
        await asyncio.sleep(0.05)
        return await ok(model, scenario)
    finally:
        RUNNING[0] -= 1


GATE: dict[str, asyncio.Event] = {}
"""``gated`` rollouts wait on ``GATE["open"]`` after setting ``GATE["started"]`` (a test creates both)."""


async def gated(model: Any, scenario: dict[str, Any]) -> Trajectory:
    """``ok``, once the test opens ``GATE``: a rollout still running while the test does something else."""
    GATE["started"].set()
    await GATE["open"].wait()
    return await ok(model, scenario)


async def wrong_type(model: Any, scenario: dict[str, Any]) -> dict[str, Any]:
    return {"reward": 1.0}


def not_async(model: Any, scenario: dict[str, Any]) -> Trajectory:
    return Trajectory()


async def asks(model: Any, scenario: dict[str, Any]) -> Trajectory:
    """One chat of ``model=model.name`` through the model's own client; reward 0."""
    await model.openai_client().chat.completions.create(
        model=model.name, messages=[{"role": "user", "content": f"x={scenario['x']}"}]
    )
    return Trajectory(messages_and_choices=[{"role": "user", "content": "asked"}], reward=0.0)
