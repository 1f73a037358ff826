"""One forward over a batch whose rows bring different numbers of new tokens: each step of the CPU engine.

vLLM runs a step as one forward over every running sequence's next token together with the prompts it admits
(chunked prefill). transformers' forward takes a rectangular batch, so the engine used to prefill each admitted
request in a forward of its own, a full pass over the weights (about 0.1 s for the 25 new tokens of a
conversation's next turn, while every running row waited), then merge its cache into the batch. Here the
running rows' next tokens and the admitted rows' prompts go through the model together: the new tokens laid
end to end, the projections and MLP over all of them at once, attention row by row against the row's own
keys and values in the batch's cache.

The step's tokens are each row's new tokens but its last, row after row, then every row's last token in row
order, whose logits are the step's output. A row's new tokens take the last columns of its cache row: the
engine reserves the columns of all but its last token when the row joins (``Feed.extras``), and the cache
layer's ``update`` appends one column for every row's last token.

Llama-shaped decoders only (``supported``: Llama and SmolLM, Mistral and Qwen2 without sliding windows,
Qwen3): pre-norm layers of rotary attention and a gated MLP, called here module by module, so peft's adapter
layers on the projections run as they do in the model's own forward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from peft.tuners.lora.layer import LoraLayer

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
"""``config.model_type`` values whose decoder layers this forward computes as their own forward does."""


@dataclass(frozen=True)
class Feed:
    """What one step forwards."""

    tokens: torch.Tensor
    """(N,) every row's new tokens but its last, row after row, then each row's last token, in row order."""
    positions: torch.Tensor
    """(N,) each token's position id."""
    extras: list[tuple[int, int, int]]
    """(row, index of its first token in ``tokens``, count) of each row bringing more than one token."""
    mask: torch.Tensor
    """(rows, columns) bool: the cache columns each row attends to once this step's tokens are in."""
    adapters: list[str] | None
    """Each token's adapter name, for a batch that mixes adapters (peft's ``adapter_names``); else None."""

    @classmethod
    def build(
        cls, pending: list[list[int]], starts: list[int], mask: torch.Tensor, adapters: list[str] | None
    ) -> Feed:
        """The feed of rows bringing ``pending`` tokens from positions ``starts`` (``adapters``: per row)."""
        tokens: list[int] = []
        positions: list[int] = []
        extras: list[tuple[int, int, int]] = []
        names: list[str] = []
        for row, (new, start) in enumerate(zip(pending, starts, strict=True)):
            if len(new) > 1:
                extras.append((row, len(tokens), len(new) - 1))
                tokens += new[:-1]
                positions += range(start, start + len(new) - 1)
                names += [adapters[row]] * (len(new) - 1) if adapters else []
        tokens += [new[-1] for new in pending]
        positions += [start + len(new) - 1 for new, start in zip(pending, starts, strict=True)]
        names += adapters or []
        return cls(
            torch.tensor(tokens, dtype=torch.long),
            torch.tensor(positions, dtype=torch.long),
            extras,
            mask,
            names or None,
        )


def unsupported(config: Any) -> str | None:
    """Why this forward cannot run a model of ``config``; None when it can."""
    model_type = getattr(config, "model_type", None)
    if model_type not in MODEL_TYPES:
        return f"model type {model_type!r} is not one of {', '.join(MODEL_TYPES)}"
    if getattr(config, "use_sliding_window", False) or (
        model_type == "mistral" and getattr(config, "sliding_window", None) is not None
    ):
        return "its attention uses a sliding window"
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or []):
        return "some layers use another attention than full attention"
    if getattr(config, "mlp_bias", False):
        return "its MLP projections have biases"
    return None


