"""Rollouts for tests/workers/test_preemption.py, whose first attempt lasts until the worker is told to stop.

Scenario ``finishes``: attempt 1 ends soon after the worker's shutdown begins (within its grace period).
Scenario ``endless``: attempt 1 never ends (a long agent episode), so the shutdown must cancel it. Any later
attempt returns at once.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import activity

from schemas.trajectory import Trajectory


async def rollout(model: Any, scenario: dict[str, Any]) -> Trajectory:
    if activity.info().attempt == 1:
        await activity.wait_for_worker_shutdown()
        await asyncio.sleep(0.5 if scenario["id"] == "finishes" else 3600)
    return Trajectory(
        messages_and_choices=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
        reward=1.0,
    )
