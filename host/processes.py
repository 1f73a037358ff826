"""Child processes and loopback ports on this machine: one lifecycle for every server and worker we start.

``ChildProcess`` starts a command with its output appended to a log file, waits until it is ready (a
predicate: ``/health`` answers, a ready file exists), says why when it dies first (the log's tail), and
stops it with SIGTERM, then SIGKILL. ``ProcessInfo`` records a process another one started (``stack.json``,
``local-backend.json``), so a later process can check and stop it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil
from pydantic import BaseModel, ConfigDict

log = logging.getLogger(__name__)

HOST = "127.0.0.1"


class ProcessInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pid: int
    create_time: float
    """psutil's create time, so a recycled pid is never mistaken for ours."""
    log: str


def port_is_free(port: int) -> bool:
    """True when a server could listen on ``port``: connections of a dead one lingering in TIME_WAIT do not
    count (servers, ours and the Go ones, bind with SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port(exclude: set[int] | None = None) -> int:
    """A currently unused loopback port (not in ``exclude``)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((HOST, 0))
            port = int(s.getsockname()[1])
        if port not in (exclude or set()):
            return port


def port_answers(port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=timeout):
            return True
    except OSError:
        return False


def alive(info: ProcessInfo) -> bool:
    try:
        proc = psutil.Process(info.pid)
        return abs(proc.create_time() - info.create_time) < 1.0 and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def terminate(infos: list[ProcessInfo], timeout: float) -> None:
    """SIGTERM all at once, then SIGKILL whatever still runs after ``timeout``."""
    procs = []
    for info in infos:
        if alive(info):
            try:
                proc = psutil.Process(info.pid)
                proc.send_signal(signal.SIGTERM)
                procs.append(proc)
            except psutil.NoSuchProcess:
                pass
    _, still_alive = psutil.wait_procs(procs, timeout=timeout)
    for proc in still_alive:
        log.warning("pid %d ignored SIGTERM for %.0fs; sending SIGKILL", proc.pid, timeout)
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(still_alive, timeout=timeout)


def run_in_thread(coro_factory: Callable[[], Awaitable[Any]]) -> Any:
    """Run a coroutine to completion on a private loop (safe even when the caller's loop is running)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(_as_coroutine(coro_factory))
        except BaseException as err:
            box["error"] = err

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


async def _as_coroutine(factory: Callable[[], Awaitable[Any]]) -> Any:
    return await factory()


def die_with_parent() -> None:
    """``preexec_fn``: the child gets SIGTERM when the process that started it dies (Linux only)."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def spawn_logged(
    args: list[str],
    log_path: Path,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    new_session: bool = False,
    tied_to_parent: bool = False,
    own_group: bool = False,
) -> subprocess.Popen[bytes]:
    """Start ``args`` with stdout and stderr appended to ``log_path`` and stdin closed.

    ``new_session``: the child outlives its parent and ignores the terminal's Ctrl+C (servers, workers
    a client may abandon). ``tied_to_parent``: the child gets SIGTERM when the *thread* that spawned it
    ends, so call it from a thread that lives as long as the parent (the main thread). ``own_group``: the child
    leads a process group of its own, which its children join (so they can be signalled together).
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        return subprocess.Popen(
            args,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            start_new_session=new_session,
            process_group=0 if own_group and not new_session else None,
            preexec_fn=die_with_parent if tied_to_parent else None,
        )


class ChildExited(RuntimeError):
    """A child process ended before it was ready; the message holds its exit code and its log's tail."""


class ChildProcess:
    """One child process: ``argv`` started with stdout and stderr appended to ``log_path``.

    ``new_session``: it outlives its parent and ignores the terminal's Ctrl+C (servers, workers a client may
    abandon). ``tied_to_parent``: it gets SIGTERM when the *thread* that spawned it ends, so spawn it from a
    thread that lives as long as the parent (the main thread), never from a pool thread. ``whole_group``: it
    leads a process group, and ``stop``/``kill`` signal the group: a server's own children (vLLM's engine
    core and workers, which outlive a killed API process and keep its memory) end with it.
    """

    def __init__(
        self,
        argv: Sequence[str],
        log_path: str | Path,
        *,
        name: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        new_session: bool = False,
        tied_to_parent: bool = False,
        whole_group: bool = False,
    ) -> None:
        self.argv = [str(a) for a in argv]
        self.log_path = Path(log_path)
        self.name = name or " ".join(self.argv[:2])
        self.env = dict(env) if env is not None else None
        self.cwd = Path(cwd) if cwd is not None else None
        self.new_session = new_session
        self.tied_to_parent = tied_to_parent
        self.whole_group = whole_group
        self.proc: subprocess.Popen[bytes] | None = None

    def spawn(self) -> None:
        log.info("starting %s (log: %s)", self.name, self.log_path)
        self.proc = spawn_logged(
            self.argv,
            self.log_path,
            env=self.env,
            cwd=self.cwd,
            new_session=self.new_session,
            tied_to_parent=self.tied_to_parent,
            own_group=self.whole_group,
        )

    @property
    def info(self) -> ProcessInfo:
        """What a state file records, so another process can find and stop this one."""
        assert self.proc is not None, "spawn() first"
        create_time = psutil.Process(self.proc.pid).create_time()
        return ProcessInfo(pid=self.proc.pid, create_time=create_time, log=str(self.log_path))

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def exit_code(self) -> int | None:
        """The code the process exited with; None while it runs (or before it was spawned)."""
        return None if self.proc is None else self.proc.poll()

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def wait_until(self, ready: Callable[[], bool], timeout_s: float, poll_s: float = 0.3) -> None:
        """Return once ``ready()`` is true; raise ``ChildExited`` if the process ends first, or stop it and
        raise ``TimeoutError`` after ``timeout_s``."""
        assert self.proc is not None, "spawn() first"
        deadline = time.monotonic() + timeout_s
        while not ready():
            if self.proc.poll() is not None:
                raise ChildExited(
                    f"{self.name} exited with code {self.proc.returncode} ({self.log_path}):\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"{self.name} was not ready within {timeout_s:.0f}s ({self.log_path})")
            time.sleep(poll_s)

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout_s``; the exit code, or None if it was not started."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            self._signal(proc, signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("%s ignored SIGTERM for %.0fs; sending SIGKILL", self.name, timeout_s)
                self._signal(proc, signal.SIGKILL)
                proc.wait()
        self._end_group(proc, timeout_s)
        return proc.returncode

    def kill(self) -> None:
        """SIGKILL, as a crash would (tests of durability); with ``whole_group``, to its children too."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            self._signal(proc, signal.SIGKILL)
            proc.wait()
        self._end_group(proc, 0)

    def _signal(self, proc: subprocess.Popen[bytes], sig: int) -> None:
        if self.whole_group:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)

    def _end_group(self, proc: subprocess.Popen[bytes], grace_s: float) -> None:
        """Wait up to ``grace_s`` for what is left of the group (children shutting down after their leader),
        then SIGKILL it."""
        if not self.whole_group:
            return
        deadline = time.monotonic() + grace_s
        while _group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
