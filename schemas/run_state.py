"""The small state a ``TrainingRun`` carries across continue-as-new, and what its ``status`` query answers."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas.activities import AdvantagesResult, RunTexts, SftConfig, SftResult, TrainResult
from schemas.config import (
    HEARTBEAT_TIMEOUT_S,
    HeartbeatTimeout,
    ModelSpec,
    Scheduling,
    ServingSpec,
    TaskQueues,
    TrainConfig,
)
from schemas.refs import AdapterRef, CheckpointRef, Name, ObjectRef, TrajectoriesRef

Phase = Literal[
    "starting",
    "rollouts",
    "judge",
    "advantages",
    "sleep",
    "train",
    "publish",
    "wake_up",
    "reload",
    "metrics",
    "paused",
    "done",
    "stopped",
    "failed",
]

MAX_HISTORY = 200
"""Step summaries kept in the state (older ones live in the metrics Parquet)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StepSummary(_Strict):
    """What one finished step left behind: small numbers and the checkpoint it served."""

    step: int = Field(ge=0)
    reward_mean: float | None = None
    reward_std: float | None = None
    n_trajectories: int = Field(0, ge=0)
    n_exceptions: int = Field(0, ge=0)
    n_groups_zero_variance: int = Field(0, ge=0)
    policy_step: int = Field(0, ge=0)
    """The policy that sampled this step's trajectories (step - 1 in sync mode)."""
    loss: float | None = None
    checkpoint: CheckpointRef | None = None
    resampled: int = Field(0, ge=0)
    """Times the step was rolled out again because no group had reward variance."""
    seconds: dict[str, float] = Field(default_factory=dict)
    """Wall seconds per phase."""
    train_metrics: dict[str, float] = Field(default_factory=dict)
    """The trainer's numbers under ART's names (``loss/mean_importance_ratio``, ``loss/clip_fraction``, ...)."""
    adapter_sha256: str | None = None
    """The adapter served for this step (``AdapterRef.adapter_sha256``; None in runs before it was kept)."""
    trained_again: bool = False
    """Its trainer vanished after its adapter was served, before its checkpoint was resumable: the step was trained
    again from the checkpoint before it (``checkpoint``, ``loss`` and ``adapter_sha256`` are the second
    training's)."""


class UnsettledStep(_Strict):
    """Pipelined mode: a served step whose checkpoint was not yet resumable when the run continued as new. The
    continued run writes the rest of its checkpoint beside its first training, which continues from the step's
    staging on the trainer that holds it (docs/pipelining.md#continue-as-new)."""

    step: int = Field(ge=1)
    scored: TrajectoriesRef
    """The rollouts it trained on (trained again on them if its trainer is lost before the rest is written)."""
    advantages: AdvantagesResult
    policy: int = Field(ge=0)
    """The policy step that sampled ``scored``."""
    resampled: int = Field(0, ge=0)
    result: TrainResult
    """Its training: the trainer and the staging that hold it."""
    adapter: AdapterRef
    """Its served adapter (servable)."""


class RunState(_Strict):
    """Carried across continue-as-new; a fresh start (no state) recovers it from the newest checkpoint."""

    step: int = Field(0, ge=0)
    """The newest step whose adapter is served."""
    checkpoint: CheckpointRef | None = None
    """The newest resumable checkpoint of a served step (None until step 0 is published): what a continued run
    trains from. The served step's own once its optimizer state is written (before then, the step before it)."""
    adapter: str | None = None
    """The served adapter name (``<run id>@<step>``)."""
    adapter_sha256: str | None = None
    """The ``adapter_sha256`` of the served adapter (None in runs before it was kept)."""
    history: list[StepSummary] = Field(default_factory=list)
    dropped_stale_groups: int = Field(0, ge=0)
    """Pipelined mode: groups dropped because their policy was older than ``max_staleness``."""
    dropped_lost_adapter_groups: int = Field(0, ge=0)
    """Groups dropped because the adapter that sampled them was lost with its trainer (its step trained again came
    out another adapter); they were rolled out again."""
    prefetched: TrajectoriesRef | None = None
    """Pipelined mode: rollouts already made for step ``step + 1``."""
    prefetched_policy: int = Field(0, ge=0)
    """The policy step that sampled ``prefetched``."""
    prefetched_advantages: AdvantagesResult | None = None
    """Pipelined mode: the advantages of ``prefetched``, computed before the run continued as new (None: computed
    again)."""
    unsettled: UnsettledStep | None = None
    """Pipelined mode: the served step whose rest of checkpoint the continued run writes (``checkpoint`` is the
    one before it until then)."""
    scenarios: ObjectRef | None = None
    """The spec's inline scenario list as stored once for the run (``layout.scenarios_key``); None until it
    is, or when the spec names a file or a ``module:function``."""
    texts: RunTexts | None = None
    """The spec's chat template and judge rubric as stored once for the run (``layout.run_text_key``); None
    until they are, or when it has neither."""
    paused: bool = False
    stopping: bool = False


