"""``GangTrainerActivities``: the trainer queue's activities, trained by a gang of rank processes.

The same activities, inputs and results as ``TrainerActivities`` (activities/training.py), whose publishing,
staging layout, OOM halving and heartbeats it keeps: only where a step trains differs. The worker holds no model;
it reads the step's data, tokenizes it, fetches the checkpoint it starts from, and gives every rank the step
(activities/gang/local_ranks.py; with a gang over hosts, the other members through the object store,
activities/gang/coordinator.py). The worker's first rank stages the step in the directory a single trainer stages
it in, in the same format, so ``publish`` uploads it unchanged. The step's first checkpoint is made here without the base's weights
(activities/gang/initial.py).

What the ranks hold after a step (the step as staged here) is kept while they live, so the next step of the run
starts from memory, as a single trainer's does; any failure recycles the ranks and the next attempt restores from
the checkpoint.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from activities import progress as stage_progress
from activities import sft, trajectory_store
from activities.advantages import read_step_table
from activities.checkpoints import (
    TrainerState,
    check_checkpoint_fits,
    publish_staged,
    read_trainer_state,
    stage_checkpoint,
    staging_dir,
)
from activities.device import resolve_precision
from activities.gang.coordinator import Coordinator, Start, start_files
from activities.gang.initial import initial_adapter
from activities.gang.local_ranks import LocalRanks
from activities.gang.messages import Stage, Trained
from activities.gang.rendezvous import Roster
from activities.gang.shared_step import SharedStep
from activities.object_store import ObjectStore
from activities.tokenize import TrainSequence, run_tokenizer
from activities.trainer import check_finite_adapter
from activities.training import Held, TrainerActivities, tokenize_step
from base_models.resolve import resolve_base_model
from schemas import layout
from schemas.activities import InitialAdapterInput, SftInput, SftResult, StagedRef, TrainInput, TrainResult
from schemas.config import ModelSpec
from schemas.errors import GangLostError, StagedStateLostError
from schemas.refs import CheckpointRef
from schemas.settings import GangSettings, model_roots

log = logging.getLogger(__name__)

Progress = Callable[[int, int, int], None]


@contextmanager
def shallow_gang_failure() -> Iterator[None]:
    """A lost gang raised afresh from here, without the frames it came through: Temporal keeps a retried attempt's
    failure, stack traces and all, only up to 4 KB (its per-activity limit, temporalio/temporal#7367), and beyond
    it keeps "Failure exceeds size limit" instead of what was lost."""
    try:
        yield
    except GangLostError as err:
        raise GangLostError(str(err)) from None


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
        self.coordinator = Coordinator(
            settings, self.local, store, self.staging_root, self.worker_id, self._lock
        )
        self._tokenizers: dict[str, Any] = {}
        self.last_roster: Roster | None = None
        """The world the last step trained in (its size and members: what a test or an operator reads)."""

    def close(self) -> None:
        """Leave the gang and end the ranks (a worker's exit does both by itself)."""
        self.coordinator.close()

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
        with shallow_gang_failure():
            return self._train_grpo(inp, micro_batch, progress, should_stop)

    def train_sft_sync(
        self,
        inp: SftInput,
        micro_batch: int,
        progress: Progress | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> SftResult:
        with shallow_gang_failure():
            return self._train_sft(inp, micro_batch, progress, should_stop)

    def _train_grpo(
        self,
        inp: TrainInput,
        micro_batch: int,
        progress: Progress | None,
        should_stop: Callable[[], bool] | None,
    ) -> TrainResult:
        started = time.monotonic()
        with stage_progress.stage("download"):
            table = read_step_table(self.store, inp.advantages)
        with self._lock:
            tokenizer = run_tokenizer(self.tokenizer_for(inp.model), self._chat_template(inp))
            tokenized = tokenize_step(inp, table, tokenizer)
            precision = self.precision_for(inp.train.precision)
            metrics = {
                "n_dropped_overlength": float(tokenized.n_dropped_overlength),
                "n_template_choices": float(tokenized.n_template_choices),
                "n_recovered_choices": float(tokenized.n_recovered_choices),
                "bf16": float(precision == "bf16"),
            }
            step = self._shared_step(inp, precision, micro_batch, inp.train.seed, config=inp.train)
            start = self._start_of(inp, inp.continue_from, inp.train.seed)
            held, trained = self._train(step, tokenized.sequences, [], start, metrics, progress, should_stop)
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

    def _train_sft(
        self,
        inp: SftInput,
        micro_batch: int,
        progress: Progress | None,
        should_stop: Callable[[], bool] | None,
    ) -> SftResult:
        started = time.monotonic()
        with stage_progress.stage("download"):
            data = trajectory_store.verified_bytes(self.store, inp.examples)
        examples = sft.parse_examples(data, inp.examples.uri, inp.sft.assistant_turns)
        with self._lock:
            tokenizer = run_tokenizer(self.tokenizer_for(inp.model), inp.model.chat_template)
            stats = sft.SftStats()
            with stage_progress.stage("tokenize"):
                batches = sft.sft_batches(examples, tokenizer, inp.sft, stats)
            sft.check_batches(batches, len(examples), inp.sft, inp.step, stats)
            precision = self.precision_for(inp.sft.precision)
            learning_rates = [lr for lr, _ in batches]
            step = self._shared_step(inp, precision, micro_batch, inp.sft.seed, sft=inp.sft,
                                     sft_learning_rates=learning_rates)  # fmt: skip
            sequences = [s for _, batch in batches for s in batch]
            batch_of = [i for i, (_, batch) in enumerate(batches) for _ in batch]
            start = self._start_of(inp, None, inp.sft.seed)
            held, trained = self._train(
                step, sequences, batch_of, start, {}, progress, should_stop, sft_step=True
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
            learning_rates=learning_rates,
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
            return self.store.checkpoint_ref(inp.run_id, 0)
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

    def _shared_step(
        self, inp: TrainInput | SftInput, precision: str, micro_batch: int, seed: int, **kind: Any
    ) -> SharedStep:
        """The step as every member of the gang trains it (the staging id is filled in by ``_train``)."""
        return SharedStep(run_id=inp.run_id, step=inp.step, model=inp.model, precision=precision,
                          micro_batch=micro_batch, staged_id="", checkpoint=inp.start_from, seed=seed, **kind)  # fmt: skip

    def _start_of(self, inp: TrainInput | SftInput, staged: StagedRef | None, seed: int) -> Start:
        """Where the step starts: what the ranks hold (the step this worker staged last), or files. Call holding
        ``_lock``."""
        held = self.held
        holding = self.local.holding if held is not None and held.staged_id == self.local.holding else None
        if staged is not None:
            if holding is not None and held is not None and held.is_staging(staged):
                return Start(holding, None, lambda: self._staged_files(inp, staged), shareable=False)
            directory = self._staged_files(inp, staged)
            return Start(None, None, lambda: directory, shareable=False)
        ref = inp.start_from
        held_here = holding if ref is not None and held is not None and held.is_checkpoint(ref) else None

        def files() -> Path:
            with stage_progress.stage("download"):
                return start_files(self.store, self.staging_root, inp.run_id, inp.model, ref, seed)

        return Start(held_here, ref, files)

    def _staged_files(self, inp: TrainInput | SftInput, staged: StagedRef) -> Path:
        """The files of step ``staged`` as this worker staged it; ``StagedStateLostError`` when they are gone."""
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

    def _train(
        self,
        step: SharedStep,
        sequences: list[TrainSequence],
        batches: list[int],
        start: Start,
        metrics: dict[str, float],
        progress: Progress | None,
        should_stop: Callable[[], bool] | None,
        sft_step: bool = False,
    ) -> tuple[Held, Trained]:
        """Train ``step`` on a gang formed for it, and hold it as rank 0 staged it. Call holding ``_lock``."""
        held = Held(
            step.run_id,
            step.step,
            uuid.uuid4().hex[:16],
            staging_dir(self.staging_root, step.run_id, step.step),
        )
        step = step.model_copy(update={"staged_id": held.staged_id})
        self._written(held.directory)  # an earlier staging of this step is written before this one
        self._hold(None)  # the ranks' model is about to change
        with stage_progress.stage("load"):
            formed = self.coordinator.form(step, sequences, batches, start, should_stop)
        self.last_roster = formed.roster
        try:
            state = TrainerState(
                staged_id=held.staged_id,
                run_id=step.run_id,
                step=step.step,
                base_model=step.model.base_model,
                seed=step.seed,
                worker_id=self.worker_id,
                lora=step.model.lora.model_dump(mode="json"),
                **({"sft": True} if sft_step else {}),
                world_size=formed.roster.world_size,  # who trained it, for the operator: resuming reads none of it
                sharding=formed.roster.sharding,
            )
            stage = Stage(held.directory, state, metrics)
            commands = [step.command(sequences, batches, formed.restore, stage if i == 0 else None, formed.roster.world_size)
                        for i in range(self.settings.ranks)]  # fmt: skip
            with stage_progress.stage("micro_batch"):
                trained = self.local.train(commands, progress, formed.watch)[0]
        finally:
            self.coordinator.done()
        self._hold(held)
        self.local.holding = held.staged_id
        return held, trained
