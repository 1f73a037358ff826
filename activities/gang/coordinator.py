"""One attempt's gang, formed: as its leader (the worker whose activity took the step) or as a member the leader
invited (activities/gang/rendezvous.py says how they find each other).

A worker without a gang name leads a world of its own ranks alone. With one, it invites the members that are alive;
those that join train the step with it, and while they do, each watches the others' records: a member gone ends
the attempt on every host (``GangLostError``), their ranks recycled, and the retry forms a gang of the rest.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from activities.checkpoints import (
    TrainerState,
    check_checkpoint_fits,
    download_checkpoint,
    read_trainer_state,
    run_dir,
    stage_checkpoint,
)
from activities.gang.initial import initial_adapter
from activities.gang.local_ranks import LocalRanks, Watch, World
from activities.gang.rendezvous import (
    ANSWER_S,
    POLL_S,
    REQUEST_TIMEOUT_S,
    STALE_S,
    Board,
    GangMember,
    Invite,
    Member,
    MemberRecord,
    Ready,
    Reply,
    Roster,
    free_port_on,
    gang_address,
    interface_of,
    local_roster,
)
from activities.gang.shared_step import SharedStep, sequences_bytes, sequences_from
from activities.object_store import ObjectStore
from activities.tokenize import TrainSequence
from schemas import layout
from schemas.config import ModelSpec
from schemas.errors import GangLostError, StagedStateLostError
from schemas.refs import CheckpointRef
from schemas.settings import GangSettings

log = logging.getLogger(__name__)

READY_S = 900.0
"""How long the leader waits for the members it took to ready their ranks (a large model loads for minutes)."""


@dataclass(frozen=True)
class Start:
    """Where a step starts, as its leader knows it."""

    held: str | None
    """The staging the leader's ranks hold that is the start (None: they hold something else)."""
    checkpoint: CheckpointRef | None
    """The published checkpoint it is (None: a fresh adapter from the seed, or a staging not yet published)."""
    directory: Callable[[], Path]
    """The leader's own files of it, fetched or made when first needed."""
    shareable: bool = True
    """Whether another host can have it too: a staging not yet published lives on the leader alone."""


@dataclass(frozen=True)
class Formed:
    roster: Roster
    restore: Path | None
    """The files every rank of this worker restores the start from; None: they hold it already."""
    watch: Watch
    """Raises once a member of the gang is gone, or the attempt is cancelled."""


def start_files(
    store: ObjectStore,
    staging_root: Path,
    run_id: str,
    model: ModelSpec,
    checkpoint: CheckpointRef | None,
    seed: int,
) -> Path:
    """A step's start as files on this host: the checkpoint downloaded (and checked against the run's model), or
    a fresh adapter from ``seed`` (activities/gang/initial.py)."""
    inputs = run_dir(staging_root, run_id) / ".inputs"
    if checkpoint is not None:
        local = inputs / layout.step_name(checkpoint.step)
        download_checkpoint(store, checkpoint, local)
        check_checkpoint_fits(read_trainer_state(local), model, checkpoint.uri)
        return local
    local = inputs / f"initial-{seed}"
    if not local.is_dir():
        state = TrainerState(run_id=run_id, step=0, base_model=model.base_model, seed=seed)
        stage_checkpoint(local, initial_adapter(model, seed).write, state, {})
    return local


