"""Who trains a step together: a worker's own ranks (``local_roster``), or the trainer workers of a gang over
hosts, whose rendezvous goes through the object store they already share (no service of its own).

Every member rewrites its record (``gangs/<gang>/members/<worker>.json``) each ``BEAT_S``, and reads the others':
a member is alive while its record's count moves on (by the reader's own clock: hosts' clocks need not agree). The
worker that takes a step leads it:

1. it writes the step (``step.json`` and its sequences) and invites every live member (``invites/<worker>.json``);
2. each invited member answers (``replies/<worker>.json``): it joins when idle, declines when busy with a step of
   its own (no two leaders wait on each other), saying which world its ranks are in and what they hold;
3. the leader writes the ``roster.json``: the members that joined (itself among them), ranked by worker id, and
   whether they go on in the world they are in (the same members as last step, whoever leads) or form a new one,
   whose rendezvous the holder of rank 0 serves at the address and port it offered;
4. each member readies its ranks (loaded, the step's start at hand) and says so (``ready/<worker>.json``); they
   join a new world and train. The leader's first rank writes the step's checkpoint, where its publish runs.

A member that stops beating for ``STALE_S`` is gone: its peers end the attempt (their ranks are recycled) and the
step's retry forms a gang of those that remain.
"""

from __future__ import annotations

import itertools
import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

import psutil
from minio.error import S3Error
from pydantic import BaseModel, ConfigDict

from activities.gang.local_ranks import LocalRanks
from activities.object_store import MISSING_CODES, ObjectStore
from host.processes import HOST, free_port
from schemas import layout
from schemas.errors import StoreError
from schemas.settings import GangSettings, Sharding

log = logging.getLogger(__name__)

BEAT_S = 1.0
"""How often a member rewrites its record and reads the others'."""
STALE_S = 8.0
"""A member whose record has not moved on this long is gone (killed, frozen, cut off)."""
POLL_S = 0.25
"""How often an invitation, an answer or a roster is looked for."""
ANSWER_S = 10.0
"""How long a leader waits for a live member to answer an invitation (an idle one answers within a second)."""
REQUEST_TIMEOUT_S = 5.0
"""A gang record's request waits this long for the store: a cut-off host finds out in seconds."""

T = TypeVar("T", bound=BaseModel)


class MemberRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    worker_id: str
    address: str
    ranks: int
    count: int
    """Moves on with every beat."""
    state: Literal["idle", "leading", "following"] = "idle"
    attempt: str = ""


class Invite(BaseModel):
    attempt: str
    leader: str


class Reply(BaseModel):
    joins: bool
    ranks: int = 0
    address: str = ""
    port: int = 0
    """A free port at ``address``, for the rendezvous should this member hold rank 0 of a new world."""
    world: str | None = None
    """The world this member's ranks are joined to (None: none)."""
    holding: str | None = None
    """What its ranks hold (a staging id)."""


class Member(BaseModel):
    worker_id: str
    first_rank: int
    ranks: int


class Roster(BaseModel):
    """One attempt's world: where rank 0 serves the rendezvous, and who trains in it."""

    model_config = ConfigDict(frozen=True)

    world: str
    """Names the world; ranks already joined to it go on in it when ``fresh`` is False."""
    fresh: bool
    address: str
    port: int
    members: tuple[Member, ...]
    sharding: Sharding
    timeout_s: float
    keep: bool = False
    """Every rank holds the step's start already (the world's last step, staged by the leader)."""
    aborted: str = ""
    """Not trained after all (the leader says why): the invited members go back to idle."""

    @property
    def world_size(self) -> int:
        return sum(m.ranks for m in self.members)

    def member(self, worker_id: str) -> Member | None:
        return next((m for m in self.members if m.worker_id == worker_id), None)

    @property
    def remote(self) -> bool:
        return len(self.members) > 1


class Ready(BaseModel):
    ok: bool
    error: str = ""


def local_roster(local: LocalRanks, settings: GangSettings, worker_id: str) -> Roster:
    """The world of this worker's ranks alone: the one they joined, or a new one on loopback."""
    members = (Member(worker_id=worker_id, first_rank=0, ranks=settings.ranks),)
    if local.world is not None and local.world_members == (worker_id,):
        return Roster(world=local.world, fresh=False, address=HOST, port=0, members=members,
                      sharding=settings.shard, timeout_s=settings.collective_timeout_s)  # fmt: skip
    return Roster(world=uuid.uuid4().hex[:12], fresh=True, address=HOST, port=free_port(), members=members,
                  sharding=settings.shard, timeout_s=settings.collective_timeout_s)  # fmt: skip


def gang_address(store_endpoint: str) -> str:
    """This host's address on its route to the object store: where the other hosts of the gang reach it."""
    host, _, port = store_endpoint.removeprefix("http://").removeprefix("https://").rpartition(":")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host or store_endpoint, int(port or 80)))  # no packet is sent: only a route is chosen
        return str(probe.getsockname()[0])


