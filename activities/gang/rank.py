"""A rank process of a trainer worker's gang (``python -m activities.gang.rank``, started by
activities/gang/local_ranks.py): it connects back to its worker, loads the model, joins the gang's world and
trains the steps it is given, one at a time, answering each command (activities/gang/messages.py).

It beats every second from a thread of its own, so a stopped or frozen rank goes silent and its worker recycles the
gang; it exits as soon as its worker is gone (the connection closes) and after any failure: a collective that failed
leaves the world unusable, so a failed rank is never given another step.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
import time
from multiprocessing.connection import Client, Connection
from typing import Any

import psutil
import torch
from torch.distributed.tensor import DTensor

from activities import sft
from activities.checkpoints import stage_checkpoint
from activities.gang.collectives import join_world
from activities.gang.messages import (
    Beat,
    Failed,
    FromRank,
    Hello,
    Join,
    Joined,
    Load,
    Loaded,
    Progress,
    Train,
    Trained,
)
from activities.gang.sharded import ShardedTrainer
from activities.training import is_out_of_memory
from schemas.errors import NonFiniteUpdateError, RunSpecError

log = logging.getLogger(__name__)

ENV_CONTROL = "DGRPO_GANG_CONTROL"
"""``host:port`` of the worker's listener this rank connects to."""
ENV_KEY = "DGRPO_GANG_KEY"
"""The listener's key (hex): only the worker's own children connect."""
ENV_LOCAL_RANK = "DGRPO_GANG_LOCAL_RANK"
BEAT_S = 1.0


class Link:
    """The rank's end of its connection: sends from any thread, one at a time; a lost worker ends the process."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._lock = threading.Lock()

    def send(self, message: FromRank) -> None:
        try:
            with self._lock:
                self.conn.send(message)
        except OSError:
            os._exit(3)  # the worker is gone: nothing to train for

    def beat(self) -> None:
        while True:
            time.sleep(BEAT_S)
            self.send(Beat())


class Rank:
    """One rank: its trainer, once loaded."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.trainer: ShardedTrainer | None = None
        self.load: Load | None = None
        self.micro_batch = 0
        """The micro-batch of the step training (an out-of-memory failure reports it)."""

    def on_load(self, command: Load) -> Loaded:
        torch.set_num_threads(command.threads)
        self.load = command
        started = time.monotonic()
        # Read on the CPU: a GPU then holds one layer whole at a time, as fully_shard moves each (or, replicated,
        # the whole model once sharding is decided).
        self.trainer = ShardedTrainer(command.model, command.precision, command.device, load_on="cpu")
        log.info(
            "loaded on %s in %.1f s (%d threads)", command.device, time.monotonic() - started, command.threads
        )
        return Loaded()

    def on_join(self, command: Join) -> Joined:
        assert self.trainer is not None and self.load is not None, "Load first"
        join_world(command.address, command.port, command.rank, command.world_size, self.trainer.device,
                   command.timeout_s)  # fmt: skip
        base = [p for p in self.trainer.model.parameters() if not p.requires_grad]
        whole = sum(p.numel() for p in base)
        self.trainer.shard(command.sharding, self.load.per_device)
        base = [p for p in self.trainer.model.parameters() if not p.requires_grad]
        held = sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in base)
        log.info("rank %d of %d (%s), holding %.3f of the base", command.rank, command.world_size, command.sharding,
                 held / max(whole, 1))  # fmt: skip
        return Joined(base_fraction=held / max(whole, 1))

    def on_train(self, command: Train) -> Trained:
        """Restore, plan with the other ranks, train, gather; the leader's first rank stages the step."""
        trainer = self.trainer
        assert trainer is not None, "Load and Join first"
        if (
            trainer.ranks.world_size != command.world_size
        ):  # never a share trained alone as if it were the step
            raise RuntimeError(
                f"a rank of a world of {trainer.ranks.world_size}, given a step of {command.world_size}"
            )
        if command.restore_from is not None:
            trainer.load_state(command.restore_from)
        everything = command.sequences or [s for _, batch in command.sft_batches for s in batch]
        plan = trainer.plan_memory(everything, command.micro_batch)
        self.micro_batch = trainer.ranks.least(plan.micro_batch)  # every rank runs as many micro-batches
        checkpointing = trainer.ranks.most(int(plan.gradient_checkpointing)) > 0
        trainer.use_gradient_checkpointing(checkpointing)
        started = time.monotonic()
        with PeakMemory(trainer.device) as memory:
            grpo = command.config is not None
            trained = self.train_grpo(trainer, command) if grpo else self.train_sft(trainer, command)
        trained = dataclasses.replace(trained, gradient_checkpointing=checkpointing,
                                      seconds=time.monotonic() - started, peak_bytes=memory.peak)  # fmt: skip
        log.info(
            "step %d trained in %.2f s at micro-batch %d", command.step, trained.seconds, self.micro_batch
        )
        snapshot = trainer.snapshot()  # every rank gathers: the stage's writer needs every shard
        if command.stage is not None:
            stage = command.stage
            state = stage.state.model_copy(update={"micro_batch_size": self.micro_batch})
            if command.sft is not None:
                metrics = {
                    **stage.metrics,
                    "loss": trained.sft_losses[-1],
                    "grad_norm": trained.sft_grad_norms[-1],
                }
            else:
                metrics = {**trained.stats, **stage.metrics, "gradient_checkpointing": float(checkpointing)}
            stage_checkpoint(stage.directory, snapshot.write, state, metrics)
        return trained

    def progress(self, done: int, of: int, micro_batch: int) -> None:
        self.link.send(Progress(done, of, micro_batch))

    def train_grpo(self, trainer: ShardedTrainer, command: Train) -> Trained:
        assert command.config is not None
        stats = trainer.train_step(
            command.sequences, command.config, command.step, self.micro_batch, self.progress
        )
        return Trained({k: float(v) for k, v in vars(stats).items()}, self.micro_batch, False, 0.0)

    def train_sft(self, trainer: ShardedTrainer, command: Train) -> Trained:
        assert command.sft is not None
        done = sft.SftStats()
        sft.train_batches(trainer, command.sft_batches, command.sft, command.step, self.micro_batch, done,
                          self.progress)  # fmt: skip
        stats = {"n_trainable_tokens": float(done.n_trainable_tokens)}
        return Trained(stats, self.micro_batch, False, 0.0, 0, done.losses, done.grad_norms)

    def handle(self, command: Any) -> FromRank:
        if isinstance(command, Load):
            return self.on_load(command)
        if isinstance(command, Join):
            return self.on_join(command)
        if isinstance(command, Train):
            return self.on_train(command)
        raise TypeError(f"unknown command {type(command).__name__}")