class Coordinator:
    """The worker's side of its gang: its ranks, and with a gang name, its membership."""

    def __init__(
        self,
        settings: GangSettings,
        local: LocalRanks,
        store: ObjectStore,
        staging_root: Path,
        worker_id: str,
        lock: threading.Lock,
    ) -> None:
        self.settings, self.local, self.store = settings, local, store
        self.staging_root, self.worker_id, self.lock = staging_root, worker_id, lock
        self.member: GangMember | None = None
        self.address = ""
        self.attempt = ""
        """The attempt this worker leads (its files' prefix)."""
        if settings.gang is not None:
            self.address = settings.address or gang_address(store.endpoint)
            local.interface = interface_of(self.address)
            # Records ride out no outage: a member that cannot reach the store is gone, and finds out in seconds.
            board_store = ObjectStore(store.settings, outage_s=1.0, read_timeout_s=REQUEST_TIMEOUT_S)
            self.member = GangMember(Board(board_store, settings.gang, worker_id), self.address, settings.ranks,
                                     self.follow)  # fmt: skip
            self.member.start()

    def close(self) -> None:
        """Leave the gang (if any) and end the ranks."""
        if self.member is not None:
            self.member.stop()
        self.local.recycle()

    # ---- leading ------------------------------------------------------------------------------------
    def form(
        self,
        step: SharedStep,
        sequences: list[TrainSequence],
        batches: list[int],
        start: Start,
        should_stop: Callable[[], bool] | None,
    ) -> Formed:
        """The gang for ``step``, its ranks loaded, joined and with their start at hand. Call holding the lock."""

        def stopped() -> None:
            if should_stop is not None and should_stop():
                raise InterruptedError("training cancelled")

        # First the ranks that hold this model (those running, else fresh ones): the world they are in is known.
        self.local.load(step.model, step.precision, stopped)
        others = self.member.others() if self.member is not None else []
        replies: dict[str, Reply] = {}
        if others:
            replies = self._invite(step, sequences, batches, others, stopped)
        joined = sorted(
            w for w, r in replies.items() if r.joins and self.member is not None and self.member.alive(w)
        )
        roster = self._roster([(w, replies[w]) for w in joined])
        joined = [m.worker_id for m in roster.members if m.worker_id != self.worker_id]
        keep = (
            not roster.fresh
            and start.held is not None
            and self.local.holding == start.held
            and all(replies[w].holding == start.held for w in joined)
        )
        if not keep and roster.remote and not start.shareable:
            self._post(
                roster.model_copy(update={"aborted": "the step's start is a staging on the leader alone"})
            )
            self.done()
            raise StagedStateLostError(
                f"trainer {self.worker_id}'s gang no longer holds step {step.step - 1} of run {step.run_id} in memory "
                "and the other hosts cannot read its staged files; train from its checkpoint once it is manifested"
            )
        roster = roster.model_copy(update={"keep": keep})
        watch = self._watcher(roster, stopped)
        try:
            if others:
                self._post(roster)  # to every member invited: those it leaves out go back to idle
            if roster.fresh and self.local.world is not None:
                self.local.recycle()  # ranks of another world: never reused
                self.local.load(step.model, step.precision, watch)
            restore = None if keep else start.directory()
            if roster.remote:
                self._await_ready(roster, watch)
            if roster.fresh:
                self.local.join(self._world(roster, self.worker_id), watch)
        except BaseException:
            self.local.recycle()
            raise
        return Formed(roster, restore, watch)

    def _invite(
        self,
        step: SharedStep,
        sequences: list[TrainSequence],
        batches: list[int],
        others: list[MemberRecord],
        stopped: Watch,
    ) -> dict[str, Reply]:
        """Invite the live members to ``step``; their replies (those that answered in time)."""
        assert self.member is not None
        board = self.member.board
        self.attempt = f"{step.run_id}-{step.step}-{uuid.uuid4().hex[:8]}"
        self.member.state, self.member.attempt = "leading", self.attempt
        board.store.put_bytes(board.attempt_key(self.attempt, "sequences.safetensors"),
                              sequences_bytes(sequences, batches))  # fmt: skip
        board.store.put_bytes(board.attempt_key(self.attempt, "step.json"), step.model_dump_json().encode())
        invited = [r.worker_id for r in others]
        for worker in invited:
            invite = Invite(attempt=self.attempt, leader=self.worker_id)
            board.write(layout.gang_invite_key(board.gang, worker), invite)
        deadline = time.monotonic() + ANSWER_S
        replies: dict[str, Reply] = {}
        while time.monotonic() < deadline:
            stopped()
            replies = board.answers(self.attempt, "replies", Reply, invited)
            if all(w in replies or not self.member.alive(w) for w in invited):
                break
            time.sleep(POLL_S)
        declined = sorted(set(invited) - {w for w, r in replies.items() if r.joins})
        log.info("gang %s, attempt %s: invited %s; declined or silent: %s", board.gang, self.attempt, invited,
                 declined or "none")  # fmt: skip
        return replies

    def _roster(self, joined: list[tuple[str, Reply]]) -> Roster:
        """The members that joined and this worker, ranked by worker id (so a world outlives a change of leader);
        the world they are all in already, else a new one whose rendezvous the holder of rank 0 serves."""
        if not joined:
            return local_roster(self.local, self.settings, self.worker_id)
        mine = Reply(
            joins=True, ranks=self.settings.ranks, address=self.address, port=free_port_on(self.address)
        )
        replies = dict([(self.worker_id, mine), *joined])
        members: list[Member] = []
        for worker in sorted(replies):
            members.append(Member(worker_id=worker, first_rank=sum(m.ranks for m in members),
                                  ranks=replies[worker].ranks))  # fmt: skip
        names = tuple(m.worker_id for m in members)
        world = self.local.world
        same = (
            world is not None
            and self.local.world_members == names
            and all(r.world == world for _, r in joined)
        )
        first = replies[names[0]]
        return Roster(
            world=world if same and world is not None else uuid.uuid4().hex[:12],
            fresh=not same,
            address=first.address,
            port=first.port,
            members=tuple(members),
            sharding=self.settings.shard,
            timeout_s=self.settings.collective_timeout_s,
        )

    def _post(self, roster: Roster) -> None:
        assert self.member is not None
        self.member.board.write(self.member.board.attempt_key(self.attempt, "roster.json"), roster)

    def _await_ready(self, roster: Roster, watch: Watch) -> None:
        assert self.member is not None
        others = [m.worker_id for m in roster.members if m.worker_id != self.worker_id]
        deadline = time.monotonic() + READY_S
        while True:
            watch()
            ready = self.member.board.answers(self.attempt, "ready", Ready, others)
            failed = {w: r.error for w, r in ready.items() if not r.ok}
            if failed:
                raise GangLostError(f"gang members could not ready their ranks: {failed}")
            if len(ready) == len(others):
                return
            if time.monotonic() > deadline:
                raise GangLostError(
                    f"gang members {sorted(set(others) - set(ready))} not ready in {READY_S:.0f} s"
                )
            time.sleep(POLL_S)

    def done(self) -> None:
        """The attempt is over here: the files of the one it led go (in the background)."""
        if self.member is None:
            return
        self.member.state, self.member.attempt = "idle", ""
        if self.attempt:
            prefix = layout.gang_attempt_prefix(self.member.board.gang, self.attempt)
            store = self.member.board.store
            threading.Thread(target=lambda: _quietly(store.delete_prefix, prefix), daemon=True).start()
            self.attempt = ""

    def _watcher(self, roster: Roster, stopped: Watch) -> Watch:
        """Raises once a member of ``roster`` but this worker stopped beating, or the attempt is cancelled."""
        others = [m.worker_id for m in roster.members if m.worker_id != self.worker_id]

        def watch() -> None:
            stopped()
            if self.member is None:
                return
            for worker in others:
                if not self.member.alive(worker):
                    raise GangLostError(
                        f"gang member {worker} has not beaten for {STALE_S:.0f} s (killed, frozen or cut off); "
                        "the attempt ends and its retry trains with the members that remain"
                    )

        return watch

    def _world(self, roster: Roster, worker_id: str) -> World:
        me = roster.member(worker_id)
        assert me is not None
        names = tuple(m.worker_id for m in roster.members)
        return World(roster.world, roster.address, roster.port, me.first_rank, roster.world_size, names,
                     roster.sharding, roster.timeout_s)  # fmt: skip

    # ---- following ----------------------------------------------------------------------------------
    def follow(self, invite: Invite) -> None:
        """Answer ``invite``: decline when busy, else join the leader's step and train this worker's ranks' share."""
        assert self.member is not None
        board = self.member.board
        if not self.lock.acquire(
            blocking=False
        ):  # training a step of its own: no two leaders wait on each other
            board.write(
                board.attempt_key(invite.attempt, f"replies/{self.worker_id}.json"), Reply(joins=False)
            )
            return
        self.member.state, self.member.attempt = "following", invite.attempt
        try:
            self._follow(invite)
        finally:
            self.member.state, self.member.attempt = "idle", ""
            self.lock.release()

    def _follow(self, invite: Invite) -> None:
        assert self.member is not None
        board = self.member.board
        step = SharedStep.model_validate_json(
            board.store.get_bytes(board.attempt_key(invite.attempt, "step.json"))
        )
        usable = self.local.holds(
            step.model, step.precision
        )  # its world goes on only with ranks of this model
        reply = Reply(joins=True, ranks=self.settings.ranks, address=self.address, port=free_port_on(self.address),
                      world=self.local.world if usable else None, holding=self.local.holding if usable else None)  # fmt: skip
        board.write(board.attempt_key(invite.attempt, f"replies/{self.worker_id}.json"), reply)
        roster = None
        while roster is None:
            if not self.member.alive(invite.leader):
                return
            data = board.read(board.attempt_key(invite.attempt, "roster.json"))
            roster = Roster.model_validate_json(data) if data is not None else None
            time.sleep(0 if roster is not None else POLL_S)
        if roster.aborted or roster.member(self.worker_id) is None:
            return
        leading = tuple(m for m in roster.members if m.worker_id == invite.leader)
        leader = roster.model_copy(update={"members": leading})
        watch = self._watcher(leader, lambda: None)
        ready_key = board.attempt_key(invite.attempt, f"ready/{self.worker_id}.json")
        try:
            sequences, batches = sequences_from(
                board.store.get_bytes(board.attempt_key(invite.attempt, "sequences.safetensors"))
            )
            if roster.fresh and self.local.world is not None:
                self.local.recycle()
            self.local.load(step.model, step.precision, watch)
            restore = None
            if not roster.keep:
                restore = start_files(
                    self.store, self.staging_root, step.run_id, step.model, step.checkpoint, step.seed
                )
            board.write(ready_key, Ready(ok=True))
            if roster.fresh:
                self.local.join(self._world(roster, self.worker_id), watch)
            command = step.command(sequences, batches, restore, None, roster.world_size)
            self.local.train([command] * self.settings.ranks, None, watch)
            self.local.holding = step.staged_id
            log.info(
                "followed step %d of run %s in a gang of %d ranks", step.step, step.run_id, roster.world_size
            )
        except BaseException as err:
            self.local.recycle()
            _quietly(board.write, ready_key, Ready(ok=False, error=f"{type(err).__name__}: {str(err)[:500]}"))
            raise


def _quietly(action: Callable[..., object], *args: object) -> None:
    try:
        action(*args)
    except Exception as err:  # best effort: the leader also sees this member gone or its ranks fail
        log.warning("gang: %s failed: %s", getattr(action, "__name__", action), err)
