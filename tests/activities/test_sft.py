"""Supervised fine-tuning on the real CPU trainer: only the assistant's tokens are targets, and a few updates
lower the loss on the examples."""

from __future__ import annotations

import pytest

from activities import sft
from activities.trainer import Trainer
from schemas.activities import SftConfig
from schemas.errors import CorruptTrajectoriesError, RunSpecError
from tests.activities.conftest import TRAINED_MODEL

CHATS = [
    [
        {"role": "system", "content": "You answer with one word."},
        {"role": "user", "content": f"What is the secret word number {i}?"},
        {"role": "assistant", "content": "Pineapple"},
    ]
    for i in range(4)
]


def examples() -> list:
    data = "\n".join(sft.example_line(chat, None) for chat in CHATS).encode()
    return sft.parse_examples(data, "test")


def test_only_assistant_tokens_are_targets() -> None:
    trainer = Trainer(TRAINED_MODEL)
    config = SftConfig(learning_rates=[1e-3, 1e-3], batch_size=2)
    stats = sft.SftStats()
    batches = sft.sft_batches(examples(), trainer.tokenizer, config, stats)
    assert [len(seqs) for _, seqs in batches] == [2, 2]
    seq = batches[0][1][0]
    target = trainer.tokenizer.decode([t for t, on in zip(seq.tokens, seq.trainable, strict=True) if on])
    assert target == "Pineapple<|im_end|>"  # the reply and its end of turn: no system, user or template text
    with pytest.raises(RunSpecError, match="1 learning rate"):
        sft.sft_batches(examples(), trainer.tokenizer, SftConfig(learning_rates=[1e-3], batch_size=2), stats)


def test_a_few_updates_lower_the_loss_on_the_examples() -> None:
    trainer = Trainer(TRAINED_MODEL)
    trainer.init_adapter(seed=0)
    chats = examples()
    before, before_first_batch = sft.example_loss(trainer, chats), sft.example_loss(trainer, chats[:2])
    config = SftConfig(learning_rates=[2e-3] * 4, batch_size=2, micro_batch_size=1)
    first = sft.train_examples(trainer, chats, config, 1, micro_batch_size=1)
    assert len(first.losses) == 2 and first.n_examples == 4 and first.n_trainable_tokens > 0
    second = sft.train_examples(trainer, chats, config, 2, micro_batch_size=1)
    after = sft.example_loss(trainer, chats)
    assert first.losses[0] == pytest.approx(
        before_first_batch, rel=1e-4
    )  # reported before the batch's update
    assert second.losses[0] < first.losses[0] and after < before * 0.5, (before, first.losses, after)


def test_only_the_last_assistant_turn_is_the_target_when_asked() -> None:
    chat = [
        {"role": "user", "content": "First word?"},
        {"role": "assistant", "content": "Apple"},
        {"role": "user", "content": "Second word?"},
        {"role": "assistant", "content": "Pineapple"},
    ]
    data = sft.example_line(chat, None).encode()
    trainer = Trainer(TRAINED_MODEL)
    config = SftConfig(learning_rates=[1e-3], batch_size=1, assistant_turns="last")
    [(_, [seq])] = sft.sft_batches(
        sft.parse_examples(data, "test", "last"), trainer.tokenizer, config, sft.SftStats()
    )
    target = trainer.tokenizer.decode([t for t, on in zip(seq.tokens, seq.trainable, strict=True) if on])
    assert target == "Pineapple<|im_end|>"  # the earlier reply is context
    [(_, [both])] = sft.sft_batches(
        sft.parse_examples(data, "test"), trainer.tokenizer, config, sft.SftStats()
    )
    assert sum(both.trainable) > sum(seq.trainable)  # "all": both replies
    with pytest.raises(CorruptTrajectoriesError, match=r"line 1 .*assistant_turns='last'"):
        sft.parse_examples(sft.example_line(chat[:3], None).encode(), "test", "last")
