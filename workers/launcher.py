"""Start ``dgrpo worker ROLE`` as a child process and wait until it polls (the demo, tests, scripts)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from schemas.config import TaskQueues
from workers.processes import spawn_logged

READY_TIMEOUT_S = 600.0


class WorkerProcess:
    """One ``dgrpo worker`` subprocess; its log goes to ``log_path``; ``stop()`` sends SIGTERM (graceful)."""

    def __init__(
        self,
        role: str,
        log_path: Path,
        *,
        task_queues: TaskQueues | None = None,
        model: str | None = None,
        server_url: str | None = None,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        die_with_parent: bool = False,
        extra_args: list[str] | None = None,
    ) -> None:
        self.role = role
        self.log_path = log_path
        self.ready_file = log_path.with_suffix(".ready")
        self.args = [sys.executable, "-m", "dgrpo.cli", "worker", role, "--ready-file", str(self.ready_file)]
        queues = task_queues or TaskQueues()
        self.args += ["--control-queue", queues.control, "--inference-queue", queues.inference]
        self.args += ["--trainer-queue", queues.trainer]
        if model:
            self.args += ["--model", model]
        if server_url:
            self.args += ["--server-url", server_url]
        self.args += extra_args or []
        self.die_with_parent = die_with_parent
        self.env = {**os.environ, **(env or {})}
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = READY_TIMEOUT_S) -> None:
        self.spawn()
        self.wait_ready(timeout)

    def spawn(self) -> None:
        """Start the process; with ``die_with_parent``, call it from a thread that lives as long as the
        parent (the death signal follows the spawning thread)."""
        self.ready_file.unlink(missing_ok=True)
        self.proc = spawn_logged(
            self.args, self.log_path, env=self.env, cwd=self.cwd, tied_to_parent=self.die_with_parent
        )

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        assert self.proc is not None, "spawn() first"
        deadline = time.monotonic() + timeout
        while not self.ready_file.exists():
            if self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(
                    f"`dgrpo worker {self.role}` exited with code {self.proc.returncode}:\n{tail}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(
                    f"`dgrpo worker {self.role}` not ready after {timeout:.0f}s ({self.log_path})"
                )
            time.sleep(0.3)

    @property
    def server_urls(self) -> list[str]:
        """The inference servers the worker fronts (written into its ready file)."""
        return self.ready_file.read_text().split() if self.ready_file.exists() else []

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``; returns the exit code (None if it was not running)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def kill(self) -> None:
        """SIGKILL, as a crash would (tests of durability)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
