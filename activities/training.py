"""The trainer queue's activities: train a GRPO step, publish it, publish step 0, find the newest checkpoint.

``TrainerActivities(store, staging_root, worker_id=None, trust_chat_template=False)`` is built once per trainer
worker process:

- ``store``: the worker's ``ObjectStore`` (checkpoints and the step's advantages Parquet).
- ``staging_root``: a local directory; a trained step is staged in ``<root>/<run_id>/<step:06d>/``.
- ``worker_id``: names this worker; default ``<host>-<pid>-<random>``. The worker must ALSO poll
  ``worker_task_queue(trainer_queue, worker_id)``: ``publish_adapter`` (servable) and ``publish`` (resumable)
  are sent there, to the worker holding the staged files. Register ``activities.all()`` on both queues.
- ``trust_chat_template``: the operator trusts run specs' Jinja (``--trust-request-chat-template``, the
  inference worker's flag); without it a run with a template of its own (``model.chat_template``) is refused.

Each stage of the work says when it advances (activities/progress.py: downloads, loading the base model and a
step's state, tokenizing, every chat render, every micro-batch, uploads), so a stage that hangs stops the
heartbeats and Temporal retries the attempt; a render is stopped at its bound and fails as retryable
(``Stalled``). Other work that hangs on the compute thread cannot be stopped: while it is past its stage's bound
the trainer is ``stuck()`` (activities/compute_thread.py), every attempt here fails at once as ``Stalled`` (the
stuck one too, so its retry starts without waiting for a heartbeat timeout), and a worker process leaves for a
fresh one (workers/worker.py): a retry never waits, heartbeating, behind the stuck thread.

The ``Trainer`` (base model + adapter) stays warm across steps; when ``start_from`` is the checkpoint
this worker itself just trained and published, it is not downloaded again.

Before a step the trainer plans its micro-batch (at most the configured one, or what the OOM halving left) and
gradient checkpointing from the model's size and the device's free memory (activities/memory_plan.py).
Out of memory (torch's OOM, the CPU allocator failing, ``MemoryError``) fails the attempt with a
retryable ``ApplicationError(type=OutOfMemory, details=[{"micro_batch_size": m}])`` and a note in
``<root>/<run_id>/.<step>.oom.json`` (and the last heartbeat); the next attempt halves the micro-batch,
down to 1, after which it fails non-retryably. An attempt that ends in any other way says so in its last
heartbeat (``ended``); one whose last heartbeat shows it mid-training and says nothing died without a word
(the kernel's OOM killer, a preemption), and the next attempt halves the micro-batch too.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import dataclasses
import gc
import logging
import os
import shutil
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import progress as stage_progress
from activities import sft, trajectory_store
from activities.advantages import read_step_table
from activities.checkpoints import (
    AdapterFiles,
    OomState,
    TrainerState,
    check_checkpoint_fits,
    download_checkpoint,
    oom_state_file,
    publish_adapter,
    publish_staged,
    read_oom_state,
    read_trainer_state,
    republish_checkpoint,
    run_dir,
    stage_checkpoint,
    staging_dir,
)
from activities.compute_thread import ComputeThread
from activities.device import default_device, resolve_precision
from activities.early_upload import EarlyUploads
from activities.errors import application_error
from activities.fleet_metrics import fleet_metrics
from activities.object_store import ObjectStore
from activities.run_texts import read_run_text
from activities.tokenize import ChatTokenizer, TokenizedStep, TrainSequence, build_sequences, run_tokenizer
from activities.trainer import StepStats, Trainer, check_finite_adapter, check_finite_weights
from host.files import write_json_atomic
from schemas import layout
from schemas.activities import (
    ActivityName,
    CheckpointLookup,
    InitialAdapterInput,
    PublishInput,
    RepublishInput,
    SftInput,
    SftResult,
    StagedRef,
    TrainInput,
    TrainResult,
)
from schemas.config import ModelSpec, TrainConfig
from schemas.errors import CONFIG_ERROR, OUT_OF_MEMORY, DgrpoError, StagedStateLostError, UnsafePathError
from schemas.refs import AdapterRef, CheckpointRef

log = logging.getLogger(__name__)
T = TypeVar("T")

HEARTBEAT_INTERVAL_S = 5.0
STUCK_CHECK_S = 1.0
"""How often an attempt waiting on the compute thread looks whether that thread is stuck."""
REST_WAIT_S = 2.0
"""How long a staged step's rest (optimizer and trainer state) waits, once its adapter is up, for something to ask
for it (its publish follows the reload, a fraction of a second later) before it is written anyway: the bound on
what a trainer that stops with a staging nobody asked for takes longer to exit."""


def worker_task_queue(trainer_queue: str, worker_id: str) -> str:
    """The task queue only trainer ``worker_id`` polls (publish runs where the staged adapter is)."""
    return layout.worker_task_queue(trainer_queue, worker_id)


def is_out_of_memory(err: BaseException) -> bool:
    """torch's OOM (CUDA), ``MemoryError``, or the CPU allocator refusing an allocation."""
    if isinstance(err, MemoryError):
        return True
    oom_type = getattr(__import__("torch"), "OutOfMemoryError", None)
    if oom_type is not None and isinstance(err, oom_type):
        return True
    text = str(err)
    return isinstance(err, RuntimeError) and (
        "DefaultCPUAllocator" in text or "can't allocate memory" in text or "out of memory" in text
    )


