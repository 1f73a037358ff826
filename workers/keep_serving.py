"""An inference worker's server that dies is started again, with the adapters it was serving.

The worker started the server (a CPU server or ``vllm serve``), so it watches it: when the process ends,
the next rollouts would fail against a closed port until someone restarts the worker. Instead it starts the
same command again, waits until it is healthy and loads back every adapter the reload activity had loaded,
from the verified local copies, so rollouts pinned to the served step find it.
"""

from __future__ import annotations

import asyncio
import logging

from activities.serving import ServingActivities
from serving.launchers import ServerProcess

log = logging.getLogger(__name__)

CHECK_EVERY_S = 1.0


async def keep_serving(server: ServerProcess, serving: ServingActivities) -> None:
    """Run until cancelled; restart ``server`` whenever its process has ended."""
    while True:
        await asyncio.sleep(CHECK_EVERY_S)
        process = server.process
        if process is None or process.alive():
            continue
        log.error("the inference server exited; starting it again (log: %s)\n%s", server.log_path,
                  process.log_tail(1500))  # fmt: skip
        server.spawn()  # on the event loop's thread, the main one: the server still dies with this worker
        try:
            await asyncio.to_thread(server.wait_healthy)
        except (RuntimeError, TimeoutError) as err:
            log.error("the restarted inference server is not healthy: %s", err)
            continue
        restored = await serving.restore()
        log.info("inference server restarted; adapters loaded again: %s", ", ".join(restored) or "none")
