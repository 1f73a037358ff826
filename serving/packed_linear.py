"""The CPU engine's projections through oneDNN, each weight packed once into oneDNN's blocked layout.

torch's CPU ``linear`` calls MKL's sgemm, which packs the weight again on every call and, on this AMD CPU,
runs a generic path: with the few rows of a decode step (one token per running row) the projections ran at
about 100 GFLOPS and the 49152-wide LM head at about 60. oneDNN on a weight reordered once runs the same
products 1.4-3.4x faster at up to 32 rows and 1.1-1.3x faster at prefill sizes, still in fp32: results differ
from MKL's by rounding only (about 1e-6 relative), and a row's result does not depend on the other rows of
its batch, so a sequence samples alike whatever it is batched with.

A packed weight belongs to one weight tensor. Swapping the tensor (``FoldedAdapter`` points a base layer at a
folded copy for a forward) finds or makes the pack of the new one; writing a weight in place (never done by
the engine) bumps its version, which drops the pack (a tensor made under ``inference_mode`` has no version). Autograd never goes through a pack: a forward that needs
gradients uses ``F.linear``.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

PACKS_PER_LAYER = 2
"""Weight tensors a layer keeps packed: its own (never dropped) and the newest other (a folded adapter's)."""
ROWS_HINT = 32
"""The row count oneDNN tunes a packed layout for (any row count works with it)."""

Pack = tuple[torch.Tensor, int, torch.Tensor]
"""The weight it was packed from (held, so its memory is never another tensor's), its version, the pack."""


class PackedLinear(torch.nn.Linear):
    """An ``nn.Linear`` that multiplies by its weight packed for oneDNN (see the module doc)."""

    packs: OrderedDict[int, Pack]
    own: int
    """Where the layer's own weight is (its pack is kept while others come and go)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
            return F.linear(x, weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self._pack(weight), self.bias, "none", [], "")

    def _pack(self, weight: torch.Tensor) -> torch.Tensor:
        key = weight.data_ptr()
        found = self.packs.get(key)
        if found is not None:
            source, version, pack = found
            if _version(source) == version and source.shape == weight.shape and source.dtype == weight.dtype:
                self.packs.move_to_end(key)
                return pack
        source = weight.detach()
        pack = torch.ops.mkldnn._reorder_linear_weight(source, ROWS_HINT)
        self.packs[key] = (source, _version(source), pack)
        while len(self.packs) > PACKS_PER_LAYER:
            del self.packs[next(k for k in self.packs if k != self.own)]
        return pack


def _version(tensor: torch.Tensor) -> int:
    """``tensor``'s version counter; -1 for an inference tensor, which has none (folded weights are made
    under ``inference_mode`` and never written)."""
    return -1 if tensor.is_inference() else tensor._version


def pack_linears(model: torch.nn.Module) -> int:
    """Make every plain ``nn.Linear`` of ``model`` (fp32 or bf16) a ``PackedLinear``, in place; how many were
    (none of a dtype where this torch has no oneDNN, or its packed linear fails or disagrees with ``F.linear``
    here: oneDNN's bf16 needs AVX512 (bw, vl, dq) or AVX-NE-CONVERT, which some x86 CPUs lack)."""
    dtypes = {dtype for dtype in (torch.float32, torch.bfloat16) if _works(dtype)}
    count = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear and module.weight.dtype in dtypes:
            module.__class__ = PackedLinear
            assert isinstance(module, PackedLinear)
            module.packs, module.own = OrderedDict(), module.weight.data_ptr()
            count += 1
    dtype = next((p.dtype for p in model.parameters()), None)
    if dtype in (torch.float32, torch.bfloat16) and dtype not in dtypes:
        log.warning(
            "oneDNN's packed linear does not run in %s on this CPU; the engine uses torch's matmuls", dtype
        )
    return count


def _works(dtype: torch.dtype) -> bool:
    """oneDNN's packed linear runs here in ``dtype`` and agrees with ``F.linear`` on a small product."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        generator = torch.Generator().manual_seed(0)
        x, w = torch.randn((3, 16), generator=generator), torch.randn((8, 16), generator=generator)
        x, w = x.to(dtype), w.to(dtype)
        pack = torch.ops.mkldnn._reorder_linear_weight(w, ROWS_HINT)
        y = torch.ops.mkldnn._linear_pointwise(x, pack, None, "none", [], "")
    except (RuntimeError, AttributeError):
        return False
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    return bool(torch.allclose(y.float(), F.linear(x, w).float(), rtol=tolerance, atol=tolerance / 10))
