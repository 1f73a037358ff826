"""Run configuration: what a user writes in ``run.toml`` / ``run.json`` and what ``TrainingRun`` receives.

Every field has bounds and a one-line doc, so this module is the configuration reference.
``dgrpo schema`` exports ``RunSpec.model_json_schema()`` for ``temporal workflow start --input`` users.
"""

from __future__ import annotations

import json
import tomllib
import warnings
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import to_json

from schemas.errors import RunSpecError
from schemas.history_bounds import (
    HISTORY_BYTES_BUDGET,
    HISTORY_BYTES_LIMIT,
    HISTORY_EVENTS_BUDGET,
    HISTORY_EVENTS_LIMIT,
    MAX_CONTINUE_AS_NEW_EVERY,
    MAX_INLINE_SCENARIOS_BYTES,
    MAX_SHARDS_PER_STEP,
    PAYLOAD_BYTES_LIMIT,
    PENDING_ACTIVITIES_LIMIT,
    run_history_bytes,
    run_history_events,
    shards_per_step,
)
from schemas.refs import NAME_PATTERN, ObjectRef

IMPORT_PATH_PATTERN = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"

HEARTBEAT_TIMEOUT_S = 20.0
"""Every stage's heartbeat timeout unless the run sets its own: how long a dead or hung worker can hold an
activity before Temporal retries it on another worker (after the first retry interval, 2 s)."""
HeartbeatTimeout = Annotated[float, Field(ge=10.0, le=30.0)]
"""A run's heartbeat timeout in seconds. At least 10: a worker's heartbeats reach Temporal up to 5 s apart
(``workers/heartbeat_ticker.py``); a shorter timeout takes a busy worker on a loaded machine for a dead one (at 8 s,
a rollouts attempt on a machine at load 30 was timed out while its worker lived)."""

DEFAULT_CONTROL_QUEUE = "dgrpo-control"
DEFAULT_INFERENCE_QUEUE = "dgrpo-inference"
DEFAULT_TRAINER_QUEUE = "dgrpo-trainer"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LoraConfig(_Strict):
    """The LoRA adapter trained on top of the base model."""

    rank: int = Field(16, ge=1, le=1024)
    """LoRA rank r."""
    alpha: float = Field(32.0, gt=0)
    """LoRA scaling alpha (the update is scaled by alpha / rank)."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the LoRA input during training."""
    target_modules: list[str] | Literal["all-linear"] = "all-linear"
    """Module names to adapt, or ``all-linear`` for every projection."""


class TrainConfig(_Strict):
    """How one GRPO step updates the adapter. Per step, as in ART's ``model.train(config=...)``."""

    learning_rate: float = Field(2e-4, gt=0, le=1.0)
    """AdamW learning rate. LoRA on a small model wants ~1e-4..5e-4, far above full fine-tuning."""
    epsilon: float = Field(0.2, gt=0, le=10)
    """Lower PPO clip: the ratio is clipped at 1 - epsilon."""
    epsilon_high: float | None = Field(None, gt=0, le=10)
    """Upper PPO clip (1 + epsilon_high); None means the same as epsilon."""
    importance_sampling: Literal["ppo_clip", "cispo"] = "ppo_clip"
    """``ppo_clip``: clipped surrogate. ``cispo``: truncated-IS weight (detached) times logprob."""
    kl_coef: float = Field(0.0, ge=0)
    """Weight of the KL penalty to the base policy (adapter disabled); 0 turns it off."""
    max_grad_norm: float = Field(1.0, gt=0)
    """Gradients are clipped to this global norm."""
    micro_batch_size: int = Field(8, ge=1, le=4096)
    """Sequences per forward/backward; halved automatically after an out-of-memory failure."""
    epochs: int = Field(1, ge=1, le=16)
    """Passes over the step's data (each with one optimizer step per pass)."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW weight decay on the LoRA parameters."""
    scale_rewards: bool = True
    """Divide group-centred rewards by the group's std (GRPO); False keeps only the centring (Dr. GRPO)."""
    advantage_eps: float = Field(1e-6, gt=0)
    """Added to the std before dividing."""
    length_weighting: bool = False
    """Weight each trajectory's tokens so every trajectory counts equally, whatever its length."""
    max_seq_len: int = Field(2048, ge=16)
    """Longer sequences are dropped (and counted) rather than truncated."""
    precision: Literal["fp32", "bf16"] = "fp32"
    """Trainer compute precision. fp32 keeps the importance ratio exact against fp32 sampling logprobs."""
    seed: int = Field(0, ge=0)
    """Seed for anything random in the step."""


