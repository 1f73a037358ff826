"""``dgrpo.local.backend``: where ``from art.local(.backend) import LocalBackend`` points, with ART 0.5's
``backend.train`` and ``backend.train_sft`` (dgrpo/client/training.py) on top of the embedded stack's backend
(dgrpo/local/stack.py), and ART's automatic ``train`` numbers of a local run (``time/step_wall_s``, and
``costs/gpu`` for the GPU the local workers use).

with LocalBackend(gpu_cost_per_hour_usd=2.5) as backend:   # or ``async with``
    await model.register(backend)
    result = await backend.train(model, groups, learning_rate=1e-5)
    await model.log(groups, metrics=result.metrics, step=result.step, split="train")
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

from dgrpo.client.s3_backup import ArtS3Backup
from dgrpo.client.training import ArtTraining
from dgrpo.local import stack
from dgrpo.types import LocalTrainResult

GPU_HOURLY_PRICES_USD = {"H200": 3.0}
"""The GPUs whose price is known without ``gpu_cost_per_hour_usd`` (ART's table): a name in the device's."""


def __getattr__(name: str) -> ModuleType:
    # ``torch`` imported on first use (as ART's module has it), so importing this one stays light.
    if name == "torch":
        return importlib.import_module("torch")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class LocalBackend(ArtTraining, ArtS3Backup, stack.LocalBackend):
    """``dgrpo.LocalBackend`` with ART's ``train(model, groups, ...)``, a plain ``with`` block and ART's
    ``gpu_cost_per_hour_usd``."""

    def __init__(
        self,
        path: str | Path = "./.dgrpo",
        in_process: bool = False,
        *,
        gpu_cost_per_hour_usd: float | None = None,
        **options: Any,
    ) -> None:
        super().__init__(path, in_process, **options)
        self.gpu_cost_per_hour_usd = None if gpu_cost_per_hour_usd is None else float(gpu_cost_per_hour_usd)

    def __enter__(self) -> LocalBackend:
        return self  # started by the first ``register``

    def __exit__(self, *exc: object) -> None:
        self.close_sync()

    def supports_automatic_train_step_metrics(self) -> bool:
        """ART's: each ``train`` row at a new step gets ``time/step_wall_s`` (and ``costs/gpu``)."""
        return True

    def automatic_gpu_cost_per_hour_usd(self, model: Any) -> float | None:
        """What the model's training costs an hour: the price of a GPU times the GPUs it uses, the
        ``_internal_config``'s ``trainer_gpu_ids`` and ``inference_gpu_ids`` when given (ART's count), else
        the one GPU the local workers train and serve on (none on a machine without CUDA: no cost)."""
        per_gpu = self.gpu_cost_per_hour_usd
        if per_gpu is None:
            per_gpu = detected_gpu_price()
        if per_gpu is None:
            return None
        internal = getattr(model, "_internal_config", None) or {}
        ids = {*internal.get("trainer_gpu_ids", ()), *internal.get("inference_gpu_ids", ())}
        gpus = len(ids) if ids else int(cuda_available())
        return per_gpu * gpus if gpus else None


def cuda_available() -> bool:
    try:
        return bool(importlib.import_module("torch").cuda.is_available())
    except ImportError:  # a client without the cpu extra: its workers run elsewhere
        return False


def detected_gpu_price() -> float | None:
    """The hourly price of this machine's GPUs from ``GPU_HOURLY_PRICES_USD``; None when there is none, when
    one is not in the table, or when they differ (no guess, as ART)."""
    if not cuda_available():
        return None
    cuda = importlib.import_module("torch").cuda
    prices = set()
    for index in range(cuda.device_count()):
        device = cuda.get_device_name(index).upper()
        price = next((p for name, p in GPU_HOURLY_PRICES_USD.items() if name in device), None)
        if price is None:
            return None
        prices.add(price)
    return prices.pop() if len(prices) == 1 else None


__all__ = ["LocalBackend", "LocalTrainResult"]