def forward(
    model: torch.nn.Module,
    layers: list[Any],
    feed: Feed,
    before_layer: Callable[[], None] | None = None,
) -> torch.Tensor:
    """Logits (rows x vocabulary) of each row's last token; writes the step's keys and values into
    ``layers`` (the batch's cache layers, one per decoder layer)."""
    decoder: Any = model.model
    rows = feed.mask.shape[0]
    x = decoder.embed_tokens(feed.tokens)
    cos, sin = decoder.rotary_emb(x[None], feed.positions[None])
    rope = (cos[0], sin[0])
    last_mask = feed.mask[:, None, None, :]
    extra_masks = [_causal_tail(feed.mask[row], count) for row, _, count in feed.extras]
    names = feed.adapters
    for layer, kv in zip(decoder.layers, layers, strict=True):
        if before_layer is not None:
            before_layer()
        h = layer.input_layernorm(x)
        x = x + _attention(layer.self_attn, h, rope, kv, feed, last_mask, extra_masks, names)
        h = layer.post_attention_layernorm(x)
        mlp = layer.mlp
        x = x + _project(
            mlp.down_proj,
            mlp.act_fn(_project(mlp.gate_proj, h, names)) * _project(mlp.up_proj, h, names),
            names,
        )
    last = decoder.norm(x[-rows:])
    return _project(model.lm_head, last, names[-rows:] if names else None)


def _attention(
    attn: Any,
    h: torch.Tensor,
    rope: tuple[torch.Tensor, torch.Tensor],
    kv: Any,
    feed: Feed,
    last_mask: torch.Tensor,
    extra_masks: list[torch.Tensor],
    names: list[str] | None,
) -> torch.Tensor:
    n, dim = h.shape[0], attn.head_dim
    rows = feed.mask.shape[0]
    q = _project(attn.q_proj, h, names).view(n, -1, dim)
    k = _project(attn.k_proj, h, names).view(n, -1, dim)
    v = _project(attn.v_proj, h, names).view(n, -1, dim)
    if attn.config.model_type == "qwen3":  # an RMSNorm over each head's dims, before the rotation
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = _rotate(q.transpose(0, 1), *rope), _rotate(k.transpose(0, 1), *rope)  # heads x N x dim
    v = v.transpose(0, 1)
    keys, values = kv.update(k[:, -rows:, None].transpose(0, 1), v[:, -rows:, None].transpose(0, 1))
    columns = keys.shape[2]
    out = h.new_empty((n, q.shape[0] * dim))
    for (row, first, count), mask in zip(feed.extras, extra_masks, strict=True):
        span = slice(first, first + count)
        keys[row, :, columns - 1 - count : columns - 1] = k[:, span]
        values[row, :, columns - 1 - count : columns - 1] = v[:, span]
        o = F.scaled_dot_product_attention(
            q[None, :, span],
            keys[row : row + 1],
            values[row : row + 1],
            attn_mask=mask,
            scale=attn.scaling,
            enable_gqa=True,
        )
        out[span] = o[0].transpose(0, 1).reshape(count, -1)
    # One query per row: its heads grouped by the key/value head they share, so each row's keys are read once.
    kv_heads = keys.shape[1]
    grouped = q[:, -rows:].transpose(0, 1).reshape(rows, kv_heads, -1, dim)
    o = F.scaled_dot_product_attention(grouped, keys, values, attn_mask=last_mask, scale=attn.scaling)
    out[-rows:] = o.reshape(rows, -1)
    return _project(attn.o_proj, out, names)


def _causal_tail(allowed: torch.Tensor, count: int) -> torch.Tensor:
    """(1, 1, count, columns) bool: the row's ``count`` tokens before its last, in the columns just before its
    last column, each attending to the row's columns up to its own."""
    columns = allowed.shape[0]
    own = torch.arange(columns - 1 - count, columns - 1)[:, None] >= torch.arange(columns)[None, :]
    return (own & allowed[None, :])[None, None]


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding of ``x`` (heads x N x dim) by each token's ``cos``/``sin`` (N x dim)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _project(module: Any, x: torch.Tensor, names: list[str] | None) -> torch.Tensor:
    """``module(x)``; with per-token adapter names where the module is one of peft's adapter layers."""
    if names is not None and isinstance(module, LoraLayer):
        adapted: Any = module
        return adapted(x, adapter_names=names)
    result: torch.Tensor = module(x)
    return result
