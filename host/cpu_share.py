"""The CPU cores of one host, shared by the torch processes that are busy on it at the same moment.

A CPU inference server and a CPU trainer on one machine (``dgrpo worker all``) each default to every core.
One after the other (sync mode) that is right; at the same time (pipelined mode: the next step's rollouts
while this step trains) their OpenMP threads outnumber the cores, spin-wait for each other and make both
phases several times slower than running them in turn. So each such process marks itself busy while it
works and, before each transformer layer's forward, takes ``cores // busy processes`` threads.

Busy is an advisory ``flock`` on the process's own file in a per-user directory: the kernel drops it when
the process dies, so a killed worker never holds cores it no longer uses.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from schemas.settings import ENV_CPU_SHARE_DIR

log = logging.getLogger(__name__)

RECHECK_S = 0.2
"""Seconds a process keeps its thread count before it looks at the others again."""


def share_dir() -> Path | None:
    """``$DGRPO_CPU_SHARE_DIR``, else a per-user directory under the system's temporary one; None when the
    variable is ``off``."""
    configured = os.environ.get(ENV_CPU_SHARE_DIR, "")
    if configured == "off":
        return None
    return Path(configured or Path(tempfile.gettempdir()) / f"dgrpo-cpu-share-{os.getuid()}")


class CpuShare:
    """This process's claim on the host's cores; ``threads()`` is its share while it is busy."""

    def __init__(self, directory: Path, cores: int) -> None:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        if directory.stat().st_uid != os.getuid():  # another user's directory: not ours to trust
            raise PermissionError(f"{directory} belongs to another user")
        self.directory = directory
        self.cores = max(1, cores)
        self._file = open(directory / f"{os.getpid()}.busy", "a+")  # held for the process's life
        self._busy = False
        self._threads = self.cores
        self._checked = 0.0

    @classmethod
    def for_host(cls, cores: int | None = None) -> CpuShare | None:
        """The share of this process (``cores``: its most threads, default torch's); None where sharing is
        switched off or its directory cannot be used (then the process keeps all its threads)."""
        import torch  # only processes that run torch share cores; this package stays light

        directory = share_dir()
        if directory is None:
            return None
        try:
            return cls(directory, cores or torch.get_num_threads())
        except OSError as err:
            log.warning("not sharing CPU cores with other processes (%s): %s", directory, err)
            return None

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """Mark this process busy for the block (other processes count it when they take their share)."""
        self.enter()
        try:
            yield
        finally:
            self.leave()

    def enter(self) -> None:
        if not self._busy:
            fcntl.flock(self._file, fcntl.LOCK_SH)
            self._busy, self._checked = True, 0.0

    def leave(self) -> None:
        if self._busy:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._busy = False

    def busy_others(self) -> int:
        """Other processes that hold their busy mark now; files of processes that are gone are removed."""
        count = 0
        for path in self.directory.glob("*.busy"):
            if path.name == Path(self._file.name).name:
                continue
            try:
                with open(path) as other:
                    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    fcntl.flock(other, fcntl.LOCK_UN)
            except BlockingIOError:
                count += 1
            except OSError:
                continue  # removed meanwhile
            else:
                _remove_if_gone(path)
        return count

    def threads(self) -> int:
        """This process's share of the cores now (looked up at most every ``RECHECK_S``)."""
        now = time.monotonic()
        if now - self._checked >= RECHECK_S:
            self._checked = now
            self._threads = max(1, self.cores // (1 + self.busy_others()))
        return self._threads

    def apply(self) -> None:
        """Set the calling thread's torch threads to this process's share (OpenMP's count is per thread)."""
        import torch

        n = self.threads()
        if torch.get_num_threads() != n:
            torch.set_num_threads(n)

    def at_layer(self) -> None:
        """Before a transformer layer's forward: re-take this process's share while it is busy."""
        if self._busy:
            self.apply()

    def follow(self, model: Any) -> None:
        """Re-take this process's share before each of ``model``'s transformer layers (its ``layers`` list,
        else the whole model): a prefill or a micro-batch lasts long enough for a neighbour to start or stop
        working meanwhile. Most calls only read the clock (see ``threads``)."""
        layers = next((m for name, m in model.named_modules() if name.split(".")[-1] == "layers"), None)
        for module in layers if layers is not None else [model]:
            module.register_forward_pre_hook(lambda *_: self.at_layer())

    def close(self) -> None:
        self.leave()
        self._file.close()
        with contextlib.suppress(OSError):
            os.unlink(self._file.name)


def _remove_if_gone(path: Path) -> None:
    try:
        pid = int(path.stem)
        os.kill(pid, 0)
    except ProcessLookupError:
        with contextlib.suppress(OSError):
            path.unlink()
    except (ValueError, PermissionError):
        pass
