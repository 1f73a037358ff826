"""The trainer's device: which one, the precision it trains in, and the memory it has free."""

from __future__ import annotations

import psutil
import torch


def default_device() -> torch.device:
    """The trainer's device unless told otherwise: the GPU when there is one."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_precision(precision: str, device: torch.device) -> str:
    """``auto``: bf16 on a CUDA device with bf16 support, else fp32. A CPU stays fp32, as the CPU engines sample:
    bf16 logprobs differ from an fp32 forward by up to ~0.2 per token, so a step clips tokens that never moved."""
    if precision != "auto":
        return precision
    return "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"


def free_memory_bytes(device: torch.device) -> int:
    """What a step may still allocate on ``device``: CUDA's free memory plus what torch's allocator holds
    unused; on a CPU the memory the system reports available."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    return int(psutil.virtual_memory().available)
