"""``dgrpo worker all`` watches its trainer child: one that died (killed, out of memory) is started again.

Without it the parent keeps polling its own queues and looks healthy while nobody polls the trainer's: the
step's train attempt times out on its heartbeat and its retry waits for a trainer forever. The child is
started again with the same command (the same worker id, so its own publish queue is polled again too).
"""

from __future__ import annotations

import asyncio
import logging

from host.processes import ChildExited
from workers.launcher import WorkerProcess

log = logging.getLogger(__name__)

CHECK_EVERY_S = 1.0


async def keep_trainer(child: WorkerProcess, stop: asyncio.Event) -> None:
    """Run until cancelled (before ``child.stop()``) or ``stop`` is set (a Ctrl+C reaches the child too): restart
    ``child`` whenever its process has ended."""
    while True:
        await asyncio.sleep(CHECK_EVERY_S)
        if child.alive():
            continue
        if stop.is_set():
            return
        log.error("the trainer child exited; starting it again (log: %s)\n%s", child.log_path,
                  child.child.log_tail(1500))  # fmt: skip
        child.spawn()  # on the event loop's thread, the main one: the child still dies with this worker
        try:
            await asyncio.to_thread(child.wait_ready)
        except (ChildExited, TimeoutError) as err:
            log.error("the restarted trainer child is not ready: %s", err)
            continue  # the next check finds it ended and starts it again
        log.info("trainer child restarted (pid %d)", child.info.pid)
