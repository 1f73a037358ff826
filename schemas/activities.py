"""One typed input and one typed result per activity: the contract between workflows and workers.

Inputs carry references (URIs, counts) and small configs, never trajectories or tensors. Adding a
field with a default never breaks a caller or a recorded workflow history.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from schemas.config import JudgeConfig, ModelSpec, ServingSpec, TaskSpec, TrainConfig
from schemas.numbers import RUN_SEED_MAX, SEED_MAX
from schemas.refs import (
    SHA256_PATTERN,
    AdapterName,
    AdapterRef,
    CheckpointRef,
    Name,
    ObjectRef,
    TrajectoriesRef,
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ActivityName(StrEnum):
    """The name each activity registers under and the workflows call it by, defined once."""

    ROLLOUTS = "rollouts"
    MERGE_ROLLOUTS = "merge_rollouts"
    STORE_SCENARIOS = "store_scenarios"
    STORE_RUN_TEXTS = "store_run_texts"
    RELOAD = "reload"
    SERVING_CONTROL = "serving_control"
    JUDGE = "judge"
    ADVANTAGES = "compute_advantages"
    METRICS = "metrics"
    TRAIN = "train"
    PUBLISH = "publish"
    PUBLISH_ADAPTER = "publish_adapter"
    PUBLISH_INITIAL = "publish_initial"
    REPUBLISH = "republish_checkpoint"
    LATEST_CHECKPOINT = "latest_checkpoint"
    RETAIN_CHECKPOINTS = "retain_checkpoints"
    TRAIN_SFT = "train_sft"


# --- inference queue -------------------------------------------------------------------------


class RolloutsInput(_Strict):
    """Run ``group_size`` rollouts for each of ``groups_per_step`` scenarios and store them: the whole step, or
    one shard of it (``shard`` of ``shards``)."""

    run_id: Name
    step: int = Field(ge=0)
    """The step these rollouts feed (trajectories land under ``steps/<step>``)."""
    model_name: Name
    """What the rollout function sends as ``model``; routed to ``adapter``."""
    adapter: AdapterName | None = None
    """Served adapter to pin (``<name>@<policy_step>``); None means the base model."""
    policy_step: int = Field(0, ge=0)
    """Step of the policy that samples (recorded on every trajectory)."""
    task: TaskSpec
    """The run's task; an inline scenario list arrives as the ``ObjectRef`` of its stored copy (newer runs)."""
    groups_per_step: int = Field(ge=1)
    """Scenarios this activity rolls out: the step's, or its shard's share of them."""
    group_size: int = Field(ge=1)
    scenario_offset: int = Field(0, ge=0)
    """Index of this activity's first scenario in the (cycled, seeded-shuffled) scenario list."""
    seed: int = Field(0, ge=0, le=SEED_MAX)
    """The run's seed, or one derived from it (a resample's)."""
    shard: int = Field(0, ge=0)
    """Which part of the step this is; with ``shards`` > 1 it goes to ``layout.rollout_shard_key``."""
    shards: int = Field(1, ge=1)
    """Parts the step's rollouts are split into; 1 writes the step's ``trajectories.parquet`` itself, unless
    ``merged``."""
    chat_template: str | None = None
    """The run's own chat template (``ModelSpec.chat_template``), sent with each of its chat requests (runs
    whose history predates ``chat_template_ref``)."""
    chat_template_ref: ObjectRef | None = None
    """The run's own chat template as stored once (``store_run_texts``), in place of ``chat_template``."""
    merged: bool = False
    """The workflow merges this activity's table into the step's (as it always does with ``shards`` > 1), so it
    goes to its attempt's own ``layout.rollout_shard_key``: a late attempt never overwrites the recorded one."""

    @model_validator(mode="after")
    def _check_shard(self) -> RolloutsInput:
        if self.shard >= self.shards:
            raise ValueError(f"shard {self.shard} does not exist in a step of {self.shards} shard(s)")
        return self


class ReloadInput(_Strict):
    """Load a published checkpoint into every server this inference worker fronts, once the worker has
    checked it can serve the run (engine, LoRA rank, adapters kept, sleep mode, bucket)."""

    model_name: Name
    checkpoint: CheckpointRef | AdapterRef
    """Resumable (its whole manifest) or only servable (its adapter manifest): either way only the adapter's files
    are downloaded, each checked against the manifest the ref names."""
    serving: ServingSpec = Field(default_factory=ServingSpec)
    lora_rank: int | None = Field(None, ge=1)
    """The run's LoRA rank; refused above the engine's ``--max-lora-rank``."""
    shared: bool = False
    """The run puts the engine to sleep while it trains (mode ``shared``): refused by an engine that cannot."""
    chat_template: bool = False
    """The run has a chat template of its own: refused by an engine that does not take one from requests."""
    bucket: str | None = None
    """The bucket the run's spec names (deprecated); refused when it is not the worker's."""