class RunStatus(_Strict):
    """The answer of the ``status`` query."""

    run_id: Name
    mode: str
    steps: int
    """Steps the run trains in all."""
    step: int
    """Newest served step."""
    phase: Phase
    working_on: int | None = None
    """The step in progress (None between steps)."""
    paused: bool
    stopping: bool
    last_checkpoint: CheckpointRef | None
    adapter: str | None
    history: list[StepSummary]
    dropped_stale_groups: int
    dropped_lost_adapter_groups: int = 0
    """Groups dropped because the adapter that sampled them was lost with its trainer (``RunState``'s)."""
    phase_seconds: dict[str, float] = Field(default_factory=dict)
    """Seconds per phase of the step in progress so far."""
    error: str | None = None
    scheduling: Scheduling = Field(default_factory=Scheduling)
    """The priority and fairness the run's activities carry."""


class TrainStepInput(_Strict):
    """One durable step from uploaded trajectories: advantages -> train -> publish -> reload."""

    run_id: Name
    model: ModelSpec
    trajectories: TrajectoriesRef
    train: TrainConfig = Field(default_factory=TrainConfig)
    step: int = Field(ge=1)
    """The step being produced (checkpoint ``step``); trains from checkpoint ``step - 1``."""
    start_from: CheckpointRef | None = None
    """Checkpoint ``step - 1``; None looks up the newest checkpoint of the run."""
    serving: ServingSpec = Field(default_factory=ServingSpec)
    task_queues: TaskQueues = Field(default_factory=TaskQueues)
    shared_device: bool = False
    """Sleep the inference engine while training (one device)."""
    chat_template_ref: ObjectRef | None = None
    """The run's own chat template as stored once, in place of ``model.chat_template`` (``TrainingRun``)."""
    advance_without_signal: bool = False
    """When no group's rewards differ, publish checkpoint ``step - 1`` again as ``step`` and serve it (the
    step advances and nothing is trained, as in ART >= 0.4.4) instead of failing with ``NoLearningSignal``."""
    scheduling: Scheduling = Field(default_factory=Scheduling)
    """The priority and fairness of every activity of the step (the run's)."""
    heartbeat_timeout_s: HeartbeatTimeout = HEARTBEAT_TIMEOUT_S
    """The run's ``RunSpec.heartbeat_timeout_s``: every stage's heartbeat timeout."""


class TrainStepResult(_Strict):
    step: int
    checkpoint: CheckpointRef
    adapter: str
    adapter_sha256: str | None = None
    """What the servers serve under ``adapter`` (``AdapterRef.adapter_sha256``; None from workers before it)."""
    loss: float | None = None
    n_trajectories: int = 0
    n_groups_zero_variance: int = 0
    skipped: bool = False
    """True when checkpoint ``step`` already existed (a retried client call) and was only reloaded."""
    trained: bool = True
    """False when no group's rewards differed: checkpoint ``step`` is checkpoint ``step - 1`` published again."""
    seconds: dict[str, float] = Field(default_factory=dict)
    metrics: dict[str, float] = Field(default_factory=dict)
    """The trainer's numbers under ART's names (``TrainResult.metrics``: ``loss/mean_importance_ratio``, ...)."""


class TrainSFTInput(_Strict):
    """One durable ``model.train_sft`` call: train on uploaded chats -> publish -> reload; the step advances."""

    run_id: Name
    model: ModelSpec
    examples: ObjectRef
    sft: SftConfig
    step: int = Field(ge=1)
    """The step being produced (checkpoint ``step``); trains from checkpoint ``step - 1``."""
    serving: ServingSpec = Field(default_factory=ServingSpec)
    task_queues: TaskQueues = Field(default_factory=TaskQueues)
    shared_device: bool = False
    """Sleep the inference engine while training (one device)."""
    scheduling: Scheduling = Field(default_factory=Scheduling)
    """The priority and fairness of every activity of the call (the run's)."""
    heartbeat_timeout_s: HeartbeatTimeout = HEARTBEAT_TIMEOUT_S
    """Every stage's heartbeat timeout (``RunSpec.heartbeat_timeout_s``)."""


class TrainSFTResult(_Strict):
    step: int
    checkpoint: CheckpointRef
    adapter: str
    trained: SftResult | None = None
    """What training reported; None when checkpoint ``step`` already existed (a retried call) and was served."""
    seconds: dict[str, float] = Field(default_factory=dict)


class ServeModelInput(_Strict):
    """Serve a run's newest checkpoint, publishing checkpoint 0 first when the run has none."""

    run_id: Name
    model: ModelSpec
    serving: ServingSpec = Field(default_factory=ServingSpec)
    task_queues: TaskQueues = Field(default_factory=TaskQueues)
    seed: int = Field(0, ge=0)
    """Seed of a fresh step-0 adapter (ignored when ``model.base_model`` is a warm-start adapter)."""
    shared: bool = False
    """The run trains in mode ``shared`` (the engine sleeps while the trainer runs)."""
    bucket: str | None = None
    """The bucket the run's spec names (deprecated; checked against the workers')."""
    scheduling: Scheduling = Field(default_factory=Scheduling)
    """The priority and fairness of every activity of the call (the run's)."""
    heartbeat_timeout_s: HeartbeatTimeout = HEARTBEAT_TIMEOUT_S
    """The run's ``RunSpec.heartbeat_timeout_s``: every stage's heartbeat timeout."""


class ServeModelResult(_Strict):
    step: int
    checkpoint: CheckpointRef
    adapter: str
    """The served name of ``checkpoint`` (``<run id>@<step>``)."""
    adapter_sha256: str | None = None
    """What the servers now serve under ``adapter`` (None from inference workers before it was reported)."""
