"""The worker operator's settings: where Temporal and the object store are, and what the inference engine is.

These come from a worker's environment and flags, never from workflow inputs: a run (``schemas/config.py``)
states what it needs, and a worker that cannot serve it refuses the run with an error naming the setting.
``dgrpo env`` prints the variables for the embedded stack; production sets them to a real Temporal
cluster and MinIO, and the same workers run unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from schemas.errors import EngineSetupError

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
ENV_WORKER_GRACE_S = "DGRPO_WORKER_GRACE_S"
"""Seconds a worker's running activities get to finish after SIGTERM (``dgrpo worker --grace-s``)."""
ENV_TEMPORAL_WAIT_S = "DGRPO_TEMPORAL_WAIT_S"
"""Seconds a starting worker keeps trying to reach Temporal (``dgrpo worker --temporal-wait-s``)."""
ENV_STORE_OUTAGE_S = "DGRPO_STORE_OUTAGE_S"
"""Seconds each of a worker's object-store requests keeps retrying an unreachable store (default 90)."""
ENV_ADAPTER_ROOT = "DGRPO_ADAPTER_ROOT"
"""The only directory our CPU server loads runtime adapters from (its ``--adapter-root`` default;
else ``$DGRPO_HOME/adapters``, where the reload activity downloads checkpoints)."""
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
    the engine renders (in transformers' sandbox). Without it such a run is refused."""
    prefix_cache_mb: int = Field(1024, ge=0)
    """CPU server: keys and values of finished sequences kept for prompts that extend them (multi-turn
    agents, a group's shared prompt); 0 turns prefix caching off (on vLLM too)."""
    probe_timeout_s: float = Field(5.0, gt=0)
    """The worker asks its engine's ``/health`` every second; an answer later than this is a missed probe."""
    unanswered_probes: int = Field(3, ge=1)
    """Missed probes in a row after which a hung engine is killed and started again with its adapters (the
    activities using it fail as retryable); while probes go unanswered, its activities' heartbeats stop."""

    @property
    def can_sleep(self) -> bool:
        return self.engine == "cpu" or self.sleep_mode


class WorkerLifecycle(BaseModel):
    """How a worker starts while Temporal is away and how it stops on SIGTERM (a spot-preemption notice)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    grace_s: float = Field(20.0, ge=0)
    """After SIGTERM the worker polls no more; its running activities get this long to finish, then they are
    failed so Temporal retries them on another worker at once (not after a heartbeat timeout)."""
    temporal_wait_s: float = Field(600.0, ge=0)
    """A worker started before Temporal (or during its restart) keeps trying to connect this long."""
    store_outage_s: float = Field(90.0, ge=0)
    """Each object-store request keeps retrying an unreachable or failing store about this long, so a store
    restart or a short outage costs a wait, not an attempt; past it the activity fails and is retried."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WorkerLifecycle:
        e = os.environ if env is None else env
        given = {
            "grace_s": e.get(ENV_WORKER_GRACE_S),
            "temporal_wait_s": e.get(ENV_TEMPORAL_WAIT_S),
            "store_outage_s": e.get(ENV_STORE_OUTAGE_S),
        }
        return cls.model_validate({name: value for name, value in given.items() if value})


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
