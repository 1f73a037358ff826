"""The worker operator's settings: where Temporal and the object store are, and what the inference engine is.

These come from a worker's environment and flags, never from workflow inputs: a run (``schemas/config.py``)
states what it needs, and a worker that cannot serve it refuses the run with an error naming the setting.
``dgrpo env`` prints the variables for the embedded stack; production sets them to a real Temporal
cluster and MinIO, and the same workers run unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Literal, cast

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from schemas.errors import EngineSetupError
from schemas.refs import NAME_PATTERN

ENV_TEMPORAL_ADDRESS = "DGRPO_TEMPORAL_ADDRESS"
ENV_TEMPORAL_NAMESPACE = "DGRPO_TEMPORAL_NAMESPACE"
ENV_S3_ENDPOINT = "DGRPO_S3_ENDPOINT"
ENV_S3_ACCESS_KEY = "DGRPO_S3_ACCESS_KEY"
ENV_S3_SECRET_KEY = "DGRPO_S3_SECRET_KEY"
ENV_S3_BUCKET = "DGRPO_S3_BUCKET"
ENV_S3_SECURE = "DGRPO_S3_SECURE"
ENV_HOME = "DGRPO_HOME"
ENV_CACHE = "DGRPO_CACHE"
ENV_INFERENCE_URL = "DGRPO_INFERENCE_URL"
"""The inference server's ``/v1`` URL: for a client (``TemporalBackend``) and the default judge of a control worker."""
ENV_SERVE_PORT = "DGRPO_SERVE_PORT"
"""Port of the server an inference worker starts (default: a free one)."""
ENV_SERVE_HOST = "DGRPO_SERVE_HOST"
"""The address the inference worker's server binds (``dgrpo worker --serve-host``; default ``127.0.0.1``). Any
other (``0.0.0.0``: every interface) lets other hosts reach it: a control worker's judge, an ART client's
``model.openai_client()``; the worker then refuses to start without ``DGRPO_SERVE_API_KEY``."""
ENV_JUDGE_BASE_URLS = "DGRPO_JUDGE_BASE_URLS"
"""Comma-separated judge endpoints a control worker may call besides its own inference server
(``dgrpo worker --judge-base-url``); a run's ``judge.base_url`` must be one of them."""
ENV_JUDGE_KEY_ENVS = "DGRPO_JUDGE_KEY_ENVS"
"""Comma-separated ``URL=NAME`` pairs: a variable a run's ``judge.api_key_env`` may name, and the one judge
endpoint its value is sent to (``--judge-key-env``)."""
ENV_TASK_MODULES = "DGRPO_TASK_MODULES"
"""Comma-separated module prefixes an inference worker imports ``task.rollout`` / ``task.scenarios`` from
(``dgrpo worker --task-module``; default ``examples.``)."""
ENV_ENGINE = "DGRPO_ENGINE"
"""The inference engine a worker starts when ``--engine`` is not given (``cpu`` or ``vllm``; default ``cpu``):
so a program on ``LocalBackend`` (an ART program unchanged) serves with vLLM when it is set to ``vllm``."""
ENGINES = ("cpu", "vllm")
ENV_SERVE_API_KEY = "DGRPO_SERVE_API_KEY"
"""The inference server's API key: our CPU server requires it as a Bearer token (its ``--api-key``
default), and ``ServingClient``, the rollouts and the default judge send it."""
ENV_ART_SERVER_API_KEY = "DGRPO_ART_SERVER_API_KEY"
"""The key ``dgrpo art-server`` requires as a Bearer token on ART's API and its OpenAI endpoint (``--api-key``'s
default); required when it binds beyond loopback."""
ENV_WORKER_GRACE_S = "DGRPO_WORKER_GRACE_S"
"""Seconds a worker's running activities get to finish after SIGTERM (``dgrpo worker --grace-s``)."""
ENV_TEMPORAL_WAIT_S = "DGRPO_TEMPORAL_WAIT_S"
"""Seconds a starting worker keeps trying to reach Temporal (``dgrpo worker --temporal-wait-s``)."""
ENV_WORKER_PYTHON = "DGRPO_WORKER_PYTHON"
"""The Python a client starts ``dgrpo worker`` with (``LocalBackend``, the demo; default: its own): a client in an
environment without the workers' packages (Python 3.12 without torch, as ART >= 0.5.20 programs run) uses the
workers' environment, e.g. ``DGRPO_WORKER_PYTHON=/opt/dgrpo/.venv/bin/python``."""
ENV_STAGE_BOUNDS = "DGRPO_STAGE_BOUNDS"
"""``STAGE=SECONDS,...``: how long a stage of a worker's activities may go without advancing."""
ENV_STORE_OUTAGE_S = "DGRPO_STORE_OUTAGE_S"
"""Seconds each of a worker's object-store requests keeps retrying an unreachable store (default 90)."""
ENV_ADAPTER_ROOT = "DGRPO_ADAPTER_ROOT"
"""The only directory our CPU server loads runtime adapters from (its ``--adapter-root`` default;
else ``$DGRPO_HOME/adapters``, where the reload activity downloads checkpoints)."""
ENV_HIGHEST_PRIORITY = "DGRPO_HIGHEST_PRIORITY"
"""The highest priority (smallest number, 1-5) a run's activities may carry here (``--highest-priority``)."""
ENV_MAX_FAIRNESS_WEIGHT = "DGRPO_MAX_FAIRNESS_WEIGHT"
"""The largest fairness weight a run's activities may carry here (``--max-fairness-weight``)."""
ENV_DEPLOYMENT_NAME = "DGRPO_DEPLOYMENT_NAME"
"""The Temporal Worker Deployment a worker belongs to (``--deployment-name``); unset: an unversioned worker."""
ENV_BUILD_ID = "DGRPO_BUILD_ID"
"""The worker's build id within its deployment (``--build-id``); needed with a deployment name."""
ENV_METRICS_BIND = "DGRPO_METRICS_BIND"
"""``host:port`` of the worker's Prometheus endpoint (``--metrics-bind``); unset: none."""
ENV_MODEL_ROOTS = "DGRPO_MODEL_ROOTS"
"""Comma-separated directories under which a run's ``model.base_model`` may name a local model or adapter
directory, set in the trainer worker's environment (default ``$DGRPO_HOME/models``); ``$DGRPO_CACHE/models``,
where the built-in model is converted, is always one. The trainer reads weights only from under them: a path
elsewhere, or one whose links or ``..`` lead out of them, is refused. An inference worker's own ``--model`` is
its operator's and is not checked."""
ENV_CPU_SHARE_DIR = "DGRPO_CPU_SHARE_DIR"
"""Where CPU servers and trainers on one host mark themselves busy, to split the cores while several work at
once (``host/cpu_share.py``; default a per-user directory under the system's temporary one; ``off``: each
process always uses all its threads)."""


