"""The CPU inference server as a child process of an inference worker (``dgrpo serve`` on loopback)."""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from schemas.settings import dgrpo_home
from workers.processes import HOST, free_port

log = logging.getLogger(__name__)

START_TIMEOUT_S = 300.0
PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    # Linux: a worker killed with SIGKILL must not leave its server (and the model's memory) behind.
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


class ServerProcess:
    """``dgrpo serve --model MODEL --port PORT`` started, health-checked and stopped by its worker."""

    def __init__(self, model: str, port: int | None = None, log_dir: Path | None = None) -> None:
        self.model = model
        self.port = port or free_port()
        self.log_path = (log_dir or Path(dgrpo_home()) / "logs") / f"serve-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The OpenAI-compatible base URL (``http://127.0.0.1:<port>/v1``)."""
        return f"http://{HOST}:{self.port}/v1"

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        self.spawn()
        self.wait_ready(timeout)

    def spawn(self) -> None:
        """Start the process (call from the thread that lives as long as the worker: the death signal
        is tied to the spawning thread)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        args = [sys.executable, "-m", "dgrpo.cli", "serve", "--model", self.model]
        args += ["--host", HOST, "--port", str(self.port)]
        log.info("starting the CPU server for %s on port %d (log: %s)", self.model, self.port, self.log_path)
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                args,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=die_with_parent,
            )

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        assert self.proc is not None, "spawn() first"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the CPU server exited with code {self.proc.returncode}:\n{tail}")
            try:
                if httpx.get(f"{self.url}/models", timeout=2.0).status_code == 200:
                    log.info("CPU server ready at %s", self.url)
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(
            f"the CPU server did not answer on {self.url} within {timeout:.0f}s ({self.log_path})"
        )

    def stop(self, timeout: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
