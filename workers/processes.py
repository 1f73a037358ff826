"""Local processes and loopback ports: the plumbing under the embedded stack (workers/stack.py)."""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable
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
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
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


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Write via a temp file and rename, so readers never see half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, mode)
    os.replace(tmp, path)


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
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    new_session: bool = False,
    tied_to_parent: bool = False,
) -> subprocess.Popen[bytes]:
    """Start ``args`` with stdout and stderr appended to ``log_path`` and stdin closed.

    ``new_session``: the child outlives its parent and ignores the terminal's Ctrl+C (servers, workers
    a client may abandon). ``tied_to_parent``: the child gets SIGTERM when the *thread* that spawned it
    ends, so call it from a thread that lives as long as the parent (the main thread).
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
            preexec_fn=die_with_parent if tied_to_parent else None,
        )
