"""``dgrpo worker ROLE`` with its devices' compute simulated and everything else real (bench/pipelined.py).

    python -m bench.simulated_devices --phases FILE worker ROLE [dgrpo worker's flags]

Two functions stand in for the devices: ``activities.rollouts.run_groups`` (the inference device's generation:
it sleeps ``rollout_s`` and returns groups of synthetic token ids, logprobs and rewards) and
``Trainer.train_step`` (the trainer device's forward, backward and optimizer: it sleeps ``train_s`` and moves
every adapter weight and optimizer moment a little, so each step's checkpoint differs and is full size). The
rest is the real worker: the rollouts activity's adapter checks and upload, merge and advantages on the
control queue, the train activity's reads, tokenization and staging, publish to S3, reload into the real CPU
server. ``FILE`` holds ``{"rollout_s": R, "train_s": T}`` and is read at each call, so one set of workers serves
every case of a bench.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

import activities.rollouts as rollouts_module
from activities.tokenize import TrainSequence
from activities.trainer import StepStats, Trainer
from dgrpo.cli import main as dgrpo_main
from schemas.config import TaskSpec, TrainConfig
from schemas.trajectory import Choice, ChoiceLogprobs, TokenLogprob, Trajectory, TrajectoryGroup

PROMPT_TOKENS, COMPLETION_TOKENS = 40, 16
"""The demo's shape: a short chat prompt, 16 new tokens."""


def phases(path: Path) -> dict[str, float]:
    return {k: float(v) for k, v in json.loads(path.read_text()).items()}


def simulate(path: Path) -> None:
    """Replace the two devices' compute in this process (see the module doc)."""

    async def run_groups(
        fn: Any,
        task: TaskSpec,
        models: Sequence[Any],
        picked: Sequence[tuple[int, dict[str, Any]]],
        group_size: int,
        policy_step: int | None = None,
        semaphore: asyncio.Semaphore | None = None,
    ) -> list[TrajectoryGroup]:
        await asyncio.sleep(phases(path)["rollout_s"])
        rng = random.Random(hash((tuple(i for i, _ in picked), policy_step)))
        return [
            TrajectoryGroup(
                [synthetic_trajectory(rng, policy_step) for _ in range(group_size)],
                metadata={"scenario_index": index},
            )
            for index, _ in picked
        ]

    def train_step(
        self: Trainer,
        sequences: list[TrainSequence],
        config: TrainConfig,
        step: int,
        micro_batch_size: int,
        *_: Any,
        **__: Any,
    ) -> StepStats:
        started = time.monotonic()
        if self.optimizer is None:
            self.optimizer = self.new_optimizer(config)
        for param in self.params:
            param.grad = torch.full_like(param, 1e-3)
        self.optimizer.step()  # every moment written: the optimizer state is full size
        self.optimizer.zero_grad(set_to_none=True)
        time.sleep(max(0.0, phases(path)["train_s"] - (time.monotonic() - started)))
        n_trainable = sum(s.n_trainable for s in sequences)
        return StepStats(
            0.5, 0.5, 0.0, 1.0, 1.0, 0.0, len(sequences), n_trainable, n_trainable, micro_batch_size
        )

    rollouts_module.run_groups = run_groups  # type: ignore[assignment]
    Trainer.train_step = train_step  # type: ignore[method-assign]


def synthetic_trajectory(rng: random.Random, policy_step: int | None) -> Trajectory:
    prompt = [rng.randrange(100, 20000) for _ in range(PROMPT_TOKENS)]
    completion = [rng.randrange(100, 20000) for _ in range(COMPLETION_TOKENS)]
    logprobs = ChoiceLogprobs(content=[TokenLogprob(token="x", logprob=-rng.random()) for _ in completion])
    choice = Choice(
        message={"role": "assistant", "content": "x"},  # type: ignore[arg-type]
        token_ids=completion,
        prompt_token_ids=prompt,
        logprobs=logprobs,
        finish_reason="length",
    )
    return Trajectory(messages_and_choices=[choice], reward=rng.random(), policy_step=policy_step)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phases", type=Path, required=True)
    args, rest = parser.parse_known_args()
    simulate(args.phases)
    return dgrpo_main(rest)


if __name__ == "__main__":
    sys.exit(main())
