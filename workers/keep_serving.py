"""An inference worker's server that dies or stops answering is started again, with the adapters it was serving.

The worker started the server (a CPU server or ``vllm serve``), so it watches it: every second it asks
``/health`` with a deadline (``EngineSettings.probe_timeout_s``; both engines answer it from their HTTP loop
while a batch generates, so a busy engine still answers). A process that ended, or one that leaves
``EngineSettings.unanswered_probes`` probes in a row unanswered (stopped, deadlocked, swapped out), is killed
and started again with the same command; the activities that used it fail at once as retryable
(``EngineLiveness``), and once the new server is healthy every adapter the reload activity had loaded is
loaded back from the verified local copies, so rollouts pinned to the served step find it.
"""

from __future__ import annotations

import asyncio
import logging

from activities.fleet_metrics import fleet_metrics
from activities.serving import ServingActivities
from serving.launchers import ServerProcess

log = logging.getLogger(__name__)

CHECK_EVERY_S = 1.0


async def keep_serving(server: ServerProcess, serving: ServingActivities) -> None:
    """Run until cancelled; restart ``server`` whenever its process has ended or stopped answering."""
    liveness, settings = serving.liveness, serving.engine
    while True:
        await asyncio.sleep(CHECK_EVERY_S)
        process = server.process
        if process is None:
            continue
        if not process.alive():
            why = "exited"
            log.error("the inference server exited; starting it again (log: %s)\n%s", server.log_path,
                      process.log_tail(1500))  # fmt: skip
            _kill(server)  # what it leaves behind: vLLM's engine core outlives its API process
        elif await server.client.health(settings.probe_timeout_s):
            liveness.answered()
            continue
        elif (missed := liveness.missed_probe()) < settings.unanswered_probes:
            log.warning("the inference server left a health probe unanswered (%d in a row)", missed)
            continue
        else:
            why = f"left {missed} health probes in a row unanswered ({settings.probe_timeout_s:g}s each)"
            log.error("the inference server %s; killing it and starting it again (log: %s)", why,
                      server.log_path)  # fmt: skip
            _kill(server)
        liveness.restarting(why)
        fleet_metrics().engine_restarts.add(1)
        await _restart(server, serving)


def _kill(server: ServerProcess) -> None:
    """SIGKILL to the server's process group: a stopped or deadlocked server would sit on SIGTERM, and a
    server's own children (vLLM's engine core and workers) would outlive it holding their memory."""
    if server.process is not None:
        server.process.kill()
    server.stop()


async def _restart(server: ServerProcess, serving: ServingActivities) -> None:
    server.spawn()  # on the event loop's thread, the main one: the server still dies with this worker
    try:
        await asyncio.to_thread(server.wait_healthy)
    except (RuntimeError, TimeoutError) as err:
        log.error("the restarted inference server is not healthy: %s", err)
        return  # the next check finds it ended and starts it again
    try:
        restored = await serving.restore()
    except Exception as err:  # rollouts load what they pin anyway (ensure_adapter)
        log.error("adapters not loaded again on the restarted inference server: %s", err)
        restored = []
    serving.liveness.restarted()
    log.info("inference server restarted; adapters loaded again: %s", ", ".join(restored) or "none")
