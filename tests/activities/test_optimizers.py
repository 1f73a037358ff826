"""The trainer's optimizer as a step's ``TrainConfig`` asks for it: ART's 8-bit paged AdamW where it can run (CUDA
and bitsandbytes), else AdamW with the same hyperparameters and one warning; every step's Adam hyperparameters
set on the optimizer it continues with (a loaded checkpoint's included)."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from activities import optimizers
from activities.tokenize import TrainSequence
from activities.trainer import Trainer
from schemas.config import TrainConfig

ART_LIKE = TrainConfig(
    learning_rate=1e-4,
    optimizer="paged_adamw_8bit",
    adam_beta1=0.8,
    adam_beta2=0.99,
    adam_epsilon=1e-6,
    weight_decay=0.1,
)


def sequences(trainer: Trainer) -> list[TrainSequence]:
    out = []
    for index, (text, advantage) in enumerate((("Paris is nice.", 1.0), ("Rome is far.", -1.0))):
        ids = list(trainer.tokenizer(text, add_special_tokens=False)["input_ids"])
        out.append(
            TrainSequence(ids, [False] + [True] * (len(ids) - 1), [math.nan] * len(ids), advantage, index)
        )
    return out


def test_arts_8bit_adamw_on_a_cpu_is_adamw_with_its_hyperparameters_and_one_warning(
    trainer: Trainer, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(optimizers, "_warned_fallback", False)
    assert not optimizers.runs_8bit(torch.device("cpu"))
    with caplog.at_level(logging.WARNING, logger="activities.optimizers"):
        first, second = trainer.new_optimizer(ART_LIKE), trainer.new_optimizer(ART_LIKE)
    assert isinstance(first, torch.optim.AdamW) and isinstance(second, torch.optim.AdamW)
    [group] = first.param_groups
    assert (group["lr"], group["betas"], group["eps"], group["weight_decay"]) == (
        1e-4,
        (0.8, 0.99),
        1e-6,
        0.1,
    )
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "paged_adamw_8bit" in warning.getMessage() and "no CUDA device" in warning.getMessage()
    assert optimizers.optimizer_kind(TrainConfig(), torch.device("cpu")) == optimizers.ADAMW


def test_each_step_sets_its_adam_hyperparameters_on_the_optimizer_it_continues(trainer: Trainer) -> None:
    trainer.init_adapter(seed=0)
    trainer.optimizer = None
    trainer.train_step(sequences(trainer), ART_LIKE, step=1, micro_batch_size=2)
    first = trainer.optimizer
    assert first is not None and optimizers.state_kind(first.state_dict()) == optimizers.ADAMW
    later = ART_LIKE.model_copy(update={"adam_beta2": 0.95, "adam_epsilon": 1e-7, "weight_decay": 0.0})
    trainer.train_step(sequences(trainer), later, step=2, micro_batch_size=2)
    assert trainer.optimizer is first  # the same optimizer (its moments) goes on
    [group] = first.param_groups
    assert (group["betas"], group["eps"], group["weight_decay"]) == ((0.8, 0.95), 1e-7, 0.0)
    eight_bit = {"state": {0: {"state1": torch.zeros(1), "state2": torch.zeros(1)}}, "param_groups": []}
    assert optimizers.state_kind(eight_bit) == optimizers.PAGED_ADAMW_8BIT