class PeakMemory:
    """This rank's peak memory over a block: torch's allocated peak on a GPU; on a CPU the process's resident
    size, sampled (the resident peak of the whole process would count the model's load, before sharding)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.peak = 0
        self._done = threading.Event()

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            threading.Thread(target=self._sample, daemon=True).start()
        return self

    def _sample(self) -> None:
        process = psutil.Process()
        while not self._done.is_set():
            self.peak = max(self.peak, process.memory_info().rss)
            self._done.wait(0.02)

    def __exit__(self, *_: object) -> None:
        self._done.set()
        if self.device.type == "cuda":
            self.peak = int(torch.cuda.max_memory_allocated(self.device))


def failure(err: BaseException, micro_batch: int) -> Failed:
    """``err`` as the rank reports it; the worker raises the matching typed error."""
    message = f"{type(err).__name__}: {str(err)[:600]}"  # its traceback is in the rank's log
    if is_out_of_memory(err):
        return Failed("out_of_memory", message, micro_batch)
    if isinstance(err, NonFiniteUpdateError):
        return Failed("non_finite", str(err))
    if isinstance(err, RunSpecError | ValueError):
        return Failed("bad_input", message)
    return Failed("error", message)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s rank: %(message)s")
    host, _, port = os.environ[ENV_CONTROL].rpartition(":")
    local_rank = int(os.environ[ENV_LOCAL_RANK])
    conn = Client((host, int(port)), authkey=bytes.fromhex(os.environ[ENV_KEY]))
    link = Link(conn)
    link.send(Hello(local_rank, os.getpid()))
    threading.Thread(target=link.beat, name="beat", daemon=True).start()
    rank = Rank(link)
    while True:
        try:
            command = conn.recv()
        except (EOFError, OSError):
            return  # the worker closed the connection (recycling the gang) or died
        try:
            reply = rank.handle(command)
        except BaseException as err:
            log.exception("local rank %d: %s failed", local_rank, type(command).__name__)
            link.send(failure(err, rank.micro_batch))
            sys.stdout.flush()
            os._exit(1)  # a failed collective leaves the world unusable: the worker starts fresh ranks
        link.send(reply)


if __name__ == "__main__":
    main()
