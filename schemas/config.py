"""Run configuration: what a user writes in ``run.toml`` / ``run.json`` and what ``TrainingRun`` receives.

Every field has bounds and a one-line doc, so this module is the configuration reference.
``dgrpo schema`` exports ``RunSpec.model_json_schema()`` for ``temporal workflow start --input`` users.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
import warnings
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, model_validator
from pydantic_core import to_json

from schemas.errors import RunSpecError
from schemas.history_bounds import (
    HISTORY_BYTES_BUDGET,
    HISTORY_BYTES_LIMIT,
    HISTORY_EVENTS_BUDGET,
    HISTORY_EVENTS_LIMIT,
    MAX_CONTINUE_AS_NEW_EVERY,
    MAX_INLINE_SCENARIOS_BYTES,
    MAX_RUN_TEXT_CHARS,
    MAX_SHARDS_PER_STEP,
    MAX_SPEC_BYTES,
    PAYLOAD_BYTES_LIMIT,
    PENDING_ACTIVITIES_LIMIT,
    run_history_bytes,
    run_history_events,
    shards_per_step,
)
from schemas.numbers import RUN_SEED_MAX
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


MAX_PATH_CHARS = 1024
"""A path or a model string in a spec (a scenarios file, a base model), which activity inputs carry."""
MAX_NAME_CHARS = 256
"""An import path, a judge model, a variable name, a module name."""
MAX_URL_CHARS = 2048
MAX_TARGET_MODULES = 64
MAX_MODULE_NAME_CHARS = 128
MAX_TASK_QUEUE_CHARS = 200

Short = Annotated[str, StringConstraints(max_length=MAX_NAME_CHARS)]
ModuleNames = Annotated[
    list[Annotated[str, StringConstraints(max_length=MAX_MODULE_NAME_CHARS)]],
    Field(max_length=MAX_TARGET_MODULES),
]


class _Strict(BaseModel):
    # inf and nan refused in every float (pydantic takes them by default): a number a consumer cannot use
    # fails here, naming its field, not later on a worker (schemas/numbers.py)
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class LoraConfig(_Strict):
    """The LoRA adapter trained on top of the base model."""

    rank: int = Field(16, ge=1, le=1024)
    """LoRA rank r."""
    alpha: float = Field(32.0, gt=0, le=65536)
    """LoRA scaling alpha (the update is scaled by alpha / rank)."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the LoRA input during training."""
    target_modules: ModuleNames | Literal["all-linear"] = "all-linear"
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
    kl_coef: float = Field(0.0, ge=0, le=1000)
    """Weight of the KL penalty to the base policy (adapter disabled); 0 turns it off."""
    max_grad_norm: float = Field(1.0, gt=0, le=1e6)
    """Gradients are clipped to this global norm."""
    micro_batch_size: int = Field(8, ge=1, le=4096)
    """Sequences per forward/backward; halved automatically after an out-of-memory failure."""
    epochs: int = Field(1, ge=1, le=16)
    """Passes over the step's data (each with one optimizer step per pass)."""
    weight_decay: float = Field(0.0, ge=0, le=10)
    """AdamW weight decay on the LoRA parameters."""
    optimizer: Literal["adamw", "paged_adamw_8bit"] = "adamw"
    """``adamw``: torch's AdamW. ``paged_adamw_8bit``: bitsandbytes' 8-bit paged AdamW (ART's), on a CUDA trainer
    where bitsandbytes is installed; elsewhere AdamW with the same hyperparameters, and a warning once."""
    adam_beta1: float = Field(0.9, ge=0, lt=1)
    """Adam's first-moment decay."""
    adam_beta2: float = Field(0.999, ge=0, lt=1)
    """Adam's second-moment decay."""
    adam_epsilon: float = Field(1e-8, gt=0, le=1)
    """Added to Adam's denominator."""
    scale_rewards: bool = True
    """Divide group-centred rewards by the group's std (GRPO); False keeps only the centring (Dr. GRPO)."""
    advantage_eps: float = Field(1e-6, gt=0, le=10)
    """Added to the std before dividing."""
    length_weighting: bool = False
    """Weight each trajectory's tokens so every trajectory counts equally, whatever its length."""
    max_seq_len: int = Field(2048, ge=16, le=1_048_576)
    """Longer sequences are dropped (and counted) rather than truncated."""
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """Trainer precision. ``auto``: bf16 on a CUDA GPU that has it (weights and compute; the LoRA weights stay
    fp32), fp32 elsewhere: on a CPU fp32 keeps the importance ratio exact against fp32 sampling logprobs."""
    seed: int = Field(0, ge=0, le=RUN_SEED_MAX)
    """Seed for anything random in the step."""


