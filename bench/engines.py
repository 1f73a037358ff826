"""The engines a serving bench compares, ours (``cpu``) and vLLM, started as the inference worker starts them.

Both serve the same HTTP API, so a bench sends the same requests to each; both stay up at once and the bench
alternates between them, so a change in the machine's load shows on both sides.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
from collections.abc import Iterator

import httpx

from base_models.resolve import SMOLLM2_NAME
from schemas.errors import EngineSetupError
from schemas.settings import EngineSettings
from serving.launchers import (
    CpuServerProcess,
    ServerProcess,
    VllmServerProcess,
    probe_vllm_runtime,
    vllm_python,
)

ADAPTER_RANK = 16
"""The benches' LoRAs (the trainer's default shape); vLLM's ``--max-lora-rank`` is set to it, since its CPU
LoRA kernels cost grows with that rank, not the adapter's."""
ENGINE_NAMES = {"cpu": "ours", "vllm": "vLLM"}

log = logging.getLogger(__name__)


def vllm_found() -> bool:
    """Whether vLLM's runtime environment (``$DGRPO_VLLM_PYTHON``, else ``.venv-vllm``) imports vLLM."""
    try:
        probe_vllm_runtime(vllm_python(EngineSettings(engine="vllm")))
    except EngineSetupError as err:
        log.warning("no vLLM side: %s", err)
        return False
    return True


def default_engines() -> list[str]:
    return ["cpu", "vllm"] if vllm_found() else ["cpu"]


def server_for(
    engine: str, dtype: str, *, prefix_cache_mb: int = 1024, max_batch: int = 32, threads: int | None = None
) -> ServerProcess:
    """A server of SmolLM2-135M on ``engine`` in ``dtype`` (``fp32`` or ``bf16``), not started yet."""
    if engine == "vllm":
        settings = EngineSettings(
            engine="vllm",
            dtype=dtype,
            max_lora_rank=ADAPTER_RANK,
            prefix_cache_mb=prefix_cache_mb,  # type: ignore[arg-type]
        )
        return VllmServerProcess(SMOLLM2_NAME, settings, dev_endpoints=True)  # /reset_prefix_cache
    settings = EngineSettings(dtype=dtype, max_lora_rank=ADAPTER_RANK, prefix_cache_mb=prefix_cache_mb)
    return CpuServerProcess(SMOLLM2_NAME, settings, max_batch=max_batch, threads=threads)


@contextlib.contextmanager
def running(servers: dict[str, ServerProcess]) -> Iterator[dict[str, ServerProcess]]:
    """Start every server, one after another; stop every one started, however the block ends (SIGTERM too)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds through the stops below
    with contextlib.ExitStack() as stack:
        for label, server in servers.items():
            stack.callback(server.stop)
            server.start()
            log.info("%s up at %s (log %s)", label, server.base_url, server.log_path)
        yield servers


async def forget_prefixes(server: ServerProcess) -> None:
    """Empty the server's prefix cache: ours drops it on ``/sleep``; vLLM's CPU build has no sleep mode, but
    ``/reset_prefix_cache`` (served with ``VLLM_SERVER_DEV_MODE=1``)."""
    if isinstance(server, VllmServerProcess):
        async with httpx.AsyncClient(timeout=60) as http:
            (await http.post(server.base_url + "/reset_prefix_cache")).raise_for_status()
        return
    await server.client.sleep()
    await server.client.wake_up()