class S3Settings(BaseModel):
    """How to reach the S3-compatible store."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    endpoint: str = Field(min_length=1)
    """``host:port`` (or ``http(s)://host:port``)."""
    access_key: str = Field(min_length=1)
    secret_key: SecretStr
    bucket: str = Field("dgrpo", pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
    secure: bool = False
    """Use TLS."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> S3Settings:
        e = os.environ if env is None else env
        missing = [k for k in (ENV_S3_ENDPOINT, ENV_S3_ACCESS_KEY, ENV_S3_SECRET_KEY) if not e.get(k)]
        if missing:
            raise KeyError(
                f'{", ".join(missing)} not set; run `eval "$(dgrpo env)"` after `dgrpo up`, '
                "or export them for your MinIO/S3"
            )
        return cls(
            endpoint=e[ENV_S3_ENDPOINT],
            access_key=e[ENV_S3_ACCESS_KEY],
            secret_key=SecretStr(e[ENV_S3_SECRET_KEY]),
            bucket=e.get(ENV_S3_BUCKET) or "dgrpo",
            secure=e.get(ENV_S3_SECURE, "").lower() in ("1", "true", "yes"),
        )


class TemporalSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    address: str = "127.0.0.1:7233"
    namespace: str = "default"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TemporalSettings:
        e = os.environ if env is None else env
        return cls(
            address=e.get(ENV_TEMPORAL_ADDRESS) or "127.0.0.1:7233",
            namespace=e.get(ENV_TEMPORAL_NAMESPACE) or "default",
        )


MAX_PARALLEL_SIZE = 512
"""The most devices one engine spans in either dimension: far above any host's GPUs."""


class EngineSettings(BaseModel):
    """The inference engine an inference worker starts (``dgrpo worker inference --engine ...``), or the one
    it fronts with ``--server-url``: the operator's choice, checked against each run by ``check_serving``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: Literal["cpu", "vllm"] = "cpu"
    """``cpu``: our transformers + peft server. ``vllm``: ``vllm serve`` with runtime LoRA loading."""
    max_lora_rank: int = Field(64, ge=1, le=512)
    """The largest LoRA rank the engine loads (vLLM's ``--max-lora-rank``, rounded up to a rank it accepts)."""
    max_loras: int = Field(4, ge=1)
    """Adapters loaded at once on each server, for all runs together (vLLM's ``--max-loras``): a load beyond it
    unloads the least recently used adapter no rollout holds. A run keeps at most ``max_loras - 1`` of its own."""
    sleep_mode: bool = False
    """vLLM ``--enable-sleep-mode``, which a run in ``shared`` mode needs; our CPU server always sleeps."""
    dtype: Literal["auto", "fp32", "bf16"] = "auto"
    """Weights and activations; ``auto`` is fp32 on the CPU server and on vLLM's CPU build (logprobs equal to
    the trainer's) and bf16 on vLLM on a GPU (its FlashAttention kernels take no fp32)."""
    vllm_python: str | None = None
    """The Python of vLLM's runtime environment (``deploy/install.sh --vllm`` builds ``.venv-vllm``); None:
    ``$DGRPO_VLLM_PYTHON``, else the project's ``.venv-vllm``, else the worker's own Python."""
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    """vLLM's share of the GPU's memory; None keeps vLLM's default."""
    tool_call_parser: str | None = Field("hermes", pattern=r"^[A-Za-z0-9_.-]+$")
    """vLLM's ``--tool-call-parser``, with ``--enable-auto-tool-choice``: how the model writes a tool call
    (``hermes``: ``<tool_call>`` JSON, as SmolLM2, Qwen2.5 and Hermes models do; ``llama3_json`` for Llama 3).
    Without it vLLM refuses every request with ``tool_choice: "auto"``, which the openai SDK sends with tools.
    None: no tool calls on vLLM. Our CPU server parses ``<tool_call>`` itself."""
    trust_request_chat_template: bool = False
    """Render a request with the chat template it brings (vLLM's ``--trust-request-chat-template``), which a run
    with a template of its own (``model.chat_template``) needs: the operator trusts run specs with Jinja that
    the engine renders (in transformers' sandbox, each render time-bounded). The trainer worker honours the same
    flag (it renders SFT examples and token-less choices with the run's template). Without it such a run is
    refused by either worker."""
    prefix_cache_mb: int = Field(1024, ge=0)
    """CPU server: keys and values of finished sequences kept for prompts that extend them (multi-turn
    agents, a group's shared prompt); 0 turns prefix caching off (on vLLM too)."""
    probe_timeout_s: float = Field(5.0, gt=0)
    """The worker asks its engine's ``/health`` every second; an answer later than this is a missed probe."""
    unanswered_probes: int = Field(3, ge=1)
    """Missed probes in a row after which a hung engine is killed and started again with its adapters (the
    activities using it fail as retryable); while probes go unanswered, its activities' heartbeats stop."""
    tensor_parallel_size: int = Field(1, ge=1, le=MAX_PARALLEL_SIZE)
    """vLLM's ``--tensor-parallel-size``: each layer's weights split over this many devices of this host (GPUs;
    on vLLM's CPU build, groups of cores), for a model one device cannot hold. The model's attention heads must
    divide by it (vLLM says so at start)."""
    data_parallel_size: int = Field(1, ge=1, le=MAX_PARALLEL_SIZE)
    """vLLM's ``--data-parallel-size``: this many engine replicas behind the one server (each of
    ``tensor_parallel_size`` devices), which vLLM spreads the requests over; adapters load on every replica."""
    distributed_executor_backend: Literal["mp", "ray"] | None = None
    """vLLM's ``--distributed-executor-backend``: ``mp`` (processes on this host) or ``ray`` (a Ray cluster the
    operator runs); None keeps vLLM's choice (``mp`` on one host)."""

    @property
    def can_sleep(self) -> bool:
        return self.engine == "cpu" or self.sleep_mode

    @property
    def parallel_ranks(self) -> int:
        """Devices (or core groups) the engine's server spans: tensor parallel times data parallel."""
        return self.tensor_parallel_size * self.data_parallel_size

    def parallel_flags(self) -> list[str]:
        """The parallelism settings away from their defaults, as ``dgrpo worker`` flags (and vLLM's, the same)."""
        flags = []
        if self.tensor_parallel_size != 1:
            flags += ["--tensor-parallel-size", str(self.tensor_parallel_size)]
        if self.data_parallel_size != 1:
            flags += ["--data-parallel-size", str(self.data_parallel_size)]
        if self.distributed_executor_backend is not None:
            flags += ["--distributed-executor-backend", self.distributed_executor_backend]
        return flags

    def refuse_unservable_parallelism(self, starts_server: bool) -> None:
        """Raise ``EngineSetupError`` naming the flag when parallelism is asked of what cannot give it: our CPU
        engine (one process on this host's cores), or a server this worker does not start (``--server-url``:
        that server's own flags decided its parallelism)."""
        flags = self.parallel_flags()
        if not flags:
            return
        named = " ".join(flags)
        if self.engine != "vllm":
            raise EngineSetupError(
                f"{named}: our CPU engine ({ENV_ENGINE}=cpu / --engine cpu) is one process on this host's cores "
                "and splits no model over devices; tensor and data parallelism are vLLM's: start the worker with "
                "--engine vllm, or drop those flags"
            )
        if not starts_server:
            raise EngineSetupError(
                f"{named} shape the vLLM server this worker starts, and with --server-url it starts none (that "
                "server's own flags decided its parallelism): drop those flags, or let the worker start vLLM"
            )


Stage = Literal["download", "upload", "render", "tokenize", "micro_batch", "load"]
"""The long stages of an activity's work that say when they advance (activities/progress.py)."""
DEFAULT_STAGE_BOUNDS_S: dict[Stage, float] = {
    "download": 300.0,
    "upload": 300.0,
    "render": 30.0,
    "tokenize": 300.0,
    "micro_batch": 1800.0,
    "load": 900.0,
}
"""The longest each stage may go without advancing: a download or an upload without a MiB moved, one chat's
render, tokenizing one trajectory or example, one micro-batch's forward and backward, loading a model or an
adapter. Far above the slowest healthy case on a CPU; an operator whose hardware is slower raises one with
``$DGRPO_STAGE_BOUNDS``."""
MAX_STAGE_BOUND_S = 86400.0


def parse_stage_bounds(text: str) -> dict[Stage, float]:
    """``micro_batch=3600,download=600`` (``$DGRPO_STAGE_BOUNDS``) as {stage: seconds}; other names refused."""
    bounds: dict[Stage, float] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, value = item.partition("=")
        try:
            seconds = float(value) if sep else float("nan")
        except ValueError:
            seconds = float("nan")
        if name.strip() not in DEFAULT_STAGE_BOUNDS_S or not 0 < seconds <= MAX_STAGE_BOUND_S:
            raise ValueError(
                f"{ENV_STAGE_BOUNDS}: {item!r} is not STAGE=SECONDS with a stage among "
                f"{', '.join(DEFAULT_STAGE_BOUNDS_S)} and 0 < SECONDS <= {MAX_STAGE_BOUND_S:g}"
            )
        bounds[cast(Stage, name.strip())] = seconds
    return bounds


class WorkerLifecycle(BaseModel):
    """How a worker starts while Temporal is away and how it stops on SIGTERM (a spot-preemption notice)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    grace_s: float = Field(20.0, ge=0)
    """After SIGTERM the worker polls no more; its running activities get this long to finish, then they are
    failed so Temporal retries them on another worker at once (not after a heartbeat timeout)."""
    temporal_wait_s: float = Field(600.0, ge=0)
    """A worker started before Temporal (or during its restart) keeps trying to connect this long."""
    stage_bounds_s: dict[Stage, float] = Field(default_factory=lambda: dict(DEFAULT_STAGE_BOUNDS_S))
    """How long each stage of an activity may go without advancing; past it the activity's heartbeats stop,
    so Temporal retries it (``$DGRPO_STAGE_BOUNDS``, ``STAGE=SECONDS,...``, over ``DEFAULT_STAGE_BOUNDS_S``)."""
    store_outage_s: float = Field(90.0, ge=0)
    """Each object-store request keeps retrying an unreachable or failing store about this long, so a store
    restart or a short outage costs a wait, not an attempt; past it the activity fails and is retried."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WorkerLifecycle:
        e = os.environ if env is None else env
        given: dict[str, object] = {
            "grace_s": e.get(ENV_WORKER_GRACE_S),
            "temporal_wait_s": e.get(ENV_TEMPORAL_WAIT_S),
            "store_outage_s": e.get(ENV_STORE_OUTAGE_S),
        }
        if e.get(ENV_STAGE_BOUNDS):
            given["stage_bounds_s"] = {**DEFAULT_STAGE_BOUNDS_S, **parse_stage_bounds(e[ENV_STAGE_BOUNDS])}
        return cls.model_validate({name: value for name, value in given.items() if value})


class FleetBounds(BaseModel):
    """How far a run may ask to go ahead of others on this worker's queues: a run (``RunSpec.priority``,
    ``fairness_weight``) beyond them is refused at its first activity here, with an error naming the setting.
    The defaults let a run lower itself, never raise itself above an equal share at the default priority."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    highest_priority: int = Field(3, ge=1, le=5)
    """The smallest priority number (1 runs first) a run's activities may carry."""
    max_fairness_weight: float = Field(1.0, gt=0, le=1000)
    """The largest fairness weight a run's activities may carry. Raise it only on a Temporal cluster with
    fairness on (``matching.enableFairness``): elsewhere weights are ignored, so they are refused."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> FleetBounds:
        e = os.environ if env is None else env
        given = {
            "highest_priority": e.get(ENV_HIGHEST_PRIORITY),
            "max_fairness_weight": e.get(ENV_MAX_FAIRNESS_WEIGHT),
        }
        return cls.model_validate({name: value for name, value in given.items() if value})


class WorkerDeployment(BaseModel):
    """A versioned worker's place in Temporal's Worker Versioning: its deployment and build id. Workers of a new
    build start beside the old; the operator makes the new build current, and the old one drains."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$")
    """The deployment: every worker of one fleet (all roles) shares it."""
    build_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,99}$")
    """This worker's code version (an image tag, a git commit)."""

    @classmethod
    def from_flags(
        cls, name: str | None, build_id: str | None, env: Mapping[str, str] | None = None
    ) -> WorkerDeployment | None:
        """The flags, else ``DGRPO_DEPLOYMENT_NAME`` / ``DGRPO_BUILD_ID``; None (unversioned) when neither is
        set; one without the other is refused."""
        e = os.environ if env is None else env
        name = name or e.get(ENV_DEPLOYMENT_NAME) or None
        build_id = build_id or e.get(ENV_BUILD_ID) or None
        if name is None and build_id is None:
            return None
        if name is None or build_id is None:
            missing = (
                "--deployment-name (or DGRPO_DEPLOYMENT_NAME)"
                if name is None
                else "--build-id (or DGRPO_BUILD_ID)"
            )
            raise EngineSetupError(
                f"a versioned worker needs both a deployment name and a build id: set {missing} too, or "
                "neither for an unversioned worker"
            )
        try:
            return cls(name=name, build_id=build_id)
        except ValueError as err:
            raise EngineSetupError(f"worker deployment {name!r} build {build_id!r}: {err}") from None


Sharding = Literal["fsdp", "replicate"]
"""How a gang holds the model (``GangSettings.shard``)."""


class GangSettings(BaseModel):
    """How a trainer worker trains a step over several devices and hosts (``dgrpo worker trainer --ranks 2``):
    the operator's, never a run's. A run trains the same adapter on any gang (docs/scaling-out.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ranks: int = Field(1, ge=1, le=64)
    """Rank processes this worker starts, one per device. 1 without ``gang``: the trainer runs in the worker
    itself, as it always has."""
    devices: tuple[str, ...] = ()
    """Each rank's device (``cuda:0,cuda:1``), one per rank; empty: ``cuda:<i>`` where CUDA is, else the CPU."""
    shard: Sharding = "fsdp"
    """``fsdp``: FSDP2 shards the frozen base and the LoRA weights over the ranks (each holds about 1/world of
    them); ``replicate``: every rank holds the whole model and only the gradients are summed (plain data
    parallel: no all-gather per layer, for a base that fits each device)."""
    gang: str | None = Field(None, pattern=NAME_PATTERN)
    """Trainer workers started with the same gang name, on any hosts, train each step together: the one that
    takes the step leads, the others that are idle join (rendezvous through the object store)."""
    address: str | None = None
    """Where the other hosts of the gang reach this worker's ranks; default: this host's address on the route
    to the object store."""
    collective_timeout_s: float = Field(20.0, ge=1, le=3600)
    """Every collective and the gang's rendezvous fail after this long without their peers, so a rank lost
    (killed, stopped, cut off) fails the step's attempt instead of hanging it."""

    @model_validator(mode="after")
    def _a_device_per_rank(self) -> GangSettings:
        if self.devices and len(self.devices) != self.ranks:
            raise ValueError(f"{len(self.devices)} devices for {self.ranks} ranks: name one device per rank")
        return self

    @property
    def enabled(self) -> bool:
        """Whether the worker trains through rank processes (several ranks, or a gang over hosts)."""
        return self.ranks > 1 or self.gang is not None


def default_engine(env: Mapping[str, str] | None = None) -> str:
    """``$DGRPO_ENGINE``, else ``cpu``; a value naming no engine is refused (not silently ``cpu``)."""
    e = os.environ if env is None else env
    engine = (e.get(ENV_ENGINE) or "cpu").strip()
    if engine not in ENGINES:
        raise EngineSetupError(f"{ENV_ENGINE}={engine!r} names no engine: use one of {', '.join(ENGINES)}")
    return engine


def env_list(name: str, env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """A comma-separated variable as a tuple of its non-empty, stripped items (unset: empty)."""
    e = os.environ if env is None else env
    return tuple(item.strip() for item in (e.get(name) or "").split(",") if item.strip())


def judge_key_pair(entry: str) -> tuple[str, str]:
    """``URL=NAME`` (``--judge-key-env``, ``$DGRPO_JUDGE_KEY_ENVS``) as (URL, NAME); a bare name is refused."""
    url, sep, name = entry.rpartition("=")
    if not sep or not url.strip() or not name.strip():
        raise ValueError(
            f"judge key {entry!r} names no endpoint: a key goes only to the endpoint it is paired with; "
            f"write URL=NAME (`--judge-key-env https://judge.example/v1=JUDGE_KEY`, or the same in "
            f"{ENV_JUDGE_KEY_ENVS})"
        )
    return url.strip(), name.strip()


def dgrpo_home(env: Mapping[str, str] | None = None) -> str:
    """The embedded stack's state directory (``$DGRPO_HOME``, default ``./.dgrpo``)."""
    e = os.environ if env is None else env
    return os.path.abspath(e.get(ENV_HOME) or ".dgrpo")


def dgrpo_cache(env: Mapping[str, str] | None = None) -> str:
    """Where converted models are cached (``$DGRPO_CACHE``, default ``~/.cache/dgrpo``)."""
    e = os.environ if env is None else env
    return os.path.abspath(e.get(ENV_CACHE) or os.path.expanduser("~/.cache/dgrpo"))


def model_roots(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Where a run's local ``base_model`` may be: ``$DGRPO_MODEL_ROOTS`` (else ``$DGRPO_HOME/models``) and
    ``$DGRPO_CACHE/models``, absolute."""
    given = env_list(ENV_MODEL_ROOTS, env) or (os.path.join(dgrpo_home(env), "models"),)
    roots = [os.path.abspath(os.path.expanduser(root)) for root in given]
    return (*roots, os.path.join(dgrpo_cache(env), "models"))
