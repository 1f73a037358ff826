"""The micro-batch and gradient checkpointing a step plans from the model's size and the device's free memory."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from activities.memory_plan import (
    UNCHECKPOINTED_FLOOR,
    USABLE_FRACTION,
    ModelDims,
    model_dims,
    plan_micro_batch,
    sequence_bytes,
    sharding_bytes,
)
from base_models.random_shapes import QWEN3_0_6B, QWEN3_8B, QWEN3_TINY, Shape, qwen3_config

GIB = 2**30
VOCAB = 49152


def dims(shape: Shape) -> ModelDims:
    return model_dims(qwen3_config(shape, VOCAB, 1, 2, 2))


def test_dims_come_from_the_config_with_qwen3s_wide_queries() -> None:
    d = dims(QWEN3_0_6B)
    assert (d.layers, d.hidden, d.intermediate, d.vocab) == (28, 1024, 3072, VOCAB)
    assert (d.q_width, d.kv_width) == (16 * 128, 8 * 128)  # queries twice as wide as the hidden size


def test_a_micro_batch_that_fits_is_kept_without_checkpointing() -> None:
    plan = plan_micro_batch(
        dims(QWEN3_TINY), 8, tokens=512, trained_tokens=400, free_bytes=20 * GIB, element_bytes=4
    )
    assert (plan.micro_batch, plan.gradient_checkpointing) == (8, False)


def test_less_memory_takes_fewer_sequences_before_it_turns_checkpointing_on() -> None:
    d = dims(QWEN3_8B)
    full = sequence_bytes(d, 2048, 1024, 2, checkpointing=False)
    lean = sequence_bytes(d, 2048, 1024, 2, checkpointing=True)
    assert lean < full / 5  # an 8B layer keeps far more than its input
    six = plan_micro_batch(d, 32, 2048, 1024, free_bytes=int(6.5 * full / USABLE_FRACTION), element_bytes=2)
    assert (six.micro_batch, six.gradient_checkpointing) == (6, False)
    scarce = int((UNCHECKPOINTED_FLOOR - 1) * full / USABLE_FRACTION)
    plan = plan_micro_batch(d, 32, 2048, 1024, free_bytes=scarce, element_bytes=2)
    assert plan.gradient_checkpointing and plan.micro_batch == int(scarce * USABLE_FRACTION) // lean > 6
    # A run asking for fewer sequences than the floor keeps them unchecked when they fit.
    assert not plan_micro_batch(d, 2, 2048, 1024, free_bytes=scarce, element_bytes=2).gradient_checkpointing


def test_with_no_room_it_plans_one_sequence_checkpointed_and_leaves_the_rest_to_the_oom_halving() -> None:
    plan = plan_micro_batch(dims(QWEN3_8B), 8, 4096, 4096, free_bytes=GIB // 10, element_bytes=2)
    assert (plan.micro_batch, plan.gradient_checkpointing) == (1, True)
    with pytest.raises(ValueError, match="at least 1"):
        plan_micro_batch(dims(QWEN3_8B), 0, 4096, 4096, free_bytes=GIB, element_bytes=2)


@given(
    requested=st.integers(1, 256),
    tokens=st.integers(1, 8192),
    trained=st.floats(0, 1),
    free=st.integers(0, 200 * GIB),
    more=st.integers(0, 200 * GIB),
    element_bytes=st.sampled_from([2, 4]),
)
def test_a_plan_is_within_bounds_and_more_memory_never_plans_fewer_sequences(
    requested: int, tokens: int, trained: float, free: int, more: int, element_bytes: int
) -> None:
    d = dims(QWEN3_0_6B)
    trained_tokens = int(tokens * trained)
    plan = plan_micro_batch(d, requested, tokens, trained_tokens, free, element_bytes)
    roomier = plan_micro_batch(d, requested, tokens, trained_tokens, free + more, element_bytes)
    assert 1 <= plan.micro_batch <= requested
    assert roomier.micro_batch >= plan.micro_batch or not roomier.gradient_checkpointing
    if not plan.gradient_checkpointing:  # then what it planned fits its budget
        assert plan.micro_batch * plan.sequence_bytes <= plan.budget_bytes


def test_a_rank_of_a_sharded_gang_plans_with_its_share_of_the_optimizer_and_two_gathered_layers() -> None:
    d = dims(QWEN3_8B)
    optimizer = 12 * 40_000_000  # AdamW's state and the gradient of a 40M-weight adapter, all of it
    layer = 2 * (4096 * (32 * 128 + 8 * 128)) + 3 * 4096 * 12288  # q, k, v, o and the MLP of one layer
    assert d.layer_parameters() == layer
    assert sharding_bytes(d, 2, optimizer, world_size=1, sharded=False) == optimizer  # alone: as before
    assert sharding_bytes(d, 2, optimizer, world_size=4, sharded=False) == optimizer  # replicated: all of it
    assert sharding_bytes(d, 2, optimizer, world_size=4, sharded=True) == optimizer // 4 + 2 * layer * 2
    # what the layers gathered take leaves fewer sequences room than an unsharded rank of the same free memory
    free = 3 * GIB
    alone = plan_micro_batch(d, 32, 1024, 512, free - sharding_bytes(d, 2, 0, 1, False), element_bytes=2)
    ranked = plan_micro_batch(d, 32, 1024, 512, free - sharding_bytes(d, 2, 0, 8, True), element_bytes=2)
    assert ranked.micro_batch < alone.micro_batch