MAX_CHAT_TEMPLATE_CHARS = MAX_RUN_TEXT_CHARS
"""A run's own chat template is at most this long (stored once per run: ``schemas/history_bounds.py``)."""
MAX_RUBRIC_CHARS = MAX_RUN_TEXT_CHARS
"""A judge rubric is at most this long (stored once per run, like the chat template)."""


class ModelSpec(_Strict):
    """The model being trained, named as in ART."""

    name: str = Field(pattern=NAME_PATTERN)
    """The trainable model's name; ``model=<name>`` requests are routed to the served adapter, ``<run id>@<step>``."""
    project: str = Field("default", pattern=NAME_PATTERN)
    """Groups runs for metrics (W&B project)."""
    base_model: str = Field(min_length=1, max_length=MAX_PATH_CHARS)
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

    rollout: str = Field(pattern=IMPORT_PATH_PATTERN, max_length=MAX_NAME_CHARS)
    """``module:function``, an ``async def rollout(model, scenario) -> Trajectory`` found on PYTHONPATH."""
    scenarios: Annotated[str, StringConstraints(max_length=MAX_PATH_CHARS)] | list[dict[str, Any]] | ObjectRef
    """``module:function`` returning a list of dicts, a ``.jsonl``/``.parquet`` path, or the list inline. A run
    stores an inline list once (``layout.scenarios_key``) and passes its rollouts activities that object's
    ``ObjectRef``, which a worker reads only at the run's own key, checked against its sha256."""
    max_exceptions: int = Field(0, ge=0, le=100_000_000)
    """Failed rollouts tolerated per step (recorded with their group); one more fails the step."""
    rollout_timeout_s: float = Field(600.0, gt=0, le=7 * 86400)
    """One rollout taking longer than this counts as a failed rollout."""
    rollout_concurrency: int = Field(64, ge=1, le=100_000)
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
    model: Short | None = None
    """Judge model name on ``base_url``; None uses the base model on our own server."""
    base_url: str | None = Field(None, max_length=MAX_URL_CHARS)
    """An OpenAI-compatible endpoint; None uses the inference worker's server."""
    api_key_env: Short | None = None
    """Name of the environment variable holding the judge's API key (never the key itself)."""
    rubric: str | None = Field(None, max_length=MAX_RUBRIC_CHARS)
    """Extra instructions for the judge; None uses the default RULER rubric."""
    max_tokens: int = Field(512, ge=16, le=1_048_576)
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
    keep_adapters: int = Field(3, ge=1, le=10_000)
    """This run's newest adapters kept loaded (leased ones are kept as well); the worker refuses more
    than its ``--max-loras`` minus one."""


class TaskQueues(_Strict):
    """Temporal task queues of the three workers."""

    control: str = Field(DEFAULT_CONTROL_QUEUE, min_length=1, max_length=MAX_TASK_QUEUE_CHARS)
    inference: str = Field(DEFAULT_INFERENCE_QUEUE, min_length=1, max_length=MAX_TASK_QUEUE_CHARS)
    trainer: str = Field(DEFAULT_TRAINER_QUEUE, min_length=1, max_length=MAX_TASK_QUEUE_CHARS)


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


HIGHEST_PRIORITY = 1
LOWEST_PRIORITY = 5
DEFAULT_PRIORITY = 3
"""Temporal's task-queue priority keys: 1 runs first, 5 last; 3 is Temporal's default."""
MAX_FAIRNESS_WEIGHT = 1000.0
"""Temporal clamps a fairness weight to [0.001, 1000]."""
FAIRNESS_KEY_BYTES = 64
"""Temporal's longest fairness key."""


class Scheduling(_Strict):
    """Where a run's activities queue among other runs' on a shared fleet: Temporal's task-queue priority and
    fairness, set on every activity the run schedules (``workflows/stages.py``). None: Temporal's default."""

    priority: int | None = Field(None, ge=HIGHEST_PRIORITY, le=LOWEST_PRIORITY)
    """1 runs first, 5 last; a backlog of a lower priority waits behind any higher one."""
    fairness_key: str | None = Field(None, min_length=1, max_length=FAIRNESS_KEY_BYTES)
    """Runs of one key share one fair share of each queue (the run's owner)."""
    fairness_weight: float | None = Field(None, gt=0, le=MAX_FAIRNESS_WEIGHT)
    """The key's share, relative to the other keys queued (1: an equal share)."""

    @classmethod
    def of_owner(cls, owner: str) -> Scheduling:
        """An equal share for ``owner`` at the default priority (the ART-style client's calls: their project)."""
        return cls(fairness_key=fairness_key(owner))