class ReloadResult(_Strict):
    adapter: AdapterName
    """The name the adapter is now served under (``<run id>@<step>``)."""
    servers: list[str]
    """Base URLs of the servers that loaded it."""
    unloaded: list[str] = Field(default_factory=list)
    """Older adapters evicted (none that a lease still holds)."""
    adapter_sha256: str | None = Field(None, pattern=SHA256_PATTERN)
    """The ``adapter_sha256`` of what the servers now serve under ``adapter`` (None from workers before it)."""


class ServingControlInput(_Strict):
    """Put the inference engine to sleep (shared mode, before training) or wake it up."""

    action: Literal["sleep", "wake_up"]


# --- control queue ---------------------------------------------------------------------------


class StoreScenariosInput(_Strict):
    """Store a run's inline scenario list once, at ``layout.scenarios_key`` (by its content hash), so the
    rollouts activities carry its ``ObjectRef`` instead of the list."""

    run_id: Name
    scenarios: list[dict[str, Any]] = Field(min_length=1)


RunTextKind = Literal["chat_template", "rubric"]


class StoreRunTextsInput(_Strict):
    """Store a run's large fixed texts once, each at ``layout.run_text_key`` (by its content hash), so the
    activities that use them carry an ``ObjectRef`` instead of the text."""

    run_id: Name
    texts: dict[RunTextKind, str] = Field(min_length=1)


class RunTexts(_Strict):
    """The refs of a run's stored texts (``store_run_texts``'s result, carried in the run's state)."""

    chat_template: ObjectRef | None = None
    """``model.chat_template`` as stored."""
    rubric: ObjectRef | None = None
    """``judge.rubric`` as stored."""


class MergeRolloutsInput(_Strict):
    """Concatenate a step's rollout shards, in order, into its ``trajectories.parquet``."""

    run_id: Name
    step: int = Field(ge=0)
    shards: list[TrajectoriesRef] = Field(min_length=1)
    """Each shard's stored rollouts, in shard order (verified by sha256 when read)."""
    max_exceptions: int = Field(0, ge=0)
    """The task's failed rollouts tolerated per step; more across all shards fails the step."""


class JudgeInput(_Strict):
    run_id: Name
    step: int = Field(ge=0)
    trajectories: TrajectoriesRef
    judge: JudgeConfig
    base_model_name: str
    """What the default judge asks the inference server for (the base model)."""
    rubric_ref: ObjectRef | None = None
    """The run's ``judge.rubric`` as stored once (``store_run_texts``), in place of ``judge.rubric``."""


class AdvantagesInput(_Strict):
    run_id: Name
    step: int = Field(ge=0)
    trajectories: TrajectoriesRef
    """The scored trajectories of the step."""
    train: TrainConfig


class AdvantagesResult(_Strict):
    ref: ObjectRef
    """``steps/<step>/advantages.parquet``: the trajectories with an ``advantage`` column."""
    n_trajectories: int = Field(ge=0)
    """Trajectories kept (in groups with reward variance)."""
    n_groups: int = Field(ge=0)
    n_groups_zero_variance: int = Field(ge=0)
    """Groups dropped because every reward was equal (no learning signal)."""


class RetentionInput(_Strict):
    """Delete a run's checkpoints but the newest ``keep_last`` (of those complete when it deletes), the best by
    ``keep_best_metric``, ``protect`` and every one from step ``keep_from`` on."""

    run_id: Name
    keep_last: int = Field(ge=1)
    keep_best_metric: str | None = Field(None, pattern=r"^[A-Za-z0-9_./-]{1,128}$")
    protect: list[int] = Field(default_factory=list)
    keep_from: int | None = Field(None, ge=0)
    """Every checkpoint of this step or a later one stays: the oldest that the run serves, reloads or samples
    with, or may yet (``TrainingRun``'s, when it schedules retention). It only rises as the run goes on, so a
    value read before the deletion still keeps everything the run needs when the deletion happens."""


class MetricsInput(_Strict):
    run_id: Name
    project: Name
    model_name: Name
    step: int = Field(ge=0)
    metrics: dict[str, float]
    wandb: bool = True


# --- trainer queue ---------------------------------------------------------------------------


class _StepToTrain(_Strict):
    """What every training activity (``train``, ``train_sft``) is given: the step it produces and where from."""

    run_id: Name
    step: int = Field(ge=1)
    """The step being produced: the result is checkpoint ``step``."""
    model: ModelSpec
    start_from: CheckpointRef | None = None
    """Checkpoint ``step - 1`` (adapter + optimizer); None starts a fresh adapter (or the warm-start one)."""


class _StagedStep(_Strict):
    """What every training activity returns: the step it staged on its worker for ``publish``."""

    run_id: Name
    step: int
    staging_dir: str
    """Local directory on the trainer worker holding the adapter, optimizer and trainer state."""
    worker_id: str
    """The trainer worker that holds ``staging_dir``."""
    n_trainable_tokens: int = Field(ge=0)
    n_dropped_overlength: int = Field(0, ge=0)
    micro_batch_size: int = Field(ge=1)
    """The micro-batch the step finished with (smaller than configured after an OOM)."""
    seconds: float = Field(ge=0)


