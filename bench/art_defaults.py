"""An ART-style program's reward per step with ART's training defaults (what ``import dgrpo as art`` now gives a
program that sets nothing: dgrpo/art_compat/defaults.py) against dgrpo's earlier ones, same seeds.

The program is ART's own loop on the demo's task (examples/arithmetic.py: its prompt and reward): each step
gathers ``--groups`` scenarios x ``--group-size`` rollouts through ``model.openai_client()`` (every request with
its own seed, so both sides sample step 1 alike) and calls ``model.train(groups, config=art.TrainConfig(
learning_rate=...))`` on a ``LocalBackend``. The sides differ only in what the program leaves unset:

- ``art``: ART's defaults: CISPO (clip 1.0 / 4.0), LoRA rank 8 / alpha 16, gradients clipped at 0.1, weight
  decay 0.1, Adam beta2 0.99 (8-bit paged AdamW on CUDA, AdamW here), every trajectory weighing equally;
- ``before``: what such a program got before (dgrpo's ``RunSpec`` defaults, which ``dgrpo train`` keeps):
  clipped PPO (0.2), LoRA rank 16 / alpha 32, clip 1.0, no weight decay, beta2 0.999, every token weighing
  equally.

Reported: each side's mean reward per step (of the rollouts that step trains on), averaged over seeds; a PNG of
both curves with ``--png``.

    PYTHONPATH=$PWD python bench/art_defaults.py [--steps 8] [--seeds 0,1,2] [--learning-rate 2e-4] \\
        [--path ./.dgrpo-bench] [--png art_defaults.png]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
from typing import Any

import dgrpo as art
from examples.arithmetic import MAX_TOKENS, prompt, scenarios, score_answer
from schemas.config import LoraConfig

BEFORE: dict[str, Any] = {
    "importance_sampling": "ppo_clip",
    "epsilon": 0.2,
    "epsilon_high": None,
    "max_grad_norm": 1.0,
    "weight_decay": 0.0,
    "optimizer": "adamw",
    "adam_beta2": 0.999,
    "length_weighting": False,
    "max_seq_len": 2048,
}
"""The ``TrainConfig`` fields such a program got before ART's defaults (dgrpo's ``RunSpec`` defaults)."""
BEFORE_LORA = LoraConfig(rank=16, alpha=32.0)
SIDES = ("art", "before")


async def rollout(model: art.TrainableModel, scenario: dict[str, Any], seed: int) -> art.Trajectory:
    trajectory = art.Trajectory(messages_and_choices=prompt(scenario))
    completion = await model.openai_client().chat.completions.create(
        model=model.name,
        messages=trajectory.messages(),  # type: ignore[arg-type]
        max_tokens=MAX_TOKENS,
        temperature=1.0,
        seed=seed,
    )
    choice = completion.choices[0]
    trajectory.messages_and_choices.append(choice)
    trajectory.reward = score_answer(choice.message.content or "", int(scenario["answer"])).reward
    return trajectory


async def side(backend: art.LocalBackend, name: str, seed: int, args: argparse.Namespace) -> list[float]:
    """One side's mean reward per step, for ``seed``."""
    lora = {"lora": BEFORE_LORA} if name == "before" else {}
    model = art.TrainableModel(name=f"{name}-s{seed}-{args.tag}", project="art-defaults", **lora)  # type: ignore[arg-type]
    await model.register(backend)
    pool = scenarios()
    random.Random(seed).shuffle(pool)
    settings = BEFORE if name == "before" else {}
    rewards = []
    for step in range(args.steps):
        picked = [pool[(step * args.groups + g) % len(pool)] for g in range(args.groups)]
        groups = await art.gather_trajectory_groups(
            art.TrajectoryGroup(
                rollout(model, s, seed * 1_000_003 + step * 1_009 + g * 31 + i)
                for i in range(args.group_size)
            )
            for g, s in enumerate(picked)
        )
        rewards.append(statistics.fmean(t.reward for g in groups for t in g))
        print(f"  {name} seed {seed} step {step + 1}: reward {rewards[-1]:.3f}", flush=True)
        config = art.TrainConfig(learning_rate=args.learning_rate, seed=seed, **settings)
        await model.train(groups, config=config)
    return rewards


def plot(curves: dict[str, list[float]], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, values in curves.items():
        ax.plot(range(1, len(values) + 1), values, marker="o", label=name)
    ax.set(xlabel="step", ylabel="mean reward", title=title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


async def main(args: argparse.Namespace) -> None:
    seeds = [int(s) for s in args.seeds.split(",")]
    curves: dict[str, list[list[float]]] = {name: [] for name in SIDES}
    async with art.LocalBackend(path=args.path) as backend:
        for seed in seeds:
            for name in SIDES:
                curves[name].append(await side(backend, name, seed, args))
    means = {
        name: [statistics.fmean(step) for step in zip(*runs, strict=True)] for name, runs in curves.items()
    }
    print(f"\nmean reward per step over seeds {seeds}, learning rate {args.learning_rate}:")
    print("| step | " + " | ".join(SIDES) + " |\n|---|" + "---:|" * len(SIDES))
    for step in range(args.steps):
        print(f"| {step + 1} | " + " | ".join(f"{means[n][step]:.3f}" for n in SIDES) + " |")
    if args.png:
        plot(means, args.png, f"ART-style program, lr {args.learning_rate}, seeds {args.seeds}")
        print(f"wrote {args.png}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--groups", type=int, default=4, help="scenarios (groups) per step")
    p.add_argument("--group-size", type=int, default=8, help="rollouts per scenario")
    p.add_argument("--learning-rate", type=float, default=2e-4, help="the demo's (examples/run.toml)")
    p.add_argument("--path", default="./.dgrpo-bench", help="the LocalBackend's directory")
    p.add_argument("--tag", default="1", help="part of the model names: a new tag trains new runs")
    p.add_argument("--png", default=None, help="write the two curves here")
    return p.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