MAX_CHAT_TEMPLATE_CHARS = 65536
"""A run's own chat template is at most this long (the largest templates of current models are ~20 kB)."""


class ModelSpec(_Strict):
    """The model being trained, named as in ART."""

    name: str = Field(pattern=NAME_PATTERN)
    """The trainable model's name; ``model=<name>`` requests are routed to the served adapter, ``<run id>@<step>``."""
    project: str = Field("default", pattern=NAME_PATTERN)
    """Groups runs for metrics (W&B project)."""
    base_model: str = Field(min_length=1)
    """An HF model dir, an HF hub id already in the workers' local HF cache (nothing is downloaded), a LoRA
    adapter dir to warm-start from, or ``smollm2-135m-instruct``."""
    lora: LoraConfig = Field(default_factory=LoraConfig)
    """The adapter's shape."""
    chat_template: str | None = Field(None, min_length=1, max_length=MAX_CHAT_TEMPLATE_CHARS)
    """A Jinja chat template of the run's own (ART's ``_internal_config["chat_template"]``), in place of the
    base model's: the inference server renders the run's requests with it, which an inference worker takes only
    when its operator trusts run specs' templates (``--trust-request-chat-template``), and the trainer renders
    SFT examples and choices without token ids with it. None: the base model's."""


class TaskSpec(_Strict):
    """The environment: the user's rollout function and the scenarios it plays."""

    rollout: str = Field(pattern=IMPORT_PATH_PATTERN)
    """``module:function``, an ``async def rollout(model, scenario) -> Trajectory`` found on PYTHONPATH."""
    scenarios: str | list[dict[str, Any]] | ObjectRef
    """``module:function`` returning a list of dicts, a ``.jsonl``/``.parquet`` path, or the list inline. A run
    stores an inline list once (``layout.scenarios_key``) and passes its rollouts activities that object's
    ``ObjectRef``, which a worker reads only at the run's own key, checked against its sha256."""
    max_exceptions: int = Field(0, ge=0)
    """Failed rollouts tolerated per step (recorded with their group); one more fails the step."""
    rollout_timeout_s: float = Field(600.0, gt=0)
    """One rollout taking longer than this counts as a failed rollout."""
    rollout_concurrency: int = Field(64, ge=1)
    """Rollouts run at once by the inference worker."""

    @model_validator(mode="after")
    def _check_scenarios(self) -> TaskSpec:
        if isinstance(self.scenarios, str):
            s = self.scenarios
            if not ((":" in s and not s.startswith(("/", "."))) or s.endswith((".jsonl", ".parquet"))):
                raise ValueError(
                    "scenarios must be 'module:function', a path ending in .jsonl or .parquet, or a list of dicts"
                )
        elif not self.scenarios:
            raise ValueError("scenarios is an empty list; give at least one scenario")
        return self


class JudgeConfig(_Strict):
    """How trajectories are scored."""

    kind: Literal["rollout", "ruler", "both"] = "rollout"
    """``rollout``: the reward the rollout set. ``ruler``: an LLM judge ranks each group. ``both``: the
    judge's score, with the rollout's own reward kept in metrics as ``original_reward``."""
    model: str | None = None
    """Judge model name on ``base_url``; None uses the base model on our own server."""
    base_url: str | None = None
    """An OpenAI-compatible endpoint; None uses the inference worker's server."""
    api_key_env: str | None = None
    """Name of the environment variable holding the judge's API key (never the key itself)."""
    rubric: str | None = None
    """Extra instructions for the judge; None uses the default RULER rubric."""
    max_tokens: int = Field(512, ge=16)
    """Tokens the judge may write."""