class StagedRef(_Strict):
    """A step a trainer worker trained and staged, whose checkpoint may still be uploading (pipelined mode)."""

    run_id: Name
    step: int = Field(ge=1)
    worker_id: str
    """The trainer worker that staged it (its own task queue is where training continues from it)."""
    staged_id: str
    """Names this staging of the step (``TrainResult.staged_id``): a step staged again is another one."""


class TrainInput(_StepToTrain):
    """Train the adapter one GRPO step on ``advantages`` and stage it for publishing."""

    advantages: ObjectRef
    train: TrainConfig
    chat_template_ref: ObjectRef | None = None
    """The run's own chat template as stored once (``store_run_texts``), in place of ``model.chat_template``."""
    continue_from: StagedRef | None = None
    """Pipelined mode: continue from step ``step - 1`` as this very worker staged it (in memory, or its staged
    files), while its checkpoint uploads beside; ``start_from`` is then None. A worker that no longer holds that
    staging fails with ``StagedStateLost``, and the workflow trains from the manifested checkpoint instead."""

    @model_validator(mode="after")
    def _one_start(self) -> TrainInput:
        if self.continue_from is not None:
            if self.start_from is not None:
                raise ValueError("give start_from or continue_from, not both")
            if (self.continue_from.run_id, self.continue_from.step) != (self.run_id, self.step - 1):
                raise ValueError(
                    f"continue_from is step {self.continue_from.step} of run {self.continue_from.run_id!r}; "
                    f"step {self.step} of run {self.run_id!r} continues from its step {self.step - 1}"
                )
        return self


class TrainResult(_StagedStep):
    loss: float
    grad_norm: float
    n_sequences: int = Field(ge=0)
    metrics: dict[str, float] = Field(default_factory=dict)
    """The step's training numbers under ART's names: ``loss/grad_norm``, ``loss/mean_importance_ratio`` (the
    mean over trained tokens of exp(trainer logprob - sampling logprob), before the update: 1 when the server
    and the trainer agree), ``loss/clip_fraction`` (trained tokens outside the clip range)."""
    staged_id: str = ""
    """Names this staging of the step, for a ``TrainInput.continue_from`` (empty in results before it)."""
    compute_seconds: float = Field(0.0, ge=0)
    """The forward, backward and optimizer passes alone (``seconds`` is the whole attempt); 0 in results before."""


class PublishInput(_Strict):
    run_id: Name
    step: int = Field(ge=0)
    staging_dir: str
    metrics: dict[str, float] = Field(default_factory=dict)


class RepublishInput(_Strict):
    """Publish checkpoint ``source`` again as checkpoint ``step`` of its run: a step that trained nothing."""

    source: CheckpointRef
    step: int = Field(ge=1)


class CheckpointLookup(_Strict):
    """Find the newest manifested checkpoint of a run (resume)."""

    run_id: Name


class InitialAdapterInput(_Strict):
    """Publish checkpoint 0 of a run: a fresh LoRA from ``seed``, or the warm-start adapter of ``base_model``."""

    run_id: Name
    model: ModelSpec
    seed: int = Field(0, ge=0, le=RUN_SEED_MAX)
    """Seed of the fresh adapter's initialisation (ignored for a warm start)."""


class SftConfig(_Strict):
    """How one supervised fine-tuning call trains: one optimizer step per batch of examples."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    learning_rates: list[Annotated[float, Field(ge=0, le=1.0)]] = Field(min_length=1, max_length=100_000)
    """One learning rate per batch (ART's ``TrainSFTConfig.learning_rate``: a value repeated, or a list), each
    within [0, 1] (0: a schedule's last step; a negative one would climb the loss)."""
    batch_size: int = Field(2, ge=1, le=4096)
    """Examples per optimizer step (ART's ``"auto"`` is 2, as in ART's local backend)."""
    max_seq_len: int = Field(2048, ge=16, le=1_048_576)
    """Longer examples are dropped and counted, never truncated."""
    max_grad_norm: float = Field(1.0, gt=0, le=1e6)
    assistant_turns: Literal["all", "last"] = "all"
    """Which assistant turns are the targets: every one, or only each example's last (ART 0.5.23's
    ``TrainSFTConfig.assistant_turns``), the earlier ones then context."""
    micro_batch_size: int = Field(8, ge=1, le=4096)
    """Sequences per forward pass within a batch; halved after an out-of-memory failure."""
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """As ``TrainConfig.precision``: ``auto`` is bf16 on a CUDA GPU that has it, fp32 elsewhere."""
    seed: int = Field(0, ge=0, le=RUN_SEED_MAX)
    """Seed of a fresh adapter (a run's first step) and of LoRA dropout."""


class SftInput(_StepToTrain):
    """Fine-tune the adapter on chat examples (cross-entropy on assistant tokens) and stage it as ``step``."""

    examples: ObjectRef
    """A JSONL of ``{"messages": [...], "tools": [...]}`` chats, one per line (``layout.sft_examples_key``)."""
    sft: SftConfig


class SftResult(_StagedStep):
    losses: list[float]
    """Mean cross-entropy per assistant token of each batch, before its update."""
    grad_norms: list[float]
    learning_rates: list[float]
    n_examples: int = Field(ge=0)
