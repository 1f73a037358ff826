"""``python -m workers.health ROLE``: a container's health probe — is the worker on this host polling Temporal?

Temporal lists, per task queue, the identities that polled it and when. The SDK's identity is
``<pid>@<hostname>`` and a container (a pod) has a hostname of its own, so a poller ending in ``@<this
hostname>`` seen within ``--max-age-s`` is the worker in this container, connected and taking tasks. A worker
that hung, lost its connection or stopped polling after SIGTERM drops out within that time; exit 1 says which.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
from datetime import UTC, datetime

from temporalio.api.enums.v1 import TaskQueueKind, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client
from temporalio.service import RPCError

from schemas.config import TaskQueues
from workers.temporal import TemporalUnreachable, connect_client

POLLED_TYPE: dict[str, TaskQueueType.ValueType] = {
    "control": TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
    "inference": TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
    "trainer": TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
}
"""What each role's worker polls its queue for (the control worker runs the workflows)."""

MAX_AGE_S = 120.0
"""A live worker re-polls at least every ~70 s (a long poll's limit), so older than this means it stopped."""


async def poller_ages(client: Client, queue: str, queue_type: TaskQueueType.ValueType) -> dict[str, float]:
    """Seconds since each identity last polled ``queue`` for ``queue_type`` tasks, as Temporal reports it."""
    response = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=queue, kind=TaskQueueKind.TASK_QUEUE_KIND_NORMAL),
            task_queue_type=queue_type,
        )
    )
    now = datetime.now(UTC)
    return {
        p.identity: (now - p.last_access_time.ToDatetime(tzinfo=UTC)).total_seconds()
        for p in response.pollers
    }


async def check(role: str, queue: str, host: str, max_age_s: float) -> str | None:
    """None when a worker on ``host`` polled ``queue`` within ``max_age_s``; else what is wrong."""
    client = await connect_client()
    ages = await poller_ages(client, queue, POLLED_TYPE[role])
    mine = [age for identity, age in ages.items() if identity.endswith(f"@{host}")]
    if not mine:
        others = ", ".join(sorted(ages)) or "none"
        return f"no {role} worker on {host} polls {queue} (pollers: {others})"
    if min(mine) > max_age_s:
        return (
            f"the {role} worker on {host} last polled {queue} {min(mine):.0f} s ago (limit {max_age_s:.0f} s)"
        )
    return None


def default_queue(role: str) -> str:
    """The task queue a ``dgrpo worker ROLE`` polls unless its flags name another."""
    return str(TaskQueues().model_dump()[role])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m workers.health", description=__doc__)
    parser.add_argument("role", choices=sorted(POLLED_TYPE))
    parser.add_argument("--queue", help="the task queue the worker polls (default: the role's default queue)")
    parser.add_argument("--max-age-s", type=float, default=MAX_AGE_S, help="seconds since its last poll")
    parser.add_argument("--timeout-s", type=float, default=10.0, help="give up on Temporal after this long")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    queue = args.queue or default_queue(args.role)
    try:
        problem = asyncio.run(
            asyncio.wait_for(check(args.role, queue, socket.gethostname(), args.max_age_s), args.timeout_s)
        )
    except (TimeoutError, TemporalUnreachable, RPCError) as err:
        problem = f"Temporal did not answer: {err or type(err).__name__}"
    if problem is not None:
        print(f"unhealthy: {problem}", file=sys.stderr)
        return 1
    print(f"healthy: {args.role} worker on {socket.gethostname()} polls {queue}")
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # not interpreter teardown under the client's Rust threads (see dgrpo.cli.entry)
