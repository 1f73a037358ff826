"""Scripted rollout functions at the rollouts activity's seam: no model, fixed trajectories.

The real path (``examples.arithmetic:rollout`` against the real server) is covered in test_rollouts.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

from schemas.trajectory import Trajectory

NOT_CALLABLE = 3


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


async def wrong_type(model: Any, scenario: dict[str, Any]) -> dict[str, Any]:
    return {"reward": 1.0}


def not_async(model: Any, scenario: dict[str, Any]) -> Trajectory:
    return Trajectory()