def fairness_key(owner: str) -> str:
    """``owner`` as a fairness key: itself when it fits Temporal's 64 bytes, else a prefix and its hash."""
    if len(owner.encode()) <= FAIRNESS_KEY_BYTES:
        return owner
    return f"{owner[:47]}~{hashlib.sha256(owner.encode()).hexdigest()[:16]}"


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
    max_staleness: int = Field(1, ge=0, le=1_000_000)
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
    continue_as_new_every: int = Field(5, ge=1, le=1_000_000)
    """Steps per workflow run before continue-as-new keeps history bounded (fewer with many shards per step:
    a run's worst-case history must fit a fifth of Temporal's limits, see ``schemas/history_bounds.py``)."""
    seed: int = Field(0, ge=0, le=RUN_SEED_MAX)
    """Seed for scenario order and sampling."""
    priority: int = Field(DEFAULT_PRIORITY, ge=HIGHEST_PRIORITY, le=LOWEST_PRIORITY)
    """On a shared fleet: 1 runs first, 5 last; a run's queued activities wait behind any run's of a higher
    priority. The workers' operator bounds it (``--highest-priority``); a run above the bound is refused."""
    fairness_weight: float = Field(1.0, gt=0, le=MAX_FAIRNESS_WEIGHT)
    """On a shared fleet, within one priority: the owner's share of each queue relative to other owners' (1: an
    equal share). The operator bounds it (``--max-fairness-weight``); a run above the bound is refused."""
    owner: str | None = Field(None, pattern=NAME_PATTERN)
    """Who the run is for (a team, a user): runs of one owner share one fair share. None: ``model.project``."""

    def scheduling(self) -> Scheduling:
        """The priority and fairness every activity of this run carries."""
        return Scheduling(
            priority=self.priority,
            fairness_key=fairness_key(self.owner or self.model.project),
            fairness_weight=self.fairness_weight,
        )

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

    def texts_bytes(self) -> int:
        """Bytes of JSON the run's own texts (chat template, judge rubric) take where they are carried."""
        texts = [t for t in (self.model.chat_template, self.judge.rubric) if t is not None]
        return sum(len(to_json(t)) for t in texts)

    def carried_bytes(self) -> int:
        """Bytes of JSON of the spec's variable-length strings an activity input may carry (paths, names,
        endpoints, module lists): what an activity's events hold beyond ``EVENT_BYTES``' refs and counts."""
        task, model, judge = self.task, self.model, self.judge
        modules = model.lora.target_modules if isinstance(model.lora.target_modules, list) else []
        strings = [task.rollout, task.scenarios if isinstance(task.scenarios, str) else "", model.base_model,
                   judge.model or "", judge.base_url or "", judge.api_key_env or "", *modules]  # fmt: skip
        return len(to_json(strings))

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
        spec_bytes = len(self.model_dump_json())
        if spec_bytes > MAX_SPEC_BYTES and inline <= MAX_INLINE_SCENARIOS_BYTES:
            return (
                f"the run spec is {spec_bytes:,} bytes of JSON (task.scenarios {inline:,}, model.chat_template "
                f"{len(to_json(self.model.chat_template)):,}, judge.rubric {len(to_json(self.judge.rubric)):,}); "
                f"at most {MAX_SPEC_BYTES:,} keeps it, with the run's state, under Temporal's "
                f"{PAYLOAD_BYTES_LIMIT:,}-byte payload limit: shorten the largest"
            )
        if inline > MAX_INLINE_SCENARIOS_BYTES:
            return (
                f"task.scenarios: the inline list is {inline:,} bytes of JSON, carried in the run's own input "
                f"(the spec); at most {MAX_INLINE_SCENARIOS_BYTES:,} keeps that input below Temporal's "
                f"{PAYLOAD_BYTES_LIMIT:,}-byte payload limit: put the scenarios in a .jsonl or .parquet file, "
                "or return them from a 'module:function'"
            )
        events = run_history_events(shards, self.continue_as_new_every)
        texts, carried = self.texts_bytes(), self.carried_bytes()

        def history_bytes(steps_per_run: int) -> int:
            return run_history_bytes(shards, steps_per_run, inline, spec_bytes, texts, carried)

        size = history_bytes(self.continue_as_new_every)
        if events <= HISTORY_EVENTS_BUDGET and size <= HISTORY_BYTES_BUDGET:
            return None
        fits = [
            n
            for n in range(1, self.continue_as_new_every)
            if run_history_events(shards, n) <= HISTORY_EVENTS_BUDGET
            and history_bytes(n) <= HISTORY_BYTES_BUDGET
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
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise RunSpecError(
            f"{p}: not UTF-8 text (byte {err.object[err.start]:#04x} at offset {err.start}); save it as UTF-8"
        ) from None
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
        for depth, key in enumerate(parents):
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                table = ".".join(parents[: depth + 1])
                raise RunSpecError(
                    f"{p}: --set {dotted}: {table} is {node!r}, not a table of fields; set {table} itself, or "
                    "a field of a table (see `dgrpo schema`)"
                )
        node[leaf] = value
    return parse_run_spec(data, str(p))
