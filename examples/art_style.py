"""ART's client tutorial, on durable-grpo: your own loop, with every ``model.train`` a durable workflow.

    python examples/art_style.py --steps 3                      # embedded stack + workers on this machine
    python examples/art_style.py --steps 3 --backend temporal \\
        --address temporal.example:7233 --inference-url http://gpu-box:8000/v1   # workers elsewhere

Rerunning continues from ``await model.get_step()``: a step that finished is never trained again, and
a step whose client died mid-``train`` is finished by the workers and picked up by the next run.
The task is examples/arithmetic.py (single-digit addition; reward for a bare, close answer).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
from typing import Any

from rich.console import Console

import dgrpo
from examples.arithmetic import rollout, scenarios
from schemas.run_state import TrainStepResult

console = Console()


def step_scenarios(step: int, n: int, seed: int = 0) -> list[dict[str, Any]]:
    """The ``n`` scenarios of ``step``: a seeded shuffle of all of them, walked in order across steps."""
    pool = scenarios()
    random.Random(seed).shuffle(pool)
    return [pool[(step * n + i) % len(pool)] for i in range(n)]


def make_backend(args: argparse.Namespace) -> dgrpo.Backend:
    if args.backend == "temporal":
        return dgrpo.TemporalBackend(
            address=args.address,
            namespace=args.namespace,
            tls=args.tls,
            api_key=args.api_key,
            inference_url=args.inference_url,
        )
    return dgrpo.LocalBackend(path=args.path)


async def main(args: argparse.Namespace) -> int:
    backend = make_backend(args)
    model = dgrpo.TrainableModel(name=args.name, project=args.project, base_model=args.base_model)
    try:
        await model.register(backend)
        start = await model.get_step()
        console.print(f"[bold]{model.name}[/]: step {start}, training to step {args.steps}")
        for step in range(start, args.steps):
            # Trajectories of the same scenario form one group: GRPO compares them with each other.
            train_groups = await dgrpo.gather_trajectory_groups(
                (
                    dgrpo.TrajectoryGroup(rollout(model, scenario) for _ in range(args.group_size))
                    for scenario in step_scenarios(step, args.groups, args.seed)
                ),
                pbar_desc=f"gather step {step}",
                max_exceptions=args.max_exceptions,
            )
            rewards = [t.reward for g in train_groups for t in g.trajectories]
            result = await model.train(
                train_groups, config=dgrpo.TrainConfig(learning_rate=args.learning_rate)
            )
            assert isinstance(result, TrainStepResult)  # what model.train returns on dgrpo's backends
            if not result.trained:  # as in ART >= 0.4.4 the step still advances, the adapter unchanged
                console.print(
                    f"step {result.step}: every group's rewards were equal; nothing trained, skipped"
                )
                continue
            console.print(
                f"step {result.step}: reward {sum(rewards) / max(len(rewards), 1):.3f} over {len(rewards)} "
                f"rollouts, loss {result.loss if result.loss is not None else float('nan'):.4f}, "
                f"served as {result.adapter}{' (already trained)' if result.skipped else ''}"
            )
        console.print(f"done: {model.name} is at step {await model.get_step()}")
    finally:
        await backend.close()
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=3, help="train until the model is at this step")
    p.add_argument("--backend", choices=("local", "temporal"), default="local")
    p.add_argument("--path", default="./.dgrpo", help="LocalBackend: the embedded stack's directory")
    p.add_argument(
        "--address", default=None, help="TemporalBackend: host:port (default $DGRPO_TEMPORAL_ADDRESS)"
    )
    p.add_argument("--namespace", default=None, help="TemporalBackend: namespace")
    p.add_argument("--tls", action="store_true", help="TemporalBackend: connect with TLS")
    p.add_argument("--api-key", default=None, help="TemporalBackend: API key (Temporal Cloud)")
    p.add_argument("--inference-url", default=None, help="TemporalBackend: the inference server's /v1 URL")
    p.add_argument("--name", default="agent-001")
    p.add_argument("--project", default="art-style")
    p.add_argument("--base-model", default="smollm2-135m-instruct")
    p.add_argument("--groups", type=int, default=2, help="scenarios (groups) per step")
    p.add_argument("--group-size", type=int, default=4, help="rollouts per scenario")
    p.add_argument("--learning-rate", type=float, default=2e-4)
    p.add_argument("--max-exceptions", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    raise SystemExit(asyncio.run(main(parse_args())))
