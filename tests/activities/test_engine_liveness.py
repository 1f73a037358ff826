"""The engine's answering state as activities see it: work on an engine that is restarted under it fails as
retryable; new work waits for an engine that answers; heartbeats are vouched for only while it answers."""

from __future__ import annotations

import asyncio

import pytest
from temporalio.exceptions import ApplicationError

from activities.engine_liveness import EngineLiveness
from schemas.errors import ENGINE_RESTARTED, RETRYABLE


async def test_work_on_an_engine_restarted_under_it_fails_as_retryable_and_is_cancelled() -> None:
    liveness, cancelled = EngineLiveness(), asyncio.Event()

    async def work() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    guarded = asyncio.create_task(liveness.guard(work()))
    await asyncio.sleep(0.05)
    liveness.restarting("left 3 health probes in a row unanswered")
    with pytest.raises(ApplicationError) as failed:
        await guarded
    assert failed.value.type == ENGINE_RESTARTED and RETRYABLE[ENGINE_RESTARTED]
    assert "left 3 health probes in a row unanswered" in failed.value.message
    assert cancelled.is_set()


async def test_new_work_waits_for_an_engine_that_answers_and_heartbeats_stop_meanwhile() -> None:
    liveness = EngineLiveness()
    assert liveness.vouches()
    liveness.missed_probe()
    assert not liveness.vouches()
    started = asyncio.Event()

    async def work() -> str:
        started.set()
        return "done"

    guarded = asyncio.create_task(liveness.guard(work()))
    await asyncio.sleep(0.05)
    assert not started.is_set()  # not sent into an engine that leaves its probes unanswered
    liveness.restarting("stopped answering")
    assert liveness.vouches()  # our own restart: the waiting work is alive
    await asyncio.sleep(0.05)
    assert not started.is_set()
    liveness.restarted()
    assert await guarded == "done"
