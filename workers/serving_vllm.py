"""The vLLM engine: ``vllm serve`` with runtime LoRA loading, behind the same interface as the CPU engine.

It cannot run on a machine without a GPU; only the command it builds is tested here. Notes for callers:

- Runtime ``/v1/load_lora_adapter`` needs ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` (set below).
- ``/sleep`` and ``/wake_up`` exist only with ``--enable-sleep-mode`` and ``VLLM_SERVER_DEV_MODE=1``
  (``sleep_mode=True``, for the shared one-GPU mode).
- vLLM returns ``token_ids`` / ``prompt_token_ids`` only when a request sends ``return_token_ids: true``
  (``extra_body``), and puts ``prompt_token_ids`` on the response, not on each choice.
- ``--return-tokens-as-token-ids`` makes every logprob's ``token`` read ``token_id:<n>``, so token ids
  are recoverable from the logprobs even on vLLM versions without ``return_token_ids``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from activities.model_bootstrap import resolve_base_model
from workers.serving_engine import ServingEngine

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``--max-lora-rank`` values vLLM accepts."""
VLLM_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "auto": "auto"}


def lora_rank_flag(rank: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM accepts that fits ``rank``."""
    for allowed in VLLM_LORA_RANKS:
        if rank <= allowed:
            return allowed
    raise ValueError(f"LoRA rank {rank} is above vLLM's largest --max-lora-rank ({VLLM_LORA_RANKS[-1]})")


class VllmServingEngine(ServingEngine):
    """``vllm serve BASE --enable-lora`` on ``host:port``."""

    def __init__(
        self,
        model: str,
        *,
        max_lora_rank: int = 16,
        max_loras: int = 4,
        sleep_mode: bool = False,
        tokens_as_ids: bool = True,
        gpu_memory_utilization: float | None = None,
        extra_args: list[str] | None = None,
        **kwargs: object,
    ) -> None:
        super().__init__(model, **kwargs)  # type: ignore[arg-type]
        self.max_lora_rank = max_lora_rank
        self.max_loras = max_loras
        self.sleep_mode = sleep_mode
        self.tokens_as_ids = tokens_as_ids
        self.gpu_memory_utilization = gpu_memory_utilization
        self.extra_args = list(extra_args or [])

    def command(self) -> list[str]:
        resolved = resolve_base_model(self.model)
        served = self.served_name or self.model
        exe = shutil.which("vllm")
        argv = [exe, "serve"] if exe else [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve"]
        argv += [resolved.base_path, "--host", self.host, "--port", str(self.port)]
        if resolved.adapter_path is not None:
            config = json.loads((Path(resolved.adapter_path) / "adapter_config.json").read_text())
            served = self.served_name or str(config["base_model_name_or_path"])
        argv += ["--served-model-name", served, "--dtype", VLLM_DTYPES.get(self.dtype, self.dtype)]
        argv += ["--enable-lora", "--max-lora-rank", str(lora_rank_flag(self.max_lora_rank))]
        argv += ["--max-loras", str(self.max_loras)]
        if resolved.adapter_path is not None:
            start_name = self.start_adapter_name or f"{Path(resolved.adapter_path).name}@0"
            argv += ["--lora-modules", f"{start_name}={resolved.adapter_path}"]
        if self.tokens_as_ids:
            argv.append("--return-tokens-as-token-ids")
        if self.sleep_mode:
            argv.append("--enable-sleep-mode")
        if self.gpu_memory_utilization is not None:
            argv += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        return argv + self.extra_args

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        if self.sleep_mode:
            env["VLLM_SERVER_DEV_MODE"] = "1"
        return env
