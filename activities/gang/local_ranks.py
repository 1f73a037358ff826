"""A trainer worker's own rank processes: started, loaded, joined to a world, given steps, watched and recycled.

Each rank is a child process of the worker (``python -m activities.gang.rank``, host/processes.py's
``ChildProcess``: it gets SIGTERM when the worker dies, and exits when its connection closes). It connects back to
the worker's listener (loopback, a random key) and answers each command. While the worker waits for an answer it
watches every rank: a rank that exits, or that sends nothing (not even the beat its own thread sends every second)
for ``SILENCE_S`` (stopped, frozen), ends the wait with ``GangLostError``; so does the caller's ``watch`` (the
attempt cancelled, another host of the gang gone). A failure of any kind recycles every rank (killed, started
afresh for the next attempt): a world in which a collective failed is never used again, and a hung rank's retry gets
fresh processes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, Listener
from pathlib import Path
from typing import NoReturn, TypeVar

from activities.gang.messages import (
    Failed,
    Hello,
    Join,
    Joined,
    Load,
    Loaded,
    Progress,
    ToRank,
    Train,
    Trained,
)
from activities.gang.rank import ENV_CONTROL, ENV_KEY, ENV_LOCAL_RANK
from activities.trainer import ENV_BACKEND
from activities.training import OutOfMemory
from host.processes import HOST, ChildProcess
from schemas.config import ModelSpec
from schemas.errors import GangLostError, NonFiniteUpdateError, RunSpecError
from schemas.settings import GangSettings, Sharding

log = logging.getLogger(__name__)

SILENCE_S = 10.0
"""A rank that sends nothing this long (it beats every second) is stopped or frozen: the attempt fails."""
START_S = 300.0
"""How long a started rank may take to connect back (Python and torch imported on a busy host)."""
FAILURE_GRACE_S = 1.0
"""After a first sign of failure, how long to gather the others' reports: a rank's own error says more than
its peers' broken collectives."""
POLL_S = 0.2

Watch = Callable[[], None]
"""Raises to end a wait: the attempt was cancelled, or a peer host of the gang is gone."""
OnProgress = Callable[[int, int, int], None]
T = TypeVar("T")


@dataclass(frozen=True)
class World:
    """A world for this worker's ranks to join: rank 0 serves its rendezvous at ``address:port``."""

    name: str
    address: str
    port: int
    first_rank: int
    """This worker's first rank in it."""
    world_size: int
    members: tuple[str, ...]
    """The workers whose ranks it holds, in rank order."""
    sharding: Sharding
    timeout_s: float


@dataclass(frozen=True)
class _Connected:
    """A rank's connection, once it said which rank it is."""

    conn: Connection
    hello: Hello


@dataclass
class _Rank:
    child: ChildProcess
    device: str
    conn: Connection | None = None
    heard: float = 0.0
    done: int = 0


