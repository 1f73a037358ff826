"""Supervised fine-tuning: chat examples -> sequences masked to the assistant's tokens -> cross-entropy updates.

An example is ``{"messages": [...], "tools": [...]}`` (ART's SFT JSONL line). Its assistant messages are
the targets: each is tokenized as the chat template renders it (``activities/tokenize.py``'s fallback for a
turn without sampled token ids), so only the assistant's tokens, up to and including its end-of-turn token,
are trained; system, user and tool turns are context. Examples are cut into batches of
``SftConfig.batch_size`` in the order given, each batch one optimizer step at its own learning rate, as ART's
``train_sft`` does. The activity itself (staging, OOM retries) is ``TrainerActivities.train_sft``.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from activities import progress as stage_progress
from activities.tokenize import ChatTokenizer, TrainSequence, build_sequences
from activities.trainer import Trainer, check_finite_update
from base_models.resolve import pad_token_id
from schemas.activities import SftConfig
from schemas.config import TrainConfig
from schemas.errors import CorruptTrajectoriesError, RunSpecError
from schemas.trajectory import Choice, Trajectory

Progress = Callable[[int, int, int], None]


@dataclass
class SftStats:
    losses: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    learning_rates: list[float] = field(default_factory=list)
    n_examples: int = 0
    n_dropped_overlength: int = 0
    n_trainable_tokens: int = 0


def example_line(messages: list[Any], tools: list[Any] | None) -> str:
    """One JSONL line of an SFT example (what the client uploads)."""
    return json.dumps({"messages": messages, "tools": tools}, separators=(",", ":"))


def parse_examples(data: bytes, source: str, assistant_turns: str = "all") -> list[Trajectory]:
    """The JSONL's chats as trajectories whose target assistant messages are (token-less) choices: every one,
    or with ``assistant_turns="last"`` only the last message, which must be the assistant's (the earlier
    ones are context)."""
    out = []
    for number, line in enumerate(data.decode().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            messages = record["messages"]
            if assistant_turns == "last" and (not messages or messages[-1].get("role") != "assistant"):
                raise ValueError("assistant_turns='last' needs the last message to be the assistant's")
            targets = range(len(messages)) if assistant_turns == "all" else [len(messages) - 1]
            turns = [
                Choice(message=m, finish_reason="stop")
                if m.get("role") == "assistant" and i in targets
                else m
                for i, m in enumerate(messages)
            ]
            out.append(Trajectory(messages_and_choices=turns, tools=record.get("tools")))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise CorruptTrajectoriesError(f"{source}: line {number} is not an SFT example: {err}") from err
    return out


def sft_batches(
    examples: list[Trajectory], tokenizer: Any, config: SftConfig, stats: SftStats
) -> list[tuple[float, list[TrainSequence]]]:
    """``(learning_rate, sequences)`` of each batch of ``config.batch_size`` examples; a batch whose examples
    were all dropped (over ``max_seq_len``) is left out with its learning rate."""
    tokenized = build_sequences(examples, [1.0] * len(examples), config.max_seq_len, tokenizer)
    stats.n_examples = len(examples)
    stats.n_dropped_overlength = tokenized.n_dropped_overlength
    n_batches = math.ceil(len(examples) / config.batch_size)
    if len(config.learning_rates) < n_batches:
        raise RunSpecError(
            f"{len(config.learning_rates)} learning rate(s) for {n_batches} batches of {config.batch_size} examples"
        )
    batches: list[list[TrainSequence]] = [[] for _ in range(n_batches)]
    for seq in tokenized.sequences:
        batches[seq.trajectory_index // config.batch_size].append(seq)
    return [(config.learning_rates[i], b) for i, b in enumerate(batches) if b]


def padded(trainer: Trainer, seqs: list[TrainSequence]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(ids, attention mask, target mask)``; ``target[:, t]`` marks an assistant token at ``t + 1``."""
    width = max(len(s.tokens) for s in seqs)
    ids = torch.full((len(seqs), width), pad_token_id(trainer.tokenizer), dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    target = torch.zeros((len(seqs), width), dtype=torch.bool)
    for i, s in enumerate(seqs):
        ids[i, : len(s.tokens)] = torch.tensor(s.tokens)
        attn[i, : len(s.tokens)] = 1
        target[i, : len(s.tokens)] = torch.tensor(s.trainable)
    return ids.to(trainer.device), attn.to(trainer.device), target[:, 1:].to(trainer.device)


def sft_update(
    trainer: Trainer,
    sequences: list[TrainSequence],
    learning_rate: float,
    config: SftConfig,
    step: int,
    micro_batch_size: int,
    should_stop: Callable[[], bool] | None = None,
) -> tuple[float, float]:
    """One optimizer step on ``sequences``: mean cross-entropy over their assistant tokens (on a rank of a gang,
    of its share of them, activities/ranks.py). Returns ``(loss before the update, gradient norm)``."""
    if trainer.optimizer is None:
        trainer.optimizer = trainer.new_optimizer(TrainConfig(learning_rate=learning_rate))
    for group in trainer.optimizer.param_groups:
        group["lr"] = learning_rate
    n_tokens = sum(s.n_trainable for s in sequences)
    trainer.model.train()
    trainer.optimizer.zero_grad(set_to_none=True)
    ranks = trainer.ranks
    mine = [sequences[i] for i in ranks.share(sequences)]
    order = sorted(range(len(mine)), key=lambda i: len(mine[i].tokens))  # rows of alike length
    chunks = [[mine[i] for i in order[start : start + micro_batch_size]]
              for start in range(0, len(order), micro_batch_size)]  # fmt: skip
    count = ranks.most(len(chunks))  # every rank runs as many (FSDP's collectives pair up): idle ones weigh 0
    loss_sum = 0.0
    for index in range(count):
        if should_stop is not None and should_stop():
            raise InterruptedError("training cancelled")
        ranks.gradient_sync(index == count - 1)
        ids, attn, target = padded(trainer, chunks[index] if index < len(chunks) else sequences[:1])
        loss = -trainer.target_logprobs(ids, attn, target)[target].sum() / n_tokens
        if index < len(chunks):
            loss.backward()
            loss_sum += float(loss.detach())
        else:
            (loss * 0.0).backward()
        stage_progress.advance()
    ranks.reduce_gradients(trainer.params)
    grad_norm = ranks.clip_grad_norm(trainer.params, config.max_grad_norm)
    (loss_sum,) = ranks.sum([loss_sum])
    check_finite_update(step, loss_sum, grad_norm)
    trainer.optimizer.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    return loss_sum, grad_norm


def train_examples(
    trainer: Trainer,
    examples: list[Trajectory],
    config: SftConfig,
    step: int,
    micro_batch_size: int,
    progress: Progress | None = None,
    should_stop: Callable[[], bool] | None = None,
    tokenizer: ChatTokenizer | None = None,
) -> SftStats:
    """Fine-tune ``trainer``'s adapter on ``examples``, one optimizer step per batch; the chats are rendered
    by ``tokenizer`` (the run's: its own chat template, if any), else by the trainer's."""
    stats = SftStats()
    with stage_progress.stage("tokenize"):
        batches = sft_batches(examples, tokenizer or trainer.tokenizer, config, stats)
    check_batches(batches, len(examples), config, step, stats)
    train_batches(trainer, batches, config, step, micro_batch_size, stats, progress, should_stop)
    return stats


def check_batches(
    batches: list[tuple[float, list[TrainSequence]]],
    n_examples: int,
    config: SftConfig,
    step: int,
    stats: SftStats,
) -> None:
    """Refuse a call with nothing to train on (every example over ``max_seq_len``, or no assistant turn)."""
    if not batches:
        raise RunSpecError(
            f"step {step}: no assistant tokens to train on in {n_examples} example(s) "
            f"({stats.n_dropped_overlength} over max_seq_len={config.max_seq_len})"
        )


def train_batches(
    trainer: Trainer,
    batches: list[tuple[float, list[TrainSequence]]],
    config: SftConfig,
    step: int,
    micro_batch_size: int,
    stats: SftStats,
    progress: Progress | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> None:
    """One update per batch of ``sft_batches``, each batch's loss, gradient norm and learning rate noted in
    ``stats``."""
    torch.manual_seed(config.seed * 1_000_003 + step)  # LoRA dropout, if any
    busy = trainer.cpu_share.busy() if trainer.cpu_share else contextlib.nullcontext()
    with busy, stage_progress.stage("micro_batch"):
        for index, (learning_rate, sequences) in enumerate(batches):
            loss, grad_norm = sft_update(trainer, sequences, learning_rate, config, step, micro_batch_size,
                                         should_stop)  # fmt: skip
            stats.losses.append(loss)
            stats.grad_norms.append(grad_norm)
            stats.learning_rates.append(learning_rate)
            stats.n_trainable_tokens += sum(s.n_trainable for s in sequences)
            if progress is not None:
                progress(index + 1, len(batches), micro_batch_size)


def example_loss(trainer: Trainer, examples: list[Trajectory], max_seq_len: int = 2048) -> float:
    """Mean cross-entropy per assistant token of ``examples`` under the current adapter (no update)."""
    config = SftConfig(learning_rates=[0.0], batch_size=max(len(examples), 1), max_seq_len=max_seq_len)
    (_, sequences), *_ = sft_batches(examples, trainer.tokenizer, config, SftStats())
    ids, attn, target = padded(trainer, sequences)
    trainer.model.eval()
    with torch.no_grad():
        return float(-trainer.target_logprobs(ids, attn, target)[target].mean())