def interface_of(address: str) -> str:
    """The network interface holding ``address`` (gloo's and NCCL's ``*_SOCKET_IFNAME``)."""
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == address for a in addresses):
            return name
    raise ValueError(
        f"no network interface of this host holds {address}; set --gang-address to one that does"
    )


def free_port_on(address: str) -> int:
    """A port no one listens on at ``address`` now (rank 0's rendezvous store binds it next)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


@dataclass
class _Seen:
    count: int
    moved_at: float


class Board:
    """A gang's records in the object store, as one member reads and writes them."""

    def __init__(self, store: ObjectStore, gang: str, worker_id: str) -> None:
        self.store, self.gang, self.worker_id = store, gang, worker_id

    def read(self, key: str) -> bytes | None:
        try:
            return self.store.get_bytes(key)
        except StoreError as err:
            if isinstance(err.__cause__, S3Error) and err.__cause__.code in MISSING_CODES:
                return None
            raise

    def write(self, key: str, record: BaseModel) -> None:
        self.store.put_bytes(key, record.model_dump_json().encode())

    def members(self) -> list[MemberRecord]:
        out = []
        for key in self.store.list(layout.gang_prefix(self.gang) + "members/"):
            data = self.read(key)
            if data is not None:
                out.append(MemberRecord.model_validate_json(data))
        return out

    def attempt_key(self, attempt: str, name: str) -> str:
        return layout.gang_attempt_prefix(self.gang, attempt) + name

    def answers(self, attempt: str, kind: str, record: type[T], workers: list[str]) -> dict[str, T]:
        """The ``kind`` records (``replies``, ``ready``) of ``workers`` written so far for ``attempt``."""
        out = {}
        for worker in workers:
            data = self.read(self.attempt_key(attempt, f"{kind}/{worker}.json"))
            if data is not None:
                out[worker] = record.model_validate_json(data)
        return out


class GangMember:
    """This worker as a member of its gang: its record beaten, the others' watched, its invitations handed to
    ``on_invite`` (on a thread of its own, one at a time)."""

    def __init__(
        self,
        board: Board,
        address: str,
        ranks: int,
        on_invite: Callable[[Invite], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.board, self.address, self.ranks = board, address, ranks
        self.on_invite = on_invite
        self.clock = clock
        self.state: Literal["idle", "leading", "following"] = "idle"
        self.attempt = ""
        self._seen: dict[str, _Seen] = {}
        self._records: dict[str, MemberRecord] = {}
        self._lock = threading.Lock()
        self._counts = itertools.count(1)
        self._answered: set[str] = set()
        self._stopped = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._beat, name="gang-beat", daemon=True).start()
        threading.Thread(target=self._invitations, name="gang-invitations", daemon=True).start()

    def stop(self) -> None:
        """Leave the gang: no more beats, and this member's record goes (the others stop inviting it at once)."""
        self._stopped.set()
        try:
            self.board.store.delete_prefix(layout.gang_member_key(self.board.gang, self.worker_id))
        except StoreError as err:  # its record goes stale instead
            log.warning("gang %s: could not remove this member's record: %s", self.board.gang, err)

    @property
    def worker_id(self) -> str:
        return self.board.worker_id

    def _beat(self) -> None:
        key = layout.gang_member_key(self.board.gang, self.worker_id)
        while not self._stopped.is_set():
            try:
                record = MemberRecord(worker_id=self.worker_id, address=self.address, ranks=self.ranks,
                                      count=next(self._counts), state=self.state, attempt=self.attempt)  # fmt: skip
                self.board.write(key, record)
                self.observe(self.board.members())
            except StoreError as err:  # cut off from the store: the others will find this member gone
                log.warning("gang %s: beat failed: %s", self.board.gang, err)
            self._stopped.wait(BEAT_S)

    def observe(self, records: list[MemberRecord]) -> None:
        now = self.clock()
        with self._lock:
            for record in records:
                seen = self._seen.get(record.worker_id)
                if seen is None or seen.count != record.count:
                    self._seen[record.worker_id] = _Seen(record.count, now)
                self._records[record.worker_id] = record

    def alive(self, worker_id: str) -> bool:
        with self._lock:
            seen = self._seen.get(worker_id)
            return seen is not None and self.clock() - seen.moved_at <= STALE_S

    def others(self) -> list[MemberRecord]:
        """The live members but this one, by worker id."""
        with self._lock:
            records = sorted(self._records.values(), key=lambda r: r.worker_id)
        return [r for r in records if r.worker_id != self.worker_id and self.alive(r.worker_id)]

    def _invitations(self) -> None:
        key = layout.gang_invite_key(self.board.gang, self.worker_id)
        while not self._stopped.wait(POLL_S):
            try:
                data = self.board.read(key)
            except StoreError:
                continue
            if data is None:
                continue
            invite = Invite.model_validate_json(data)
            if invite.attempt in self._answered or not self.alive(invite.leader):
                continue
            self._answered.add(invite.attempt)
            try:
                self.on_invite(invite)
            except Exception:  # a follow that failed has said so to its leader; this member goes on
                log.exception("gang %s: following attempt %s failed", self.board.gang, invite.attempt)