class StorageSpec(_Strict):
    """Deprecated: the object store, bucket included, is the workers' operator's (``DGRPO_S3_*``)."""

    bucket: str | None = Field(None, pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
    """Deprecated. A run naming a bucket other than its workers' ``DGRPO_S3_BUCKET`` is refused."""


class ServingSpec(_Strict):
    """What the run needs from the inference worker; the engine itself is its operator's
    (``dgrpo worker inference --engine ... --max-lora-rank ... --max-loras ... --sleep-mode``)."""

    engine: Literal["cpu", "vllm"] | None = None
    """The engine the run must be served by; None takes whatever the inference worker runs. A worker
    running another engine refuses the run."""
    keep_adapters: int = Field(3, ge=1)
    """This run's newest adapters kept loaded (leased ones are kept as well); the worker refuses more
    than its ``--max-loras`` minus one."""


class TaskQueues(_Strict):
    """Temporal task queues of the three workers."""

    control: str = DEFAULT_CONTROL_QUEUE
    inference: str = DEFAULT_INFERENCE_QUEUE
    trainer: str = DEFAULT_TRAINER_QUEUE


class MetricsSpec(_Strict):
    """Where metrics go besides the run's metrics Parquet."""

    wandb: bool = True
    """Log to W&B (offline unless ``WANDB_API_KEY`` is set in the worker's environment)."""


class CheckpointsSpec(_Strict):
    """Which published checkpoints a run keeps in the store (ART's ``delete_checkpoints``, after every step)."""

    keep_last: int | None = Field(None, ge=1, le=100_000)
    """Keep the newest N checkpoints and delete older ones after each step; None keeps every checkpoint."""
    keep_best_metric: str | None = Field(None, pattern=r"^[A-Za-z0-9_./-]{1,128}$")
    """Also keep the checkpoint with the highest value of this metric (e.g. ``train/reward``); needs keep_last."""

    @model_validator(mode="after")
    def _check_best(self) -> CheckpointsSpec:
        if self.keep_best_metric is not None and self.keep_last is None:
            raise ValueError(
                "keep_best_metric only matters when old checkpoints are deleted: set keep_last too "
                "(e.g. keep_last = 3), or leave keep_best_metric out"
            )
        return self


class RunSpec(_Strict):
    """A whole GRPO training run: the input of the ``TrainingRun`` workflow."""

    run_id: str = Field(pattern=NAME_PATTERN)
    """Unique id; also the workflow id. Starting a run with an existing id resumes it."""
    model: ModelSpec
    """The model being trained."""
    task: TaskSpec
    """The rollout function and scenarios."""
    steps: int = Field(ge=1, le=1_000_000)
    """Training steps to run (the run ends at step == steps)."""
    groups_per_step: int = Field(ge=1, le=100_000)
    """Scenarios per step; each becomes one group."""
    group_size: int = Field(ge=2, le=4096)
    """Rollouts per scenario; GRPO compares them with each other, so at least 2."""
    groups_per_shard: int = Field(8, ge=1, le=100_000)
    """Most groups per rollouts activity: a step's groups split into shards that inference workers share."""
    train: TrainConfig = Field(default_factory=TrainConfig)
    """The optimizer and loss settings."""
    judge: JudgeConfig = Field(default_factory=JudgeConfig)
    """How rollouts are scored."""
    mode: Literal["sync", "pipelined", "shared"] = "sync"
    """``sync``: one stage at a time. ``pipelined``: step n+1 rolls out while step n trains.
    ``shared``: one device; inference sleeps while training runs."""
    max_staleness: int = Field(1, ge=0)
    """Pipelined mode: groups sampled more than this many policy steps ago are dropped."""
    shared_device: bool = False
    """Deprecated: say ``mode = "shared"`` instead. True with mode ``pipelined`` is refused."""
    storage: StorageSpec = Field(default_factory=StorageSpec)
    """Object store bucket."""
    serving: ServingSpec = Field(default_factory=ServingSpec)
    """Inference server settings."""
    task_queues: TaskQueues = Field(default_factory=TaskQueues)
    """Task queues the workers listen on."""
    metrics: MetricsSpec = Field(default_factory=MetricsSpec)
    """Metrics sinks."""
    checkpoints: CheckpointsSpec = Field(default_factory=CheckpointsSpec)
    """Checkpoint retention (default: keep them all)."""
    continue_as_new_every: int = Field(5, ge=1)
    """Steps per workflow run before continue-as-new keeps history bounded (fewer with many shards per step:
    a run's worst-case history must fit a fifth of Temporal's limits, see ``schemas/history_bounds.py``)."""
    seed: int = Field(0, ge=0)
    """Seed for scenario order and sampling."""
    heartbeat_timeout_s: HeartbeatTimeout = HEARTBEAT_TIMEOUT_S
    """Seconds a worker may go silent before its activity is retried on another (every stage's heartbeat
    timeout): a killed, partitioned or hung worker costs the run about this plus 2 s. Shorter notices faults
    sooner and leaves a loaded worker less room (the fault tests run at 10)."""

    def deprecations(self) -> list[str]:
        """One line per deprecated setting this spec uses, saying what to do instead."""
        out = []
        if self.shared_device:
            out.append("shared_device is deprecated: say mode = 'shared' for one device, or leave it out")
        if self.storage.bucket is not None:
            out.append(
                "storage.bucket is deprecated: the bucket is the workers' (DGRPO_S3_BUCKET); "
                "leave it out of the run spec"
            )
        return out

    @model_validator(mode="after")
    def _check_mode(self) -> RunSpec:
        if self.mode == "pipelined" and self.shared_device:
            raise ValueError(
                "mode 'pipelined' needs dedicated inference and trainer devices, but shared_device is true; "
                "use mode 'shared' (or 'sync'), or run inference and training on separate devices"
            )
        return self

    def inline_scenarios_bytes(self) -> int:
        """Bytes of JSON the inline scenario list adds to the run's input and to the activity that stores it
        (0 for a file, a ``module:function`` or a stored list's ref)."""
        scenarios = self.task.scenarios
        return len(to_json(scenarios)) if isinstance(scenarios, list) else 0

    def history_bounds_error(self) -> str | None:
        """Why this run's shape could outgrow Temporal's limits (None: it fits). Checked where a run starts
        (``parse_run_spec``, ``run_control.start_run`` and a new ``TrainingRun``), not on every decode of a
        spec, so a run already in flight under looser bounds keeps running and replaying."""
        if self.continue_as_new_every > MAX_CONTINUE_AS_NEW_EVERY:
            return (
                f"continue_as_new_every {self.continue_as_new_every} is over {MAX_CONTINUE_AS_NEW_EVERY}: a "
                "longer workflow run carries more history than Temporal's limits allow for"
            )
        shards = shards_per_step(self.groups_per_step, self.groups_per_shard)
        if shards > MAX_SHARDS_PER_STEP:
            return (
                f"groups_per_step {self.groups_per_step} in shards of groups_per_shard {self.groups_per_shard} "
                f"is {shards} rollouts activities per step, all pending at once; at most {MAX_SHARDS_PER_STEP} "
                f"keeps a step far below Temporal's {PENDING_ACTIVITIES_LIMIT:,} pending activities and its "
                f"history bounded: set groups_per_shard to at least "
                f"{shards_per_step(self.groups_per_step, MAX_SHARDS_PER_STEP)}, or lower groups_per_step"
            )
        inline = self.inline_scenarios_bytes()
        if inline > MAX_INLINE_SCENARIOS_BYTES:
            return (
                f"task.scenarios: the inline list is {inline:,} bytes of JSON, carried in the run's own input "
                f"(the spec); at most {MAX_INLINE_SCENARIOS_BYTES:,} keeps that input below Temporal's "
                f"{PAYLOAD_BYTES_LIMIT:,}-byte payload limit: put the scenarios in a .jsonl or .parquet file, "
                "or return them from a 'module:function'"
            )
        events = run_history_events(shards, self.continue_as_new_every)
        spec_bytes = len(self.model_dump_json())
        size = run_history_bytes(shards, self.continue_as_new_every, inline, spec_bytes)
        if events <= HISTORY_EVENTS_BUDGET and size <= HISTORY_BYTES_BUDGET:
            return None
        fits = [
            n
            for n in range(1, self.continue_as_new_every)
            if run_history_events(shards, n) <= HISTORY_EVENTS_BUDGET
            and run_history_bytes(shards, n, inline, spec_bytes) <= HISTORY_BYTES_BUDGET
        ]
        if events > HISTORY_EVENTS_BUDGET:
            worst = f"{events:,} events (Temporal's limit is {HISTORY_EVENTS_LIMIT:,}; a run may use {HISTORY_EVENTS_BUDGET:,})"
        else:
            worst = f"{size:,} bytes (Temporal's limit is {HISTORY_BYTES_LIMIT:,}; a run may use {HISTORY_BYTES_BUDGET:,})"
        fix = f"set continue_as_new_every to at most {fits[-1]}" if fits else "raise groups_per_shard"
        return (
            f"continue_as_new_every {self.continue_as_new_every} with {shards} rollouts shard(s) per step lets one "
            f"workflow run's history reach {worst} when every resample and retrain is taken: {fix}"
            + (", or put the inline scenarios in a file" if inline else "")
        )


_PATTERN_HINTS = {
    NAME_PATTERN: "use 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit",
    IMPORT_PATH_PATTERN: "use an import path 'package.module:function' (a module on PYTHONPATH)",
}


def format_validation_error(err: ValidationError, source: str) -> str:
    """One line per problem: ``<source>: <field.path>: <what is wrong> (got <value>)``."""
    lines = [f"{source}: {err.error_count()} problem(s) in the run spec:"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"]
        if e["type"] == "missing":
            msg = "missing; this field is required"
        elif e["type"] == "extra_forbidden":
            msg = "unknown field; remove it or check its spelling (see `dgrpo schema`)"
        elif e["type"] == "string_pattern_mismatch":
            pattern = str((e.get("ctx") or {}).get("pattern", ""))
            msg = _PATTERN_HINTS.get(pattern, msg)
        value = e.get("input")
        shown = e["type"] not in ("missing", "extra_forbidden") and not isinstance(value, dict | list)
        got = f" (got {value!r})" if shown else ""
        lines.append(f"  - {loc}: {msg}{got}")
    return "\n".join(lines)


def parse_run_spec(data: Any, source: str = "run spec") -> RunSpec:
    """Validate a decoded mapping into a RunSpec, raising RunSpecError with field-naming messages."""
    if not isinstance(data, dict):
        raise RunSpecError(f"{source}: a run spec is a table/object of fields, got {type(data).__name__}")
    try:
        spec = RunSpec.model_validate(data)
    except ValidationError as err:
        raise RunSpecError(format_validation_error(err, source)) from None
    too_big = spec.history_bounds_error()
    if too_big:
        raise RunSpecError(f"{source}: {too_big}")
    for line in spec.deprecations():
        warnings.warn(f"{source}: {line}", FutureWarning, stacklevel=2)
    return spec


def load_run_spec(path: str | Path, overrides: dict[str, Any] | None = None) -> RunSpec:
    """Load a RunSpec from a ``.toml`` or ``.json`` file, with optional dotted-key overrides."""
    p = Path(path)
    if not p.is_file():
        raise RunSpecError(f"{p}: no such run spec file")
    text = p.read_text()
    try:
        if p.suffix == ".toml":
            data: Any = tomllib.loads(text)
        elif p.suffix == ".json":
            data = json.loads(text)
        else:
            raise RunSpecError(f"{p}: a run spec file ends in .toml or .json")
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as err:
        raise RunSpecError(f"{p}: not valid {p.suffix[1:].upper()}: {err}") from None
    for dotted, value in (overrides or {}).items():
        node = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return parse_run_spec(data, str(p))
