"""The trainer's optimizer, as a step's ``TrainConfig`` asks for it (``optimizer``, ``adam_beta1``/``adam_beta2``,
``adam_epsilon``, ``weight_decay``, ``learning_rate``).

``paged_adamw_8bit`` is ART's: bitsandbytes' 8-bit paged AdamW, which needs CUDA. Where it cannot run (a CPU
trainer, or no bitsandbytes installed) the trainer uses torch's AdamW with the same hyperparameters and says so
once per process: the update is AdamW's in full precision, which 8-bit AdamW approximates. A checkpoint's
optimizer state is of the kind that wrote it; a step asking for another kind starts that optimizer afresh.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from typing import Any

import torch

from schemas.config import TrainConfig

log = logging.getLogger(__name__)

ADAMW = "adamw"
PAGED_ADAMW_8BIT = "paged_adamw_8bit"

_warned_fallback = False


def runs_8bit(device: torch.device) -> bool:
    """bitsandbytes' 8-bit paged AdamW can run on ``device``: CUDA, with bitsandbytes importable."""
    return device.type == "cuda" and importlib.util.find_spec("bitsandbytes") is not None


def optimizer_kind(config: TrainConfig, device: torch.device) -> str:
    """The optimizer a step on ``device`` runs for ``config``: ``paged_adamw_8bit`` only where it ``runs_8bit``,
    else ``adamw`` (warned about once when the config asked for 8-bit)."""
    global _warned_fallback
    if config.optimizer != PAGED_ADAMW_8BIT:
        return ADAMW
    if runs_8bit(device):
        return PAGED_ADAMW_8BIT
    if not _warned_fallback:
        _warned_fallback = True
        why = "this trainer has no CUDA device" if device.type != "cuda" else "bitsandbytes is not installed"
        log.warning(
            "TrainConfig.optimizer='paged_adamw_8bit' (ART's default) needs CUDA and bitsandbytes, and %s: "
            "training with torch's AdamW and the same hyperparameters (lr, betas, eps, weight decay) instead",
            why,
        )
    return ADAMW


def new_optimizer(params: list[torch.nn.Parameter], config: TrainConfig, kind: str) -> torch.optim.Optimizer:
    """An optimizer of ``kind`` over ``params`` with ``config``'s hyperparameters."""
    options: dict[str, Any] = {
        "lr": config.learning_rate,
        "betas": (config.adam_beta1, config.adam_beta2),
        "eps": config.adam_epsilon,
        "weight_decay": config.weight_decay,
    }
    if kind == PAGED_ADAMW_8BIT:
        optim: Any = importlib.import_module("bitsandbytes.optim")
        return optim.PagedAdamW8bit(params, **options)  # type: ignore[no-any-return]
    return torch.optim.AdamW(params, **options)


def state_kind(state: dict[str, Any]) -> str:
    """Which optimizer wrote a state dict: AdamW keeps ``exp_avg`` per parameter, bitsandbytes' 8-bit AdamW
    ``state1``; a state with no per-parameter entry yet is AdamW's."""
    entries = list(state.get("state", {}).values())
    return PAGED_ADAMW_8BIT if entries and "state1" in entries[0] else ADAMW


def kind_of(optimizer: torch.optim.Optimizer) -> str:
    return ADAMW if isinstance(optimizer, torch.optim.AdamW) else PAGED_ADAMW_8BIT


def set_hyperparameters(optimizer: torch.optim.Optimizer, config: TrainConfig) -> None:
    """This step's hyperparameters on every parameter group (a step's ``TrainConfig`` may change them)."""
    for group in optimizer.param_groups:
        group["lr"], group["weight_decay"] = config.learning_rate, config.weight_decay
        group["betas"], group["eps"] = (config.adam_beta1, config.adam_beta2), config.adam_epsilon
