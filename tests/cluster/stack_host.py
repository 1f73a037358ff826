"""Host 1 of a test cluster: the embedded stack (Temporal dev server + SeaweedFS S3) on this host's loopback,
reachable from the other hosts at ``ADDRESS`` through a TCP forwarder per port, as a cluster's Temporal and
object store are reachable at their service addresses. Writes the environment that points workers at it
(``DGRPO_*``, the S3 keys included) to ``ENV_FILE`` once both answer, then runs until SIGTERM.
``S3_ADDRESS`` (optional, another address of this host): where S3 is served instead, so one host can lose
S3 alone (a route to that address removed) while it still reaches Temporal.

    python tests/cluster/stack_host.py ADDRESS ENV_FILE [S3_ADDRESS]
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from schemas.settings import ENV_S3_ENDPOINT, ENV_TEMPORAL_ADDRESS
from workers.stack import EmbeddedStack

LOOPBACK = "127.0.0.1"


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def forward(address: str, port: int) -> asyncio.Server:
    """``address:port`` → ``127.0.0.1:port``, byte for byte (gRPC and S3 alike)."""

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(LOOPBACK, port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

    return await asyncio.start_server(connection, address, port)


async def serve(address: str, env_file: Path, s3_address: str) -> None:
    stack = EmbeddedStack(
        Path(os.environ["DGRPO_HOME"]), free_ports=True, ui=False, tied_to_parent=True, start_timeout=240
    )
    stack.start()
    try:
        state = stack.state
        assert state is not None
        servers = [await forward(address, state.temporal_port), await forward(s3_address, state.s3_port)]
        env = stack.env()
        env[ENV_TEMPORAL_ADDRESS] = env["TEMPORAL_ADDRESS"] = f"{address}:{state.temporal_port}"
        env[ENV_S3_ENDPOINT] = f"{s3_address}:{state.s3_port}"
        await asyncio.to_thread(env_file.write_text, json.dumps(env))
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        for server in servers:
            server.close()
    finally:
        stack.stop()


if __name__ == "__main__":
    address = sys.argv[1]
    asyncio.run(serve(address, Path(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else address))
