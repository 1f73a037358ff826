"""Prompt-sharing sequences trained as packs: the same logprobs, loss and gradient as one row each."""

from __future__ import annotations

import math
import random

import pytest
import torch
from peft.utils import set_peft_model_state_dict
from torch.optim.optimizer import register_optimizer_step_pre_hook

from activities import shared_prefix
from activities.tokenize import TrainSequence
from activities.trainer import Trainer, token_weights
from schemas.config import TrainConfig


def sequences(n_groups: int, group_size: int, seed: int = 0) -> list[TrainSequence]:
    """Groups with prompts of different lengths; continuations of different lengths, one with a token that
    is not trained (a tool result) between trained ones, and one sequence with nothing to train."""
    rng = random.Random(seed)
    out: list[TrainSequence] = []
    for g in range(n_groups):
        prompt = [rng.randrange(100, 40000) for _ in range(5 + 3 * g)]
        for k in range(group_size):
            rest = [rng.randrange(100, 40000) for _ in range(rng.randrange(2, 9))]
            trainable = [False] * len(prompt) + [True] * len(rest)
            if k == 1:
                trainable[len(prompt) + 1] = False
            if g == 0 and k == group_size - 1:
                trainable = [False] * len(trainable)
            tokens = prompt + rest
            lps = [-1.0 - rng.random() if t else math.nan for t in trainable]
            out.append(TrainSequence(tokens, trainable, lps, rng.gauss(0, 1), len(out)))
    rng.shuffle(out)
    return out


def test_plan_puts_each_trained_sequence_in_one_pack_of_its_prompt() -> None:
    seqs = sequences(n_groups=3, group_size=5)
    batches = shared_prefix.plan(seqs, micro_batch_size=4)
    packed = [i for batch in batches for pack in batch for i in pack.members]
    trained = [i for i, s in enumerate(seqs) if any(s.trainable)]
    assert sorted(packed) == trained  # each trained sequence once; the untrained one left out
    for batch in batches:
        assert sum(len(pack.members) for pack in batch) <= 4
        for pack in batch:
            prefixes = {tuple(seqs[i].tokens[: pack.prefix]) for i in pack.members}
            assert len(prefixes) == 1
            assert all(shared_prefix.first_trainable(seqs[i]) == pack.prefix for i in pack.members)
    # Groups of 5 under a budget of 4 are split; 14 sequences need at least 4 micro-batches.
    assert max(len(pack.members) for batch in batches for pack in batch) == 4
    assert len(batches) >= 4


def test_packed_logprobs_equal_each_sequence_forwarded_alone(trainer: Trainer) -> None:
    assert trainer.share_prefixes  # SmolLM2 under transformers' SDPA attention
    seqs = sequences(n_groups=3, group_size=4)
    weights = token_weights(seqs, length_weighting=False)
    alone: list[float] = []
    packed: list[float] = []
    with torch.no_grad():
        for batch in shared_prefix.plan(seqs, micro_batch_size=8):
            built = shared_prefix.build(batch, seqs, weights, pad_id=0)
            packed += trainer.packed_logprobs(built).tolist()
            for pack in batch:
                for i in pack.members:
                    lps = trainer.sequence_logprobs([seqs[i]])[0]  # position t - 1 predicts token t
                    alone += [lps[t - 1] for t in range(1, len(seqs[i].tokens)) if weights[i][t] > 0]
    assert len(packed) == len(alone) == sum(s.n_trainable for s in seqs)
    worst = max(abs(a - b) for a, b in zip(packed, alone, strict=True))
    assert worst < 1e-4, f"packed logprobs differ from unpacked ones by {worst:.2e}"


def gradients(
    trainer: Trainer, seqs: list[TrainSequence], share: bool, config: TrainConfig
) -> tuple[float, dict[str, torch.Tensor]]:
    """The step's loss and the gradient of every LoRA parameter as the optimizer step sees it; the adapter
    is put back as it was afterwards."""
    before = trainer.adapter_state()
    grads: dict[str, torch.Tensor] = {}

    def capture(optimizer: object, args: object, kwargs: object) -> None:
        for name, p in trainer.model.named_parameters():
            if p.requires_grad and p.grad is not None:
                grads[name] = p.grad.detach().clone()

    trainer.share_prefixes, trainer.optimizer = share, None
    hook = register_optimizer_step_pre_hook(capture)
    try:
        stats = trainer.train_step(seqs, config, step=1, micro_batch_size=config.micro_batch_size)
    finally:
        hook.remove()
        trainer.share_prefixes = True
        set_peft_model_state_dict(trainer.model, before)
    return stats.loss, grads


@pytest.mark.parametrize("micro_batch_size", [3, 16])
def test_packed_step_has_the_unpacked_loss_and_gradient(trainer: Trainer, micro_batch_size: int) -> None:
    seqs = sequences(n_groups=3, group_size=4, seed=micro_batch_size)
    config = TrainConfig(micro_batch_size=micro_batch_size, kl_coef=0.05)
    loss_rows, grad_rows = gradients(trainer, seqs, share=False, config=config)
    loss_packs, grad_packs = gradients(trainer, seqs, share=True, config=config)
    assert math.isclose(loss_packs, loss_rows, rel_tol=1e-4, abs_tol=1e-7)
    assert grad_rows.keys() == grad_packs.keys() and grad_rows
    norm = torch.stack([g.norm() for g in grad_rows.values()]).norm()
    diff = torch.stack([(grad_packs[k] - g).norm() for k, g in grad_rows.items()]).norm()
    assert norm > 0
    assert float(diff / norm) < 1e-4, f"packed gradient differs by {float(diff / norm):.2e} (relative)"
