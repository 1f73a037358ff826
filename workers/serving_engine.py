"""Serving engines as processes: our CPU server or ``vllm serve``, started, health-checked and stopped alike.

``make_engine(spec, model, ...)`` picks the implementation from ``ServingSpec.engine``. Both answer the
same HTTP API, so everything after ``start()`` goes through one ``ServingClient``.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from abc import ABC, abstractmethod
from pathlib import Path
from types import TracebackType

import httpx

from schemas.config import ServingSpec
from workers.processes import HOST, free_port, spawn_logged
from workers.serving_client import ServingClient

log = logging.getLogger(__name__)

START_TIMEOUT_S = 300.0


class ServingEngine(ABC):
    """One serving process on ``host:port``; subclasses say which command and environment start it."""

    def __init__(
        self,
        model: str,
        *,
        host: str = HOST,
        port: int | None = None,
        served_name: str | None = None,
        start_adapter_name: str | None = None,
        dtype: str = "fp32",
        log_path: str | Path | None = None,
    ) -> None:
        self.model = model
        self.host = host
        self.port = port or free_port()
        self.served_name = served_name
        self.start_adapter_name = start_adapter_name
        self.dtype = dtype
        self.log_path = Path(log_path or Path(tempfile.gettempdir()) / f"dgrpo-serve-{self.port}.log")
        self.process: subprocess.Popen[bytes] | None = None

    @abstractmethod
    def command(self) -> list[str]:
        """The argv that starts the server."""

    def environment(self) -> dict[str, str]:
        return dict(os.environ)

    @property
    def base_url(self) -> str:
        """``http://host:port`` (the OpenAI SDK wants ``client.openai_base_url``, ending in ``/v1``)."""
        return f"http://{self.host}:{self.port}"

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
        argv = self.command()
        log.info("starting %s (log: %s)", " ".join(argv), self.log_path)
        self.process = spawn_logged(argv, self.log_path, env=self.environment(), tied_to_parent=True)

    def wait_healthy(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Return once ``/health`` answers 200; raise with the log's tail if the process dies first."""
        assert self.process is not None, "spawn() first"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"the server exited with code {self.process.returncode}:\n{tail}")
            try:
                if httpx.get(self.base_url + "/health", timeout=2.0).status_code == 200:
                    log.info("server ready at %s", self.base_url)
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise TimeoutError(
            f"the server at {self.base_url} was not healthy within {timeout_s:.0f}s ({self.log_path})"
        )

    def stop(self, timeout_s: float = 15.0) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def __enter__(self) -> ServingEngine:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # The control calls, the same for every engine.
    async def load_adapter(self, name: str, path: str, sha256: dict[str, str] | None = None) -> bool:
        return await self.client.load_adapter(name, path, sha256)

    async def unload_adapter(self, name: str) -> bool:
        return await self.client.unload_adapter(name)

    async def sleep(self) -> None:
        await self.client.sleep()

    async def wake_up(self) -> None:
        await self.client.wake_up()


class CpuServingEngine(ServingEngine):
    """Our transformers + peft server (``python -m workers.serving_cpu``)."""

    def __init__(
        self, model: str, *, max_batch: int = 32, threads: int | None = None, **kwargs: object
    ) -> None:
        super().__init__(model, **kwargs)  # type: ignore[arg-type]
        self.max_batch = max_batch
        self.threads = threads

    def command(self) -> list[str]:
        argv = [sys.executable, "-m", "workers.serving_cpu", "--model", self.model]
        argv += ["--host", self.host, "--port", str(self.port), "--dtype", self.dtype]
        argv += ["--max-batch", str(self.max_batch)]
        if self.served_name:
            argv += ["--served-name", self.served_name]
        if self.start_adapter_name:
            argv += ["--start-adapter-name", self.start_adapter_name]
        if self.threads:
            argv += ["--threads", str(self.threads)]
        return argv

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parent.parent)  # `-m workers.serving_cpu` from any cwd
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        return env


def make_engine(spec: ServingSpec, model: str, *, lora_rank: int = 16, **kwargs: object) -> ServingEngine:
    """The engine ``spec.engine`` names, serving ``model`` (a ``base_model`` string)."""
    if spec.engine == "vllm":
        from workers.serving_vllm import VllmServingEngine

        return VllmServingEngine(model, max_lora_rank=lora_rank, max_loras=spec.keep_adapters + 1, **kwargs)  # type: ignore[arg-type]
    return CpuServingEngine(model, **kwargs)  # type: ignore[arg-type]