class LocalRanks:
    """The worker's ``settings.ranks`` rank processes (none until the first step needs them)."""

    def __init__(self, settings: GangSettings, log_dir: Path, interface: str | None = None) -> None:
        self.settings = settings
        self.log_dir = log_dir
        self.interface = interface
        """The network interface gloo uses between hosts (``GLOO_SOCKET_IFNAME``); None: loopback only."""
        self._key = os.urandom(32)
        self._listener = Listener((HOST, 0), authkey=self._key)
        self._inbox: queue.Queue[tuple[int, int, float, object]] = queue.Queue()
        """(pid, local rank, when it arrived, message) of every rank's every message."""
        self._ranks: list[_Rank] = []
        self._generation = 0
        self.model: str | None = None
        """What the ranks have loaded (model, LoRA shape, precision); None: no ranks."""
        self.world: str | None = None
        """The world the ranks are joined to; None: not joined."""
        self.world_members: tuple[str, ...] = ()
        """The workers whose ranks are in that world, in rank order."""
        self.holding: str | None = None
        """What the ranks' model holds (a staging id): kept only while they live and the world stands."""
        self.base_fraction = 1.0
        threading.Thread(target=self._accept, name="gang-accept", daemon=True).start()

    # ---- lifecycle ----------------------------------------------------------------------------------
    def devices(self) -> list[str]:
        if self.settings.devices:
            return list(self.settings.devices)
        import torch

        cuda = torch.cuda.is_available()
        return [f"cuda:{i}" if cuda else "cpu" for i in range(self.settings.ranks)]

    @staticmethod
    def model_key(model: ModelSpec, precision: str) -> str:
        return f"{model.base_model}|{model.lora.model_dump_json()}|{precision}"

    def holds(self, model: ModelSpec, precision: str) -> bool:
        """Whether the ranks run, every one, with ``model`` in ``precision`` loaded."""
        return self.model == self.model_key(model, precision) and all(r.child.alive() for r in self._ranks)

    def load(self, model: ModelSpec, precision: str, watch: Watch) -> None:
        """Ranks holding ``model`` in ``precision``: those running, or fresh ones (the old recycled)."""
        key = self.model_key(model, precision)
        if self.holds(model, precision):
            return
        self.recycle()
        try:
            self._start(watch)
            devices = [r.device for r in self._ranks]
            cores = len(os.sched_getaffinity(0))
            for rank in self._ranks:
                sharing = devices.count(rank.device)
                threads = max(1, cores // sharing) if rank.device == "cpu" else max(1, cores // len(devices))
                self._send(rank, Load(model, precision, rank.device, threads, sharing))
            self._collect(Loaded, watch)
            self.model = key
        except BaseException:
            self.recycle()
            raise

    def join(self, world: World, watch: Watch) -> None:
        """Join the loaded ranks to ``world``."""
        try:
            for i, rank in enumerate(self._ranks):
                command = Join(world.address, world.port, world.first_rank + i, world.world_size, world.sharding,
                               world.timeout_s)  # fmt: skip
                self._send(rank, command)
            joined = self._collect(Joined, watch)
            self.base_fraction = joined[0].base_fraction
            self.world, self.world_members = world.name, world.members
        except BaseException:
            self.recycle()
            raise

    def train(self, commands: Sequence[Train], on_progress: OnProgress | None, watch: Watch) -> list[Trained]:
        """One step on the joined ranks (``commands[i]`` to local rank ``i``); each rank's answer, in order (the
        stats in each are the gang's sums). Any failure recycles the ranks."""
        self.holding = None
        try:
            for rank, command in zip(self._ranks, commands, strict=True):
                rank.done = 0
                self._send(rank, command)
            return self._collect(Trained, watch, on_progress)
        except BaseException:
            self.recycle()
            raise

    def rank_pids(self) -> tuple[int, ...]:
        """The rank processes' ids, in local rank order (none before the first step)."""
        return tuple(r.child.proc.pid for r in self._ranks if r.child.proc is not None)

    def recycle(self) -> None:
        """Kill every rank (stopped ones too) and forget what they held."""
        self._generation += 1
        for rank in self._ranks:
            if rank.conn is not None:
                with contextlib.suppress(OSError):
                    rank.conn.close()
            rank.child.kill()
        if self._ranks:
            log.info("gang ranks recycled")
        self._ranks = []
        self.model = self.world = self.holding = None
        self.world_members = ()

    def _start(self, watch: Watch) -> None:
        env = {**os.environ, ENV_CONTROL: f"{HOST}:{self._listener.address[1]}", ENV_KEY: self._key.hex()}
        env[ENV_BACKEND] = "torch"  # torch + peft: unsloth patches the model its own way, FSDP's is not its
        if self.interface is not None:
            env["GLOO_SOCKET_IFNAME"] = env["NCCL_SOCKET_IFNAME"] = self.interface
        else:
            env["GLOO_SOCKET_IFNAME"] = "lo"
        for i, device in enumerate(self.devices()):
            child = ChildProcess(
                [sys.executable, "-m", "activities.gang.rank"],
                self.log_dir / f"rank-{os.getpid()}-{i}.log",
                name=f"gang rank {i}",
                env={**env, ENV_LOCAL_RANK: str(i)},
                tied_to_parent=True,
            )
            child.spawn()
            self._ranks.append(_Rank(child, device))
        deadline = time.monotonic() + START_S
        while any(r.conn is None for r in self._ranks):
            self._check(watch)
            if time.monotonic() > deadline:
                raise GangLostError(f"gang ranks did not connect within {START_S:.0f} s")
            self._take(POLL_S, None)

    def _accept(self) -> None:
        """Each rank's connection, once it says which it is: its messages go to the inbox."""
        while True:
            try:
                conn = self._listener.accept()
                hello = conn.recv()
            except (OSError, EOFError, ValueError) as err:  # a failed handshake: not one of ours
                log.warning("gang listener: a connection was refused (%s)", err)
                continue
            if not isinstance(hello, Hello):
                conn.close()
                continue
            threading.Thread(target=self._read, args=(conn, hello), daemon=True).start()

    def _read(self, conn: Connection, hello: Hello) -> None:
        self._inbox.put((hello.pid, hello.local_rank, time.monotonic(), _Connected(conn, hello)))
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                return  # the rank exited (its exit is seen by the waits) or was recycled
            self._inbox.put((hello.pid, hello.local_rank, time.monotonic(), message))

    # ---- waiting ------------------------------------------------------------------------------------
    def _send(self, rank: _Rank, command: ToRank) -> None:
        assert rank.conn is not None
        try:
            rank.conn.send(command)
        except OSError as err:
            raise GangLostError(f"{rank.child.name} cannot be reached: {err}") from err

    def _collect(self, kind: type[T], watch: Watch, on_progress: OnProgress | None = None) -> list[T]:
        """Every rank's answer of ``kind``, in local rank order, while watching them all."""
        answers: dict[int, T] = {}
        while len(answers) < len(self._ranks):
            for local_rank, message in self._take(
                POLL_S, on_progress
            ):  # first: every beat that came is counted
                if isinstance(message, kind):
                    answers[local_rank] = message
                elif isinstance(message, Failed):
                    raise self._failure(message, local_rank)
            self._check(watch)
        return [answers[i] for i in range(len(self._ranks))]

    def _take(self, timeout: float, on_progress: OnProgress | None) -> list[tuple[int, object]]:
        """The messages of the current ranks that arrive within ``timeout``; connections are matched here."""
        out: list[tuple[int, object]] = []
        try:
            item = self._inbox.get(timeout=timeout)
        except queue.Empty:
            return out
        items = [item]
        while not self._inbox.empty():
            items.append(self._inbox.get_nowait())
        pids = {r.child.proc.pid: i for i, r in enumerate(self._ranks) if r.child.proc is not None}
        for pid, local_rank, arrived, message in items:
            if pids.get(pid) != local_rank:  # a rank of a recycled generation
                if isinstance(message, _Connected):
                    message.conn.close()
                continue
            if isinstance(message, _Connected):
                self._ranks[local_rank].conn = message.conn
                self._ranks[local_rank].heard = arrived
                continue
            self._ranks[local_rank].heard = max(self._ranks[local_rank].heard, arrived)
            if isinstance(message, Progress):
                self._progress(local_rank, message, on_progress)
            else:
                out.append((local_rank, message))
        return out

    def _progress(self, local_rank: int, message: Progress, on_progress: OnProgress | None) -> None:
        """The step advanced once every local rank is past a micro-batch."""
        before = min(r.done for r in self._ranks)
        self._ranks[local_rank].done = message.done
        now = min(r.done for r in self._ranks)
        if now > before and on_progress is not None:
            on_progress(now, message.of, message.micro_batch)

    def _check(self, watch: Watch) -> None:
        """Raise when a rank exited or went silent, or ``watch`` says the attempt is over."""
        watch()
        now = time.monotonic()
        for i, rank in enumerate(self._ranks):
            proc = rank.child.proc
            if proc is not None and proc.poll() is not None:
                self._raise_reported(f"local rank {i} (pid {proc.pid}) {exit_words(proc.returncode)}", rank)
            if rank.conn is not None and now - rank.heard > SILENCE_S:
                raise GangLostError(
                    f"local rank {i} (pid {proc.pid if proc else '?'}) has sent nothing for {now - rank.heard:.0f} s "
                    "(stopped or frozen); the gang is recycled"
                )

    def _raise_reported(self, what: str, rank: _Rank) -> NoReturn:
        """A rank ended: what it reported before, if anything, else how it ended (its log's tail goes to this
        worker's log: Temporal keeps a retried attempt's failure only up to a few KB)."""
        log.error("%s; the end of its log (%s):\n%s", what, rank.child.log_path, rank.child.log_tail(1500))
        deadline = time.monotonic() + FAILURE_GRACE_S
        while time.monotonic() < deadline:
            for local_rank, message in self._take(POLL_S, None):
                if isinstance(message, Failed):
                    raise self._failure(message, local_rank)
        raise GangLostError(f"{what}; the gang is recycled (its log: {rank.child.log_path})")

    def _failure(self, failed: Failed, local_rank: int) -> Exception:
        """A rank's report as the error the activity raises; a peer's own error wins over a broken collective."""
        if (
            failed.kind == "error"
        ):  # maybe a collective broken by another rank's failure: wait for a better one
            deadline = time.monotonic() + FAILURE_GRACE_S
            while time.monotonic() < deadline:
                for other, message in self._take(POLL_S, None):
                    if isinstance(message, Failed) and message.kind != "error":
                        return self._failure(message, other)
        where = f"local rank {local_rank}"
        if failed.kind == "out_of_memory":
            return OutOfMemory(failed.micro_batch, f"{where}: {failed.message}")
        if failed.kind == "non_finite":
            return NonFiniteUpdateError(failed.message)
        if failed.kind == "bad_input":
            return RunSpecError(f"{where}: {failed.message}")
        return GangLostError(f"{where} failed: {failed.message}; the gang is recycled")


def exit_words(code: int | None) -> str:
    """How a process ended, in words."""
    if code is None:
        return "is running"
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"
