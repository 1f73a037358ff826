"""The gang's pieces that need no ranks: how a step's sequences are split, the step-0 adapter made without the
base's weights, and a rank's memory plan."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from activities.gang.initial import initial_adapter
from activities.gang.split import shares
from activities.ranks import OneRank
from activities.tokenize import TrainSequence
from activities.trainer import Trainer
from schemas.config import LoraConfig, ModelSpec


def sequence(length: int, index: int) -> TrainSequence:
    return TrainSequence([1] * length, [False] + [True] * (length - 1), [0.0] * length, 1.0, index)


def test_each_rank_gets_a_contiguous_run_of_about_its_share_of_the_tokens() -> None:
    lengths = [40, 42, 38, 41, 10, 12, 11, 9, 200, 30]
    sequences = [sequence(n, i) for i, n in enumerate(lengths)]
    for world in (1, 2, 3, 4):
        split = shares(sequences, world)
        assert [i for share in split for i in share] == list(range(len(sequences)))  # each once, in order
        tokens = [sum(lengths[i] for i in share) for share in split]
        assert max(tokens) - min(tokens) <= max(lengths), (world, tokens)  # off by at most one sequence
    # fewer sequences than ranks: some ranks train idle micro-batches
    assert shares(sequences[:2], 4).count([]) == 2
    assert shares([], 2) == [[], []]
    with pytest.raises(ValueError):
        shares(sequences, 0)


def test_the_step_0_adapter_is_made_without_weights_for_a_fresh_and_a_warm_start(
    tiny_qwen3: Path, tmp_path: Path
) -> None:
    spec = ModelSpec(name="m", base_model=str(tiny_qwen3), lora=LoraConfig(rank=4, alpha=8))
    trainer = Trainer(spec, "fp32", "cpu")
    trainer.init_adapter(seed=11)
    made = initial_adapter(spec, seed=11)
    assert made.adapter.keys() == trainer.adapter_state().keys() and made.optimizer is None
    for key, tensor in trainer.adapter_state().items():
        assert torch.equal(made.adapter[key], tensor), key
    assert made.adapter_config == trainer.snapshot().adapter_config
    # A warm start: the adapter directory's own weights (an adapter trained a little).
    with torch.no_grad():
        for name, p in trainer.model.named_parameters():
            if "lora_B" in name:
                p.add_(0.01)
    warm = tmp_path / "warm-adapter"
    trainer.model.save_pretrained(str(warm))
    warm_spec = spec.model_copy(update={"base_model": str(warm)})
    warm_trainer = Trainer(warm_spec, "fp32", "cpu")
    warm_trainer.init_adapter(seed=0)
    made = initial_adapter(warm_spec, seed=0)
    for key, tensor in warm_trainer.adapter_state().items():
        assert torch.equal(made.adapter[key], tensor), key
    assert made.adapter_config == warm_trainer.snapshot().adapter_config


def test_ranks_sharing_a_device_plan_with_their_share_of_its_memory(
    tiny_qwen3: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("activities.trainer.free_memory_bytes", lambda device: 8 * 2**30)
    trainer = Trainer(ModelSpec(name="m", base_model=str(tiny_qwen3)), "fp32", "cpu")
    sequences = [sequence(64, 0)]
    alone = trainer.plan_memory(sequences, 4)

    class TwoOnTheCpu(OneRank):
        per_device = 2

    trainer.ranks = TwoOnTheCpu()
    shared = trainer.plan_memory(sequences, 4)
    optimizer = 12 * sum(p.numel() for p in trainer.params)
    assert shared.budget_bytes == pytest.approx((8 * 2**30 // 2 - optimizer) * 0.8, abs=1)
    assert alone.budget_bytes == pytest.approx((8 * 2**30 - optimizer) * 0.8, abs=1)
