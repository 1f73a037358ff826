"""Learning test: GRPO with a scripted reward on SmolLM2-135M raises the mean reward within a few steps.

Task: answer in at most three tokens. Reward per completion (<= 16 tokens): 1 when it ends (EOS) within
3 tokens, else (16 - length) / 32 when it ends at all, else 0. Sampling is in-process HF ``generate``
(fp32, temperature 1) with the trained adapter, so the data is on-policy; the step itself is the
production path: advantages -> tokenize (server-style token ids + logprobs) -> Trainer.train_step.
"""

from __future__ import annotations

import logging
import statistics
import time

import pytest

from activities.advantages import compute_step_advantages
from activities.tokenize import build_sequences
from activities.trainer import Trainer
from bench.local_sampling import sample_choices
from schemas.config import LoraConfig, ModelSpec, TrainConfig
from schemas.trajectory import Choice, Trajectory, TrajectoryGroup

log = logging.getLogger(__name__)

SYSTEM = {"role": "system", "content": "Be brief."}
QUESTIONS = ["Capital of France?", "Name a fruit.", "Colour of the sky?", "2 + 3 = ?"]
GROUP_SIZE, MAX_TOKENS = 8, 16


def reward(choice: Choice) -> float:
    ids = choice.token_ids or []
    if choice.finish_reason != "stop":
        return 0.0
    length = len(ids) - 1  # without the EOS
    return 1.0 if length <= 3 else (MAX_TOKENS - length) / 32


LEARNING_RATE = 1e-3
"""Seed 0 on this CPU: mean reward 0.18, 0.39, 0.77, 0.96 over four steps (5e-4: 0.18, 0.22, 0.41, 0.74; 2e-4 took
eight steps to rise from 0.18 to 0.48, its first four falling)."""


def run_grpo(seed: int, steps: int, learning_rate: float = LEARNING_RATE) -> list[float]:
    """Mean reward of each step's samples (sampled before that step's update)."""
    trainer = Trainer(ModelSpec(name="learn", base_model="smollm2-135m-instruct", lora=LoraConfig(rank=16)))
    trainer.init_adapter(seed)
    config = TrainConfig(learning_rate=learning_rate, micro_batch_size=16, seed=seed)
    prompts = [[SYSTEM, {"role": "user", "content": q}] for q in QUESTIONS]
    means = []
    for step in range(1, steps + 1):
        started = time.monotonic()
        choices = sample_choices(
            trainer.model, trainer.tokenizer, prompts, GROUP_SIZE, MAX_TOKENS, seed * 1000 + step
        )
        trajs = [
            Trajectory(messages_and_choices=[*p, c], reward=reward(c))
            for p, c in zip([p for p in prompts for _ in range(GROUP_SIZE)], choices, strict=True)
        ]
        groups = [TrajectoryGroup(trajs[i : i + GROUP_SIZE]) for i in range(0, len(trajs), GROUP_SIZE)]
        means.append(statistics.fmean(t.reward for t in trajs))
        sampled = time.monotonic()
        adv = compute_step_advantages(groups, config)
        if adv.groups:
            kept = [t for g in adv.groups for t in g.trajectories]
            seqs = build_sequences(kept, [a for g in adv.advantages for a in g], config.max_seq_len).sequences
            trainer.train_step(seqs, config, step, config.micro_batch_size)
        log.warning(
            "seed %d step %d: mean reward %.3f (sample %.1f s, train %.1f s)",
            seed,
            step,
            means[-1],
            sampled - started,
            time.monotonic() - sampled,
        )
    return means


@pytest.mark.slow
def test_grpo_raises_mean_reward_on_smollm2():
    means = run_grpo(seed=0, steps=4)
    start, end = statistics.fmean(means[:2]), statistics.fmean(means[-2:])
    log.warning(
        "mean reward: first two steps %.3f, last two %.3f, per step %s",
        start,
        end,
        [round(m, 3) for m in means],
    )
    assert end - start > 0.15, means


if __name__ == "__main__":  # python tests/activities/test_learning.py SEED STEPS: effect size per seed
    import sys

    logging.basicConfig(level=logging.WARNING)
    print(run_grpo(int(sys.argv[1]), int(sys.argv[2])))