class OutOfMemory(Exception):
    """Raised from the compute thread: the step ran out of memory at ``micro_batch_size``."""

    def __init__(self, micro_batch_size: int, cause: str) -> None:
        super().__init__(f"out of memory at micro_batch_size={micro_batch_size}: {cause}")
        self.micro_batch_size = micro_batch_size
        self.cause = cause


def train_step_or_oom(
    trainer: Trainer,
    sequences: list[TrainSequence],
    config: TrainConfig,
    step: int,
    micro_batch: int,
    progress: Callable[[int, int, int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> StepStats:
    """``trainer.train_step``; running out of memory raises ``OutOfMemory`` with the failed tensors freed."""
    return or_out_of_memory(
        trainer,
        micro_batch,
        lambda: trainer.train_step(sequences, config, step, micro_batch, progress, should_stop),
    )


def or_out_of_memory(trainer: Trainer, micro_batch: int, compute: Callable[[], T]) -> T:
    """``compute()``; running out of memory raises ``OutOfMemory`` with the failed tensors freed."""
    try:
        return compute()
    except Exception as err:
        if trainer.optimizer is not None:
            trainer.optimizer.zero_grad(set_to_none=True)
        if not is_out_of_memory(err):
            raise
        # Drop the failed micro-batch's tensors now (the traceback's frames hold them).
        traceback.clear_frames(err.__traceback__)
        message = f"{type(err).__name__}: {str(err)[:300]}"
        del err
        gc.collect()
        raise OutOfMemory(micro_batch, message) from None


def config_error(message: str) -> ApplicationError:
    return ApplicationError(message, type=CONFIG_ERROR, non_retryable=True)


def tokenize_step(inp: TrainInput, table: Any, tokenizer: ChatTokenizer) -> TokenizedStep:
    """The step's sequences: its trajectories that have an advantage, tokenized; refused when none trains."""
    groups = trajectory_store.table_to_groups(table, inp.advantages.uri)
    advantages = trajectory_store.advantages_of(table, inp.advantages.uri)
    pairs = [
        (t, a)
        for g, adv in zip(groups, advantages, strict=True)
        for t, a in zip(g.trajectories, adv, strict=True)
        if a is not None
    ]
    with stage_progress.stage("tokenize"):
        tokenized = build_sequences(
            [t for t, _ in pairs], [a for _, a in pairs], inp.train.max_seq_len, tokenizer
        )
    if not tokenized.sequences:
        raise config_error(
            f"step {inp.step}: no trainable tokens ({len(pairs)} trajectories with advantages, "
            f"{tokenized.n_dropped_overlength} sequences over max_seq_len={inp.train.max_seq_len})"
        )
    return tokenized


def next_micro_batch(configured: int, oom: OomState | None, heartbeat: Any) -> int:
    """The micro-batch for this attempt: half the last one that ran out of memory, or that was training
    when its attempt died without a word (SIGKILL leaves no note, only the last heartbeat), at least 1."""
    sizes = [configured]
    if oom is not None:
        sizes.append(oom.micro_batch_size // 2)
    if isinstance(heartbeat, dict) and isinstance(heartbeat.get("oom_micro_batch_size"), int):
        sizes.append(heartbeat["oom_micro_batch_size"] // 2)
    if died_training(heartbeat):
        sizes.append(int(heartbeat["micro_batch_size"]) // 2)
    return max(1, min(sizes))


def died_training(heartbeat: Any) -> bool:
    """True when the last attempt's last heartbeat shows it between micro-batches and no word of its end."""
    return (
        isinstance(heartbeat, dict)
        and "ended" not in heartbeat
        and "oom_micro_batch_size" not in heartbeat
        and isinstance(heartbeat.get("micro_batch_size"), int)
        and isinstance(heartbeat.get("of"), int)
        and heartbeat["of"] > 0
    )


@dataclass(frozen=True)
class Held:
    """A step of a run as this worker staged it, which the warm trainer's model holds."""

    run_id: str
    step: int
    staged_id: str
    directory: Path
    """Its staged files (what ``publish`` uploads)."""
    manifest_sha256: str | None = None
    """Its checkpoint's manifest, once published from here."""

    def is_checkpoint(self, ref: CheckpointRef) -> bool:
        return (self.run_id, self.step, self.manifest_sha256) == (ref.run_id, ref.step, ref.manifest_sha256)

    def is_staging(self, ref: StagedRef) -> bool:
        return (self.run_id, self.step, self.staged_id) == (ref.run_id, ref.step, ref.staged_id)


class TrainerActivities:
    """Activities ``train``, ``train_sft``, ``publish_adapter``, ``publish``, ``publish_initial``, ``republish``,
    ``latest_checkpoint``."""

    def __init__(
        self,
        store: ObjectStore,
        staging_root: str | Path,
        worker_id: str | None = None,
        trust_chat_template: bool = False,
    ) -> None:
        self.store = store
        self.trust_chat_template = trust_chat_template
        self.staging_root = Path(staging_root).absolute()
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.trainer: Trainer | None = None
        self._trainer_key: str | None = None
        self._lock = threading.Lock()
        """Held while the trainer's model is read or changed (training, staging, restoring)."""
        self.held: Held | None = None
        """The step the warm trainer's model holds, as staged here; None while it changes (a failed attempt
        leaves None: the next one restores from the staged files or a checkpoint)."""
        self._held_lock = threading.Lock()  # publish notes its manifest without waiting for a training
        # A trained step's files are written from a copy of the model (``Trainer.snapshot``) on this thread, beside
        # what follows (the next step's training); publishing and continuing from the files wait for the write.
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="stager")
        self._writing: dict[Path, concurrent.futures.Future[Path]] = {}
        # The rest (optimizer and trainer state) is written once something asks for it (``_written``: its publish,
        # a continue from the files, the next staging) or after ``REST_WAIT_S``, not beside the adapter's reload.
        self._wanted: dict[Path, threading.Event] = {}
        # The adapter's files are serialized first and go up at once (activities/early_upload.py):
        # ``publish_adapter`` writes their manifest, not waiting for the optimizer state to be written.
        self._adapters: dict[Path, concurrent.futures.Future[AdapterFiles]] = {}
        self._early = EarlyUploads(store)
        self._compute = ComputeThread()

    def all(self) -> list[Callable[..., Any]]:
        return [
            self.train,
            self.train_sft,
            self.publish,
            self.publish_adapter,
            self.publish_initial,
            self.republish,
            self.latest_checkpoint,
        ]

    # ---- activities -------------------------------------------------------------------------------
    @activity.defn(name=ActivityName.TRAIN)
    async def train(self, inp: TrainInput) -> TrainResult:
        """Train one GRPO step from ``start_from`` and stage it on this worker (publish it next)."""
        self._check_chat_template(inp.model, inp.chat_template_ref is not None)
        trained = await self._attempt(
            inp.run_id, inp.step, inp.train.micro_batch_size,
            lambda micro_batch, progress, stop: self.train_sync(inp, micro_batch, progress, stop),
        )  # fmt: skip
        fleet_metrics().trained_tokens.add(trained.n_trainable_tokens)
        return trained

    @activity.defn(name=ActivityName.TRAIN_SFT)
    async def train_sft(self, inp: SftInput) -> SftResult:
        """Fine-tune on ``inp.examples`` from ``start_from`` and stage the result on this worker (publish it
        next); out of memory halves the micro-batch as in ``train``."""
        self._check_chat_template(inp.model)
        trained = await self._attempt(
            inp.run_id, inp.step, inp.sft.micro_batch_size,
            lambda micro_batch, progress, stop: self.train_sft_sync(inp, micro_batch, progress, stop),
        )  # fmt: skip
        fleet_metrics().trained_tokens.add(trained.n_trainable_tokens)
        return trained

    def stuck(self) -> str | None:
        """What this trainer's compute thread is stuck in (activities/compute_thread.py), or None."""
        return self._compute.stuck()

    def _check_chat_template(self, model: ModelSpec, stored: bool = False) -> None:
        """Refuse a run whose own chat template (inline, or ``stored`` once for the run) this trainer's operator
        does not trust to render here."""
        if (model.chat_template is not None or stored) and not self.trust_chat_template:
            raise config_error(
                "the run renders its chats with a template of its own (model.chat_template), which this trainer "
                "renders only when started with --trust-request-chat-template (as the inference worker: the "
                "operator then trusts run specs' Jinja): restart it so, or leave model.chat_template out"
            )

    async def _attempt(
        self,
        run_id: str,
        step: int,
        configured_micro_batch: int,
        work: Callable[[int, Callable[[int, int, int], None], Callable[[], bool]], T],
    ) -> T:
        """One attempt of a training activity: the micro-batch its earlier attempts left (halved after an OOM
        or a silent death), progress in its heartbeats, ``work(micro_batch, on_progress, should_stop)`` in
        the compute thread."""
        info = activity.info()
        details = info.heartbeat_details[0] if info.heartbeat_details else None
        try:
            oom = read_oom_state(self.staging_root, run_id, step)
        except DgrpoError as err:
            raise application_error(err) from err
        micro_batch = next_micro_batch(configured_micro_batch, oom, details)
        if micro_batch < configured_micro_batch:
            why = "its last attempt died without a word mid-training" if died_training(details) else "an OOM"
            log.warning("step %d attempt %d: micro-batch %d after %s", step, info.attempt, micro_batch, why)
        progress: dict[str, Any] = {"micro_batch": 0, "of": 0, "micro_batch_size": micro_batch}
        try:
            self._compute.refuse_if_stuck(f"trainer {self.worker_id}")
        except DgrpoError as err:
            raise application_error(err) from err

        def on_progress(i: int, n: int, m: int) -> None:
            progress.update(micro_batch=i, of=n, micro_batch_size=m)
            stage_progress.advance()

        try:
            return await self._in_thread(
                lambda stop: work(micro_batch, on_progress, stop), progress, compute=True
            )
        except OutOfMemory as err:
            raise self._out_of_memory(err, run_id, step, progress) from err
        except BaseException as err:  # any other end says so: only a silent death halves the micro-batch
            activity.heartbeat({**progress, "ended": type(err).__name__})
            raise

    def _out_of_memory(
        self, err: OutOfMemory, run_id: str, step: int, progress: dict[str, Any]
    ) -> ApplicationError:
        """Note the OOM for the next attempt (file and heartbeat); the failure to raise, final at size 1."""
        state = OomState(micro_batch_size=err.micro_batch_size, attempt=activity.info().attempt)
        write_json_atomic(oom_state_file(self.staging_root, run_id, step), state.model_dump())
        activity.heartbeat({**progress, "oom_micro_batch_size": err.micro_batch_size, "ended": "OutOfMemory"})
        if err.micro_batch_size <= 1:
            return ApplicationError(
                f"step {step}: out of memory even at micro_batch_size=1 ({err.cause}); lower "
                "train.max_seq_len, use train.precision='bf16' or a smaller lora.rank, or give the "
                "trainer more memory",
                {"micro_batch_size": 1},
                type=OUT_OF_MEMORY,
                non_retryable=True,
            )
        fleet_metrics().oom_halvings.add(1)
        return ApplicationError(
            f"step {step}: out of memory at micro_batch_size={err.micro_batch_size}; "
            f"the next attempt uses {err.micro_batch_size // 2} ({err.cause})",
            {"micro_batch_size": err.micro_batch_size},
            type=OUT_OF_MEMORY,
        )

    @activity.defn(name=ActivityName.PUBLISH)
    async def publish(self, inp: PublishInput) -> CheckpointRef:
        """Upload a staged step to ``checkpoints/<step>/`` (its adapter first, unless ``publish_adapter`` put it
        there already; manifest last): resumable. A retry reuses a complete one."""
        return await self._in_thread(lambda _stop: self.publish_sync(inp), {"publishing": inp.step})

    @activity.defn(name=ActivityName.PUBLISH_ADAPTER)
    async def publish_adapter(self, inp: PublishInput) -> AdapterRef:
        """Upload a staged step's adapter and its adapter manifest: servable (``publish`` writes the rest)."""
        return await self._in_thread(lambda _stop: self.publish_adapter_sync(inp), {"publishing": inp.step})

    @activity.defn(name=ActivityName.PUBLISH_INITIAL)
    async def publish_initial(self, inp: InitialAdapterInput) -> CheckpointRef:
        """Stage and publish checkpoint 0: a fresh LoRA from ``inp.seed`` or the warm-start adapter."""
        return await self._in_thread(lambda _stop: self.publish_initial_sync(inp), {"publishing": 0})

    @activity.defn(name=ActivityName.REPUBLISH)
    async def republish(self, inp: RepublishInput) -> CheckpointRef:
        """Publish checkpoint ``inp.source`` again as ``inp.step`` (a step with nothing to train on)."""
        return await self._in_thread(
            lambda _stop: republish_checkpoint(self.store, self.staging_root, inp.source, inp.step),
            {"publishing": inp.step},
        )

    @activity.defn(name=ActivityName.LATEST_CHECKPOINT)
    async def latest_checkpoint(self, inp: CheckpointLookup) -> CheckpointRef | None:
        """The newest manifested checkpoint of the run, or None."""
        return await asyncio.to_thread(self.store.latest_checkpoint, inp.run_id)

    # ---- plumbing ---------------------------------------------------------------------------------
    async def _in_thread(
        self, fn: Callable[[Callable[[], bool]], T], progress: dict[str, Any], compute: bool = False
    ) -> T:
        """Run ``fn`` off the event loop (on the compute thread, else the loop's executor), heartbeating
        ``progress``; typed errors become ApplicationErrors. Waiting on the compute thread fails (``Stalled``) as
        soon as that thread is stuck, whichever attempt's work it is stuck in."""
        stop = threading.Event()
        if compute:
            task = self._compute.run(lambda: fn(stop.is_set))
        else:
            context = contextvars.copy_context()  # the attempt's progress (activities/progress.py) goes along
            task = asyncio.get_running_loop().run_in_executor(None, context.run, fn, stop.is_set)
        beat = time.monotonic()
        try:
            while True:
                done, _ = await asyncio.wait(
                    {task}, timeout=STUCK_CHECK_S if compute else HEARTBEAT_INTERVAL_S
                )
                if done:
                    break
                if compute:
                    self._compute.refuse_if_stuck(f"trainer {self.worker_id}")
                if not compute or time.monotonic() - beat >= HEARTBEAT_INTERVAL_S:
                    activity.heartbeat(dict(progress))
                    beat = time.monotonic()
            return task.result()
        except asyncio.CancelledError:
            stop.set()  # the thread stops at the next micro-batch
            raise
        except DgrpoError as err:
            raise application_error(err) from err

    def trainer_for(self, model: ModelSpec, precision: str) -> Trainer:
        """The warm trainer, rebuilt only when the model or (resolved) precision changes."""
        precision = resolve_precision(precision, default_device())
        key = f"{model.base_model}|{model.lora.model_dump_json()}|{precision}"
        if self.trainer is None or self._trainer_key != key:
            self.trainer = None
            self._hold(None)
            gc.collect()
            with stage_progress.stage("load"):  # a base model on a dead mount never returns
                self.trainer, self._trainer_key = Trainer(model, precision), key
        return self.trainer

    def _restore(
        self, trainer: Trainer, run_id: str, model: ModelSpec, ref: CheckpointRef | None, seed: int
    ) -> None:
        if ref is None:
            trainer.init_adapter(seed)
            return
        held = self.held
        if held is not None and held.is_checkpoint(ref):
            return  # the warm trainer holds exactly this checkpoint (it trained and published it)
        local = run_dir(self.staging_root, run_id) / ".inputs" / layout.step_name(ref.step)
        with stage_progress.stage("download"):
            download_checkpoint(self.store, ref, local)
        check_checkpoint_fits(read_trainer_state(local), model, ref.uri)
        with stage_progress.stage("load"):
            trainer.load_state(local)

    def _continue(self, trainer: Trainer, model: ModelSpec, staged: StagedRef) -> None:
        """Hold step ``staged`` as this worker staged it: already in memory, else from its staged files (the
        same bytes its publish uploads); ``StagedStateLostError`` when neither is that staging any more."""
        held = self.held
        if held is not None and held.is_staging(staged):
            return
        directory = staging_dir(self.staging_root, staged.run_id, staged.step)
        self._written(directory)
        state = read_trainer_state(directory) if directory.is_dir() else None
        if staged.worker_id != self.worker_id or state is None or state.staged_id != staged.staged_id:
            raise StagedStateLostError(
                f"trainer {self.worker_id} no longer holds step {staged.step} of run {staged.run_id} as staged by "
                f"{staged.worker_id} ({staged.staged_id}); train from its checkpoint once it is manifested"
            )
        check_checkpoint_fits(state, model, str(directory))
        with stage_progress.stage("load"):
            trainer.load_state(directory)

    def train_sync(
        self,
        inp: TrainInput,
        micro_batch: int,
        progress: Callable[[int, int, int], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> TrainResult:
        started = time.monotonic()
        with stage_progress.stage("download"):
            table = read_step_table(self.store, inp.advantages)
        with self._lock:
            trainer = self.trainer_for(inp.model, inp.train.precision)
            tokenized = tokenize_step(inp, table, run_tokenizer(trainer.tokenizer, self._chat_template(inp)))
            if inp.continue_from is not None:
                self._continue(trainer, inp.model, inp.continue_from)
            else:
                self._restore(trainer, inp.run_id, inp.model, inp.start_from, inp.train.seed)
            self._hold(None)  # the model is about to change
            plan = trainer.plan_memory(tokenized.sequences, micro_batch)
            if plan.micro_batch < micro_batch or plan.gradient_checkpointing:
                log.info("step %d: %s (asked for micro-batch %d)", inp.step, plan, micro_batch)
            micro_batch = plan.micro_batch
            trainer.use_gradient_checkpointing(plan.gradient_checkpointing)
            computing = time.monotonic()
            with stage_progress.stage("micro_batch"):
                stats = train_step_or_oom(
                    trainer, tokenized.sequences, inp.train, inp.step, micro_batch, progress, should_stop
                )
            compute_seconds = time.monotonic() - computing
            metrics = {k: float(v) for k, v in vars(stats).items()}
            metrics["n_dropped_overlength"] = float(tokenized.n_dropped_overlength)
            metrics["n_template_choices"] = float(tokenized.n_template_choices)
            metrics["n_recovered_choices"] = float(tokenized.n_recovered_choices)
            metrics["gradient_checkpointing"] = float(plan.gradient_checkpointing)
            metrics["bf16"] = float(trainer.precision == "bf16")
            staged = self._stage(
                trainer, inp.run_id, inp.step, inp.model, inp.train.seed, micro_batch, metrics
            )
        self._step_done(inp.run_id, inp.step)
        log.info("step %d trained: loss %.4f, %s", inp.step, stats.loss, metrics)
        return TrainResult(
            run_id=inp.run_id,
            step=inp.step,
            staging_dir=str(staged.directory),
            staged_id=staged.staged_id,
            worker_id=self.worker_id,
            loss=stats.loss,
            grad_norm=stats.grad_norm,
            n_sequences=stats.n_sequences,
            n_trainable_tokens=stats.n_trainable_tokens,
            n_dropped_overlength=tokenized.n_dropped_overlength,
            micro_batch_size=micro_batch,
            seconds=time.monotonic() - started,
            metrics={
                "loss/grad_norm": stats.grad_norm,
                "loss/mean_importance_ratio": stats.mean_ratio,
                "loss/clip_fraction": stats.clip_fraction,
            },
            compute_seconds=compute_seconds,
        )

    def _chat_template(self, inp: TrainInput) -> str | None:
        """The run's own chat template: as stored once for the run, or as the input carries it."""
        if inp.chat_template_ref is None:
            return inp.model.chat_template
        with stage_progress.stage("download"):
            return read_run_text(self.store, inp.run_id, "chat_template", inp.chat_template_ref)

    def train_sft_sync(
        self,
        inp: SftInput,
        micro_batch: int,
        progress: Callable[[int, int, int], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> SftResult:
        started = time.monotonic()
        with stage_progress.stage("download"):
            data = trajectory_store.verified_bytes(self.store, inp.examples)
        examples = sft.parse_examples(data, inp.examples.uri, inp.sft.assistant_turns)
        with self._lock:
            trainer = self.trainer_for(inp.model, inp.sft.precision)
            self._restore(trainer, inp.run_id, inp.model, inp.start_from, inp.sft.seed)
            self._hold(None)  # the model is about to change
            stats = or_out_of_memory(
                trainer,
                micro_batch,
                lambda: sft.train_examples(
                    trainer,
                    examples,
                    inp.sft,
                    inp.step,
                    micro_batch,
                    progress,
                    should_stop,
                    run_tokenizer(trainer.tokenizer, inp.model.chat_template),
                ),
            )
            metrics = {"loss": stats.losses[-1], "grad_norm": stats.grad_norms[-1]}
            staged = self._stage(
                trainer, inp.run_id, inp.step, inp.model, inp.sft.seed, micro_batch, metrics, sft=True
            ).directory
        self._step_done(inp.run_id, inp.step)
        log.info("step %d fine-tuned on %d examples: losses %s", inp.step, stats.n_examples, stats.losses)
        return SftResult(
            run_id=inp.run_id,
            step=inp.step,
            staging_dir=str(staged),
            worker_id=self.worker_id,
            losses=stats.losses,
            grad_norms=stats.grad_norms,
            learning_rates=stats.learning_rates,
            n_examples=stats.n_examples,
            n_dropped_overlength=stats.n_dropped_overlength,
            n_trainable_tokens=stats.n_trainable_tokens,
            micro_batch_size=micro_batch,
            seconds=time.monotonic() - started,
        )

    def _stage(
        self,
        trainer: Trainer,
        run_id: str,
        step: int,
        model: ModelSpec,
        seed: int,
        micro_batch: int,
        metrics: dict[str, float],
        sft: bool = False,
    ) -> Held:
        """Stage the trained step (its adapter, optimizer and ``TrainerState``) for ``publish``; the model in
        memory is now this step's. Call holding ``_lock``."""
        held = Held(run_id, step, uuid.uuid4().hex[:16], staging_dir(self.staging_root, run_id, step))
        self._written(held.directory)  # an earlier staging of this step is written before this one
        state = TrainerState(
            staged_id=held.staged_id,
            run_id=run_id,
            step=step,
            base_model=model.base_model,
            seed=seed,
            micro_batch_size=micro_batch,
            worker_id=self.worker_id,
            lora=model.lora.model_dump(mode="json"),
            **({"sft": True} if sft else {}),  # GRPO steps' trainer_state.json stays as it was
        )
        snapshot = trainer.snapshot()
        adapter: concurrent.futures.Future[AdapterFiles] = concurrent.futures.Future()
        wanted = threading.Event()

        def write() -> Path:
            files = None
            try:
                files = snapshot.adapter_files()
                check_finite_weights(snapshot.adapter, str(held.directory))
            except BaseException as err:  # publish_adapter raises it
                adapter.set_exception(err)
            else:
                adapter.set_result(files)
                self._early.start(held.directory, files, run_id, step)
                # The rest is written once the adapter is up, and served: the servers wait for that upload and the
                # reload after it (on a host they share, the same cores), not for this write.
                self._early.settle(held.directory)
                wanted.wait(REST_WAIT_S)
            return stage_checkpoint(held.directory, lambda d: snapshot.write(d, files), state, metrics)

        with self._held_lock:
            # No earlier step's rest, still waiting to be asked for, holds this adapter up on the writer thread.
            for earlier in self._wanted.values():
                earlier.set()
            self._wanted[held.directory] = wanted
            self._writing[held.directory] = self._writer.submit(write)
            self._adapters[held.directory] = adapter
        self._hold(held)
        return held

    def _hold(self, held: Held | None) -> None:
        """Say what the model holds now (under the lock ``_published`` notes a manifest under)."""
        with self._held_lock:
            self.held = held

    def _written(self, directory: Path) -> None:
        """Wait for the staged files of ``directory`` to be written (raising the write's failure), asking for them
        now."""
        with self._held_lock:
            pending = self._writing.get(directory)
            wanted = self._wanted.get(directory)
        if wanted is not None:
            wanted.set()
        if pending is not None:
            pending.result()

    def _step_done(self, run_id: str, step: int) -> None:
        """A step trained and staged: its OOM record goes, and so do staged steps older than the last two."""
        oom_state_file(self.staging_root, run_id, step).unlink(missing_ok=True)
        self._prune(run_id, step)

    def _prune(self, run_id: str, step: int, keep: int = 2) -> None:
        """Drop staged steps and downloaded inputs older than the last ``keep`` (they are published)."""
        directory = run_dir(self.staging_root, run_id)
        for parent in (directory, directory / ".inputs"):
            for old in parent.glob("[0-9]" * 6):
                if int(old.name) < step - keep:
                    self._written(old)
                    shutil.rmtree(old, ignore_errors=True)
                    with self._held_lock:
                        self._writing.pop(old, None)
                        self._adapters.pop(old, None)
                        self._wanted.pop(old, None)
                    self._early.forget(old)

    def _staged(self, inp: PublishInput, written: bool = True) -> Path:
        """The staged step ``inp`` names, its files written (unless not ``written``); ``StagedStateLostError`` when
        this trainer no longer has it (it was started again without its disk): the workflow trains the step
        again."""
        staged = Path(inp.staging_dir)
        if not staged.resolve().is_relative_to(run_dir(self.staging_root, inp.run_id)):
            raise UnsafePathError(
                f"staging_dir {inp.staging_dir} is not under run {inp.run_id}'s staging directory on trainer "
                f"{self.worker_id} ({run_dir(self.staging_root, inp.run_id)}); publish only what train staged"
            )
        if not written:
            return staged
        self._written(staged)
        if not staged.is_dir():
            raise StagedStateLostError(
                f"{staged} does not exist on trainer {self.worker_id}; train step {inp.step} again"
            )
        return staged

    def publish_adapter_sync(self, inp: PublishInput) -> AdapterRef:
        with self._held_lock:
            serialized = self._adapters.get(Path(inp.staging_dir))
        if serialized is None:  # staged by an earlier process of this worker: from its files
            staged = self._staged(inp)
            check_finite_adapter(staged)
            files = None
        else:  # from memory, as soon as serialized (and checked): the optimizer state may still be being written
            staged = self._staged(inp, written=False)
            files = serialized.result()
        uploaded = files is not None and self._early.done(staged)
        with stage_progress.stage("upload"):
            ref, _ = publish_adapter(self.store, staged, inp.run_id, inp.step, files, uploaded)
        return ref

    def publish_sync(self, inp: PublishInput) -> CheckpointRef:
        staged = self._staged(inp)
        state = read_trainer_state(staged)
        check_finite_adapter(staged)
        with stage_progress.stage("upload"):
            ref = publish_staged(
                self.store, staged, inp.run_id, inp.step, {**state.model_dump(), **inp.metrics}
            )
        self._published(state, ref)
        return ref

    def _published(self, state: TrainerState, ref: CheckpointRef) -> None:
        """Note checkpoint ``ref`` on the warm model when it still holds the staging ``state`` describes (a
        later ``start_from`` that names it is then not downloaded). Never waits for a training."""
        with self._held_lock:
            held = self.held
            if held is not None and (held.run_id, held.step, held.staged_id) == (
                ref.run_id, ref.step, state.staged_id
            ):  # fmt: skip
                self.held = dataclasses.replace(held, manifest_sha256=ref.manifest_sha256)

    def publish_initial_sync(self, inp: InitialAdapterInput) -> CheckpointRef:
        prefix = layout.checkpoint_prefix(inp.run_id, 0)
        if self.store.is_complete(prefix):
            return self.store.checkpoint_ref(inp.run_id, 0)
        with self._lock:
            trainer = self.trainer_for(inp.model, "auto")  # as the steps train by default
            trainer.init_adapter(inp.seed)
            held = Held(inp.run_id, 0, uuid.uuid4().hex[:16], staging_dir(self.staging_root, inp.run_id, 0))
            state = TrainerState(
                run_id=inp.run_id,
                step=0,
                base_model=inp.model.base_model,
                seed=inp.seed,
                lora=inp.model.lora.model_dump(mode="json"),
                staged_id=held.staged_id,
            )
            stage_checkpoint(held.directory, trainer.save_state, state, {})
            self._hold(held)
        check_finite_adapter(held.directory)
        ref = publish_staged(self.store, held.directory, inp.run_id, 0, state.model_dump())
        self._published(state, ref)
        return ref
