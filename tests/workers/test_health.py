"""``python -m workers.health``: healthy only while a worker on this host polls the role's queue (real Temporal)."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import uuid
from pathlib import Path

from temporalio import activity
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.client import Client
from temporalio.worker import Worker

from schemas.settings import ENV_TEMPORAL_ADDRESS
from workers.health import poller_ages

REPO = Path(__file__).resolve().parents[2]


@activity.defn
async def noop() -> None:
    """Something for the workers to register; no task ever runs."""


async def probe(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run the probe as a container would, in its own process; its exit status and output."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "workers.health", *args, cwd=REPO, env={**os.environ, **(env or {})},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode()


async def polled_by(client: Client, queue: str, identity: str) -> None:
    """Wait until Temporal lists ``identity`` among ``queue``'s activity pollers (the probe's precondition)."""
    for _ in range(100):
        if identity in await poller_ages(client, queue, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{identity} never polled {queue}")


async def test_the_probe_passes_only_for_a_worker_on_this_host(
    temporal_client: Client, task_queue: str
) -> None:
    here = f"{uuid.uuid4().hex[:6]}@{socket.gethostname()}"
    elsewhere_queue = f"{task_queue}-elsewhere"
    unpolled_queue = f"{task_queue}-nobody"
    mine = Worker(temporal_client, task_queue=task_queue, activities=[noop], identity=here)
    theirs = Worker(temporal_client, task_queue=elsewhere_queue, activities=[noop], identity="1@another-host")
    async with mine, theirs:
        await polled_by(temporal_client, task_queue, here)
        await polled_by(temporal_client, elsewhere_queue, "1@another-host")

        rc, out = await probe("inference", "--queue", task_queue)
        assert rc == 0, out
        assert f"polls {task_queue}" in out

        rc, out = await probe("trainer", "--queue", elsewhere_queue)
        assert rc == 1, out
        assert "1@another-host" in out and "no trainer worker" in out

        rc, out = await probe("inference", "--queue", unpolled_queue)
        assert rc == 1 and "pollers: none" in out, out

        # The control worker runs workflows: activity pollers alone do not make it healthy.
        rc, out = await probe("control", "--queue", task_queue)
        assert rc == 1 and "no control worker" in out, out

        rc, out = await probe("inference", "--queue", task_queue, "--max-age-s", "-1")
        assert rc == 1 and "last polled" in out, out


async def test_the_probe_fails_when_temporal_cannot_be_reached() -> None:
    rc, out = await probe("control", "--timeout-s", "5", env={ENV_TEMPORAL_ADDRESS: "127.0.0.1:1"})
    assert rc == 1 and "Temporal did not answer" in out, out
