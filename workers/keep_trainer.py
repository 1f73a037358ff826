"""A trainer that cannot train is replaced by a fresh process.

``dgrpo worker all`` watches its trainer child: one that died (killed, out of memory, or left because its compute
thread was stuck) is started again. Without it the parent keeps polling its own queues and looks healthy while
nobody polls the trainer's: the step's train attempt times out on its heartbeat and its retry waits for a trainer
forever. The child is started again with the same command (the same worker id, so its own publish queue is
polled again too).

A trainer process whose compute thread is stuck (activities/compute_thread.py: a kernel, a load or a read that
never returns) leaves: ``leave_when_stuck`` stops its polling, and the process exits with
``EXIT_TRAINER_STUCK`` once its other activities had their grace, for its supervisor to start it again (``worker
all``'s ``keep_trainer``; a standalone worker's restart policy, as Kubernetes' and compose's in deploy/).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from host.processes import ChildExited
from workers.launcher import WorkerProcess

log = logging.getLogger(__name__)

CHECK_EVERY_S = 1.0
EXIT_TRAINER_STUCK = 75
"""The exit code of a worker that left because its trainer's compute thread was stuck (sysexits' EX_TEMPFAIL:
start it again)."""


async def keep_trainer(child: WorkerProcess, stop: asyncio.Event) -> None:
    """Run until cancelled (before ``child.stop()``) or ``stop`` is set (a Ctrl+C reaches the child too): restart
    ``child`` whenever its process has ended."""
    while True:
        await asyncio.sleep(CHECK_EVERY_S)
        if child.alive():
            continue
        if stop.is_set():
            return
        log.error("the trainer child exited%s; starting it again (log: %s)\n%s",
                  " (its compute thread was stuck)" if child.exit_code() == EXIT_TRAINER_STUCK else "",
                  child.log_path, child.child.log_tail(1500))  # fmt: skip
        child.spawn()  # on the event loop's thread, the main one: the child still dies with this worker
        try:
            await asyncio.to_thread(child.wait_ready)
        except (ChildExited, TimeoutError) as err:
            log.error("the restarted trainer child is not ready: %s", err)
            continue  # the next check finds it ended and starts it again
        log.info("trainer child restarted (pid %d)", child.info.pid)


async def leave_when_stuck(stuck: Callable[[], str | None], stop: asyncio.Event) -> str | None:
    """Until ``stop`` is set, look every second whether the trainer's compute thread is ``stuck()``; when it is,
    set ``stop`` (the worker stops polling and gives its other activities their grace) and return why."""
    while not stop.is_set():
        reason = stuck()
        if reason is not None:
            log.error("the trainer's compute thread is stuck (%s): this worker stops polling and exits %d for a "
                      "fresh process", reason, EXIT_TRAINER_STUCK)  # fmt: skip
            stop.set()
            return reason
        await asyncio.sleep(CHECK_EVERY_S)
    return None
