"""Start ``dgrpo worker ROLE`` as a child process and wait until it polls (the demo, tests, scripts)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from host.processes import ChildProcess, ProcessInfo
from schemas.config import TaskQueues
from schemas.settings import ENV_WORKER_PYTHON

READY_TIMEOUT_S = 600.0


class WorkerProcess:
    """One ``dgrpo worker`` subprocess; its log goes to ``log_path``; ``stop()`` sends SIGTERM (graceful).

    It runs on ``$DGRPO_WORKER_PYTHON`` when set (the workers' environment), else on this Python. It writes
    ``log_path`` with the suffix ``.ready`` once every worker polls. ``die_with_parent``: it gets
    SIGTERM when the spawning thread ends. ``new_session``: it outlives the client that started it.
    """

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
        new_session: bool = False,
        extra_args: list[str] | None = None,
    ) -> None:
        self.role = role
        self.log_path = log_path
        self.ready_file = log_path.with_suffix(".ready")
        python = os.environ.get(ENV_WORKER_PYTHON) or sys.executable
        args = [python, "-m", "dgrpo.cli", "worker", role, "--ready-file", str(self.ready_file)]
        queues = task_queues or TaskQueues()
        args += ["--control-queue", queues.control, "--inference-queue", queues.inference]
        args += ["--trainer-queue", queues.trainer]
        if model:
            args += ["--model", model]
        if server_url:
            args += ["--server-url", server_url]
        self.child = ChildProcess(
            [*args, *(extra_args or [])],
            log_path,
            name=f"`dgrpo worker {role}`",
            env={**os.environ, **(env or {})},
            cwd=cwd,
            new_session=new_session,
            tied_to_parent=die_with_parent,
        )

    def start(self, timeout: float = READY_TIMEOUT_S) -> None:
        self.spawn()
        self.wait_ready(timeout)

    def spawn(self) -> None:
        """Start the process; with ``die_with_parent``, call it from a thread that lives as long as the
        parent (the death signal follows the spawning thread)."""
        self.ready_file.unlink(missing_ok=True)
        self.child.spawn()

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        self.child.wait_until(self.ready_file.exists, timeout)

    @property
    def info(self) -> ProcessInfo:
        return self.child.info

    @property
    def server_urls(self) -> list[str]:
        """The inference servers the worker fronts (written into its ready file)."""
        return self.ready_file.read_text().split() if self.ready_file.exists() else []

    def alive(self) -> bool:
        return self.child.alive()

    def exit_code(self) -> int | None:
        """The code the process exited with; None while it runs."""
        return self.child.exit_code()

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``; returns the exit code (None if it was not running)."""
        return self.child.stop(timeout)

    def kill(self) -> None:
        """SIGKILL, as a crash would (tests of durability)."""
        self.child.kill()
