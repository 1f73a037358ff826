"""``GangTrainerActivities``: the trainer queue's activities, trained by a gang of rank processes.

The same activities, inputs and results as ``TrainerActivities`` (activities/training.py), whose publishing,
staging layout, OOM halving and heartbeats it keeps: only where a step trains differs. The worker holds no model;
it reads the step's data, tokenizes it, fetches the checkpoint it starts from, and gives every rank the step
(activities/gang/local_ranks.py; with a gang over hosts, the other members through the object store,
activities/gang/rendezvous.py). Rank 0 stages the step in the directory a single trainer stages it in, in the same
format, so ``publish`` uploads it unchanged. The step's first checkpoint is made here without the base's weights
(activities/gang/initial.py).

What the ranks hold after a step (the step as staged here) is kept while they live, so the next step of the run
starts from memory, as a single trainer's does; any failure recycles the ranks and the next attempt restores from
the checkpoint.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from activities import progress as stage_progress
from activities import sft, trajectory_store
from activities.advantages import read_step_table
from activities.checkpoints import (
    TrainerState,
    check_checkpoint_fits,
    download_checkpoint,
    publish_staged,
    read_trainer_state,
    run_dir,
    stage_checkpoint,
    staging_dir,
)
from activities.device import resolve_precision
from activities.gang.initial import initial_adapter
from activities.gang.local_ranks import LocalRanks
from activities.gang.messages import Stage, Train, Trained
from activities.gang.rendezvous import Roster, local_roster
from activities.object_store import ObjectStore
from activities.tokenize import run_tokenizer
from activities.trainer import check_finite_adapter
from activities.training import Held, TrainerActivities, tokenize_step
from base_models.resolve import resolve_base_model
from schemas import layout
from schemas.activities import InitialAdapterInput, SftInput, SftResult, StagedRef, TrainInput, TrainResult
from schemas.config import ModelSpec
from schemas.errors import StagedStateLostError
from schemas.refs import CheckpointRef
from schemas.settings import GangSettings, model_roots

log = logging.getLogger(__name__)

Progress = Callable[[int, int, int], None]


class GangTrainerActivities(TrainerActivities):
    """``TrainerActivities`` whose steps a gang of rank processes trains (``GangSettings``)."""

    def __init__(
        self,
        store: ObjectStore,
        staging_root: str | Path,
        settings: GangSettings,
        worker_id: str | None = None,
        trust_chat_template: bool = False,
        log_dir: Path | None = None,
    ) -> None:
        super().__init__(store, staging_root, worker_id, trust_chat_template)
        self.settings = settings
        self.local = LocalRanks(settings, log_dir or self.staging_root / ".ranks")
        self._tokenizers: dict[str, Any] = {}
        self.last_roster: Roster | None = None
        """The world the last step trained in (its size and members: what a test or an operator reads)."""

    def trainer_for(self, model: ModelSpec, precision: str) -> Any:
        raise AssertionError("a gang's worker holds no model: its ranks do")

    def tokenizer_for(self, model: ModelSpec) -> Any:
        """The base model's tokenizer (all the worker loads of it)."""
        from transformers import AutoTokenizer

        base = resolve_base_model(model.base_model, roots=model_roots()).base_path
        if base not in self._tokenizers:
            self._tokenizers[base] = AutoTokenizer.from_pretrained(base)
        return self._tokenizers[base]

    def precision_for(self, precision: str) -> str:
        import torch

        return resolve_precision(precision, torch.device(self.local.devices()[0]))

    # ---- activities' work ---------------------------------------------------------------------------
    def train_sync(
        self,
        inp: TrainInput,
        micro_batch: int,
        progress: Progress | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> TrainResult:
        started = time.monotonic()
        with stage_progress.stage("download"):
            table = read_step_table(self.store, inp.advantages)
        with self._lock:
            tokenizer = run_tokenizer(self.tokenizer_for(inp.model), self._chat_template(inp))
            tokenized = tokenize_step(inp, table, tokenizer)
            precision = self.precision_for(inp.train.precision)
            self._ready(inp.model, precision, should_stop)
            restore = self._start_of(inp, inp.continue_from, inp.train.seed)
            extra = {
                "n_dropped_overlength": float(tokenized.n_dropped_overlength),
                "n_template_choices": float(tokenized.n_template_choices),
                "bf16": float(precision == "bf16"),
            }

            def command(stage: Stage | None) -> Train:
                return Train(inp.step, micro_batch, restore, stage, inp.train, tokenized.sequences)

            held, trained = self._train_staged(inp, inp.train.seed, command, extra, progress, should_stop)
        self._step_done(inp.run_id, inp.step)
        stats = trained.stats
        log.info("step %d trained on %d ranks: loss %.4f", inp.step, self.world_size, stats["loss"])
        return TrainResult(
            run_id=inp.run_id,
            step=inp.step,
            staging_dir=str(held.directory),
            staged_id=held.staged_id,
            worker_id=self.worker_id,
            loss=stats["loss"],
            grad_norm=stats["grad_norm"],
            n_sequences=int(stats["n_sequences"]),
            n_trainable_tokens=int(stats["n_trainable_tokens"]),
            n_dropped_overlength=tokenized.n_dropped_overlength,
            micro_batch_size=trained.micro_batch,
            seconds=time.monotonic() - started,
            metrics={
                "loss/grad_norm": stats["grad_norm"],
                "loss/mean_importance_ratio": stats["mean_ratio"],
                "loss/clip_fraction": stats["clip_fraction"],
            },
            compute_seconds=trained.seconds,
        )

    def train_sft_sync(
        self,
        inp: SftInput,
        micro_batch: int,
        progress: Progress | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> SftResult:
        started = time.monotonic()
        with stage_progress.stage("download"):
            data = trajectory_store.verified_bytes(self.store, inp.examples)
        examples = sft.parse_examples(data, inp.examples.uri)
        with self._lock:
            tokenizer = run_tokenizer(self.tokenizer_for(inp.model), inp.model.chat_template)
            stats = sft.SftStats()
            with stage_progress.stage("tokenize"):
                batches = sft.sft_batches(examples, tokenizer, inp.sft, stats)
            sft.check_batches(batches, len(examples), inp.sft, inp.step, stats)
            self._ready(inp.model, self.precision_for(inp.sft.precision), should_stop)
            restore = self._start_of(inp, None, inp.sft.seed)

            def command(stage: Stage | None) -> Train:
                return Train(inp.step, micro_batch, restore, stage, sft=inp.sft, sft_batches=batches)

            held, trained = self._train_staged(
                inp, inp.sft.seed, command, {}, progress, should_stop, sft_step=True
            )
        self._step_done(inp.run_id, inp.step)
        log.info("step %d fine-tuned on %d ranks: losses %s", inp.step, self.world_size, trained.sft_losses)
        return SftResult(
            run_id=inp.run_id,
            step=inp.step,
            staging_dir=str(held.directory),
            worker_id=self.worker_id,
            losses=trained.sft_losses,
            grad_norms=trained.sft_grad_norms,
            learning_rates=[lr for lr, _ in batches],
            n_examples=stats.n_examples,
            n_dropped_overlength=stats.n_dropped_overlength,
            n_trainable_tokens=int(trained.stats["n_trainable_tokens"]),
            micro_batch_size=trained.micro_batch,
            seconds=time.monotonic() - started,
        )

    def publish_initial_sync(self, inp: InitialAdapterInput) -> CheckpointRef:
        """Checkpoint 0, made without the ranks (activities/gang/initial.py)."""
        prefix = layout.checkpoint_prefix(inp.run_id, 0)
        if self.store.is_complete(prefix):
            _, sha = self.store.read_manifest(prefix)
            return CheckpointRef(run_id=inp.run_id, step=0, uri=self.store.uri(prefix), manifest_sha256=sha)
        directory = staging_dir(self.staging_root, inp.run_id, 0)
        state = TrainerState(
            run_id=inp.run_id,
            step=0,
            base_model=inp.model.base_model,
            seed=inp.seed,
            lora=inp.model.lora.model_dump(mode="json"),
            staged_id=uuid.uuid4().hex[:16],
        )
        stage_checkpoint(directory, initial_adapter(inp.model, inp.seed).write, state, {})
        check_finite_adapter(directory)
        return publish_staged(self.store, directory, inp.run_id, 0, state.model_dump())

    # ---- the gang -----------------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.last_roster.world_size if self.last_roster is not None else 0

    def _start_of(self, inp: TrainInput | SftInput, staged: StagedRef | None, seed: int) -> Path | None:
        """The checkpoint directory the ranks start the step from; None when they hold its start already (the
        step this worker staged last, in memory). Call holding ``_lock``, the gang ready."""
        held = self.held
        if staged is not None:
            if held is not None and held.is_staging(staged) and self.local.holding == staged.staged_id:
                return None
            directory = staging_dir(self.staging_root, staged.run_id, staged.step)
            self._written(directory)
            state = read_trainer_state(directory) if directory.is_dir() else None
            if staged.worker_id != self.worker_id or state is None or state.staged_id != staged.staged_id:
                raise StagedStateLostError(
                    f"trainer {self.worker_id} no longer holds step {staged.step} of run {staged.run_id} as staged "
                    f"by {staged.worker_id} ({staged.staged_id}); train from its checkpoint once it is manifested"
                )
            check_checkpoint_fits(state, inp.model, str(directory))
            return directory
        ref = inp.start_from
        if ref is None:
            directory = run_dir(self.staging_root, inp.run_id) / ".inputs" / f"initial-{seed}"
            if not directory.is_dir():
                stage_checkpoint(directory, initial_adapter(inp.model, seed).write,
                                 TrainerState(run_id=inp.run_id, step=0, base_model=inp.model.base_model), {})  # fmt: skip
            return directory
        if held is not None and held.is_checkpoint(ref) and self.local.holding == held.staged_id:
            return None
        local = run_dir(self.staging_root, inp.run_id) / ".inputs" / layout.step_name(ref.step)
        with stage_progress.stage("download"):
            download_checkpoint(self.store, ref, local)
        check_checkpoint_fits(read_trainer_state(local), inp.model, ref.uri)
        return local

    def _train_staged(
        self,
        inp: TrainInput | SftInput,
        seed: int,
        command: Callable[[Stage | None], Train],
        metrics: dict[str, float],
        progress: Progress | None,
        should_stop: Callable[[], bool] | None,
        sft_step: bool = False,
    ) -> tuple[Held, Trained]:
        """Train the step on the ready gang (``command(rank 0's staging)`` to each rank) and hold it as rank 0
        staged it. Call holding ``_lock``."""
        held = Held(
            inp.run_id, inp.step, uuid.uuid4().hex[:16], staging_dir(self.staging_root, inp.run_id, inp.step)
        )
        self._written(held.directory)  # an earlier staging of this step is written before this one
        self._hold(None)  # the ranks' model is about to change
        state = TrainerState(
            staged_id=held.staged_id,
            run_id=inp.run_id,
            step=inp.step,
            base_model=inp.model.base_model,
            seed=seed,
            worker_id=self.worker_id,
            lora=inp.model.lora.model_dump(mode="json"),
            **({"sft": True} if sft_step else {}),
            world_size=self.world_size,  # who trained it, for the operator: resuming reads nothing of it
            sharding=self.settings.shard,
        )
        stage = Stage(held.directory, state, metrics)
        commands = [command(stage if i == 0 else None) for i in range(self.settings.ranks)]
        with stage_progress.stage("micro_batch"):
            trained = self.local.train(commands, progress, self._watch(should_stop))
        self._hold(held)
        self.local.holding = held.staged_id
        return held, trained

    def _ready(self, model: ModelSpec, precision: str, should_stop: Callable[[], bool] | None) -> Roster:
        """The gang, ranks loaded with ``model`` and joined to a world. Call holding ``_lock``."""
        watch = self._watch(should_stop)
        with stage_progress.stage("load"):
            self.local.load(model, precision, watch)
            roster = local_roster(self.local, self.settings)
            if roster.fresh:
                self.local.join(roster.address, roster.port, 0, roster.world_size, roster.world, watch)
        self.last_roster = roster
        return roster

    @staticmethod
    def _watch(should_stop: Callable[[], bool] | None) -> Callable[[], None]:
        def watch() -> None:
            if should_stop is not None and should_stop():
                raise InterruptedError("training cancelled")

        return watch
