"""How many sequences a training micro-batch may hold on this device, and whether it needs gradient checkpointing.

A step's activations grow with the model's depth and widths and with the sequences' lengths; on a GPU beside
vLLM, what is free is what the server left. Before a step the trainer estimates, from the model's config, the
bytes one sequence of the step's longest length needs kept for the backward pass, and plans against the
device's free memory:

- the run's ``train.micro_batch_size`` when it fits without checkpointing;
- fewer sequences, still without checkpointing, when at least ``UNCHECKPOINTED_FLOOR`` (or the run's size, if
  smaller) fit: small micro-batches of long sequences keep a GPU busy, and recomputing costs a third more;
- otherwise gradient checkpointing on (each decoder layer keeps only its input and is recomputed in the
  backward pass), and as many sequences as then fit, at least 1.

A rank of a gang (activities/gang/) plans the same way, in its share of the device's free memory, less what
sharding holds beside its activations (``sharding_bytes``: its part of the optimizer state, and under FSDP the
layers gathered whole while they compute).

The estimate is rough on purpose (it counts the tensors a Llama-shaped layer saves, and only
``USABLE_FRACTION`` of the free memory): the out-of-memory halving of activities/training.py stays the net
below it. Pure arithmetic on a model's config and a number of free bytes, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

USABLE_FRACTION = 0.8
"""Of the free memory, what a step's activations may plan to take (allocator fragmentation, estimate error)."""
UNCHECKPOINTED_FLOOR = 4
"""Sequences per micro-batch below which checkpointing (and a larger micro-batch) is preferred."""
LOGIT_BYTES = 14
"""Bytes per vocabulary entry of each trained token: the projection's output (2 or 4), its fp32 copy (4), the
exp of the log-sum-exp (4) and the gradient (4)."""


@dataclass(frozen=True)
class ModelDims:
    """The sizes of a Llama-shaped decoder that its activations grow with."""

    layers: int
    hidden: int
    intermediate: int
    q_width: int
    """Query heads x head size (Qwen3's is larger than ``hidden``)."""
    kv_width: int
    vocab: int

    def saved_per_token(self, checkpointing: bool) -> int:
        """Elements kept per token for the backward pass: per layer its norms' inputs and outputs, q/k/v and
        their normed and rotated copies, attention's output, the MLP's gate, up, activation and product, and
        the residual stream; with checkpointing, each layer's input plus one layer recomputed at a time."""
        layer = 6 * self.hidden + 4 * self.q_width + 4 * self.kv_width + 4 * self.intermediate
        return self.layers * self.hidden + layer if checkpointing else self.layers * layer

    def layer_parameters(self) -> int:
        """Weights of one decoder layer: the attention's four projections and the MLP's three."""
        return 2 * self.hidden * (self.q_width + self.kv_width) + 3 * self.hidden * self.intermediate


def model_dims(config: Any) -> ModelDims:
    """The sizes of ``config``'s decoder that its activations grow with (an HF ``PretrainedConfig``)."""
    # Qwen3 and others state head_dim; Llama-style configs without it use hidden / heads.
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return ModelDims(
        layers=config.num_hidden_layers,
        hidden=config.hidden_size,
        intermediate=config.intermediate_size,
        q_width=config.num_attention_heads * head_dim,
        kv_width=config.num_key_value_heads * head_dim,
        vocab=config.vocab_size,
    )


@dataclass(frozen=True)
class MemoryPlan:
    micro_batch: int
    gradient_checkpointing: bool
    sequence_bytes: int
    """The estimate for one sequence of the step's longest, at this plan's checkpointing."""
    budget_bytes: int
    """``USABLE_FRACTION`` of the free memory the plan was made for."""


def sharding_bytes(
    dims: ModelDims, weight_bytes: int, optimizer_bytes: int, world_size: int, sharded: bool
) -> int:
    """What a rank of a gang needs beyond its activations and what it already holds: its share of the optimizer
    state still to be made (``optimizer_bytes`` for the whole adapter), and under FSDP the layers gathered whole
    while they compute (the layer running and the one fetched ahead, ``weight_bytes`` per weight). Alone (world
    size 1, not sharded): the optimizer state, as before."""
    if not sharded:
        return optimizer_bytes
    return optimizer_bytes // world_size + 2 * dims.layer_parameters() * weight_bytes


def sequence_bytes(
    dims: ModelDims, tokens: int, trained_tokens: int, element_bytes: int, checkpointing: bool
) -> int:
    """Bytes one sequence of ``tokens`` (``trained_tokens`` of them trained) keeps for its backward pass."""
    return (
        tokens * dims.saved_per_token(checkpointing) * element_bytes
        + trained_tokens * dims.vocab * LOGIT_BYTES
    )


def plan_micro_batch(
    dims: ModelDims,
    requested: int,
    tokens: int,
    trained_tokens: int,
    free_bytes: int,
    element_bytes: int,
) -> MemoryPlan:
    """The micro-batch (at most ``requested``) and checkpointing for sequences of up to ``tokens`` tokens
    (``trained_tokens`` trained) on a device with ``free_bytes`` free; activations of ``element_bytes``
    (2 in bf16, 4 in fp32). See the module doc for the rule."""
    if requested < 1 or tokens < 1:
        raise ValueError(f"requested={requested} and tokens={tokens} must be at least 1")
    budget = int(max(free_bytes, 0) * USABLE_FRACTION)
    full = sequence_bytes(dims, tokens, trained_tokens, element_bytes, checkpointing=False)
    fit = budget // full
    if fit >= min(requested, UNCHECKPOINTED_FLOOR):
        return MemoryPlan(min(requested, fit), False, full, budget)
    lean = sequence_bytes(dims, tokens, trained_tokens, element_bytes, checkpointing=True)
    return MemoryPlan(max(1, min(requested, budget // lean)), True, lean, budget)
