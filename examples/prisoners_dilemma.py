"""ART's prisoner's dilemma example (examples/prisoners-dilemma.ipynb in OpenPipe/ART), ported to durable-grpo.

Changed from ART's program: the import (``import dgrpo as art``), the model (SmolLM2-135M on this CPU; the
comparison player is that base model on the same server, by its served name) and the sizes (rounds per
game, games per step, tokens per answer, steps), which are flags here.

    python examples/prisoners_dilemma.py --steps 2 --rounds 2 --games 2

Each game is ``--rounds`` rounds between two players; a round's answer counts as its last "cooperate" or
"defect" (no such word: the move is "none"). Payoffs as in ART: both cooperate 3/3, a defector against a
cooperator 5/0, both defect 1/1, and against "none" the other player's move scores 3 (cooperate) or 5
(defect) and "none" 0. Games differ from step 0, so GRPO has something to compare: partial credit per round,
and (beyond ART) a "none" answer earns up to 0.5 by how close it came to naming a move (``examples/shaping.py``),
so two games a 135M model plays rarely tie. Every game is seeded (``seed=`` on each request), so a run repeats.
"""

from __future__ import annotations

import argparse
import asyncio
import re

import dgrpo as art
from dgrpo.local import LocalBackend
from examples.shaping import closeness

BASE_MODEL = "smollm2-135m-instruct"


def make_prompt(rounds: int) -> str:
    return f"""
You are playing a game of prisoners' dilemma with another player.

You are given a choice between two actions:

1. Cooperate
2. Defect

The payoffs are as follows:

- If both players cooperate, you get 3 points and the other player gets 3 points.
- If one player cooperates and the other defects, the defector gets 5 points and the cooperator gets 0 points.
- If both players defect, you both get 1 point.

You will play this game {rounds} times with the same player.

For your first turn, would you like to cooperate or defect?".
""".strip()


def action(content: str | None) -> str:
    """The answer's last "cooperate" or "defect" (case-insensitive), else "none"."""
    matches = re.findall(r"cooperate|defect", (content or "").lower())
    return matches[-1] if matches else "none"


def format_credit(content: str | None) -> float:
    """Up to 0.5 for an answer that names no move, by how close it came to one (0 when it names one)."""
    if action(content) != "none":
        return 0.0
    return 0.5 * closeness(content or "", ("cooperate", "defect"))


def payoffs(first: str, second: str) -> tuple[int, int]:
    """Points of each player for one round (ART's table, its defaults for a missing move included)."""
    table = {
        ("cooperate", "cooperate"): (3, 3),
        ("cooperate", "defect"): (0, 5),
        ("defect", "cooperate"): (5, 0),
        ("defect", "defect"): (1, 1),
    }
    if (first, second) in table:
        return table[(first, second)]
    default_rewards = {"cooperate": 3, "defect": 5, "none": 0}
    return default_rewards[first], default_rewards[second]


async def rollout_game(
    model: art.TrainableModel, models: tuple[str, str], rounds: int, max_tokens: int, seed: int
) -> tuple[art.Trajectory, art.Trajectory]:
    client = model.openai_client()
    prompt = make_prompt(rounds)
    messages: tuple[art.Messages, art.Messages] = (
        [{"role": "user", "content": prompt}],
        [{"role": "user", "content": prompt}],
    )
    trajectories = (
        art.Trajectory(messages_and_choices=[*messages[0]], reward=0),
        art.Trajectory(messages_and_choices=[*messages[1]], reward=0),
    )
    scores = [0, 0]
    for round_ in range(rounds):
        chat_completions = await asyncio.gather(
            *(
                client.chat.completions.create(
                    messages=messages[i],
                    model=models[i],
                    max_completion_tokens=max_tokens,
                    seed=(seed * rounds + round_) * 2 + i,
                )
                for i in range(2)
            )
        )
        choices = [chat_completion.choices[0] for chat_completion in chat_completions]
        messages[0].append({"role": "assistant", "content": choices[0].message.content})
        messages[1].append({"role": "assistant", "content": choices[1].message.content})
        trajectories[0].messages_and_choices.append(choices[0])
        trajectories[1].messages_and_choices.append(choices[1])
        points = payoffs(action(choices[0].message.content), action(choices[1].message.content))
        for i in range(2):
            scores[i] += points[i]
            trajectories[i].reward += points[i] + format_credit(choices[i].message.content)
        for i in range(2):
            joiner = "\n> "
            messages[i].append(
                {
                    "role": "user",
                    "content": f"The other player responded as follows: \n\n> "
                    f"{joiner.join((choices[1 - i].message.content or '').splitlines())}\n\n"
                    f"Your score is {scores[i]}. The other player's score is {scores[1 - i]}.\n\n"
                    "For the next round, would you like to cooperate or defect?",
                }
            )
            trajectories[i].messages_and_choices.append(messages[i][-1])  # type: ignore[arg-type]  # a dict
    return trajectories


async def main(args: argparse.Namespace) -> int:
    with LocalBackend(path=args.home) as backend:
        model = art.TrainableModel(name=args.name, project="prisoners-dilemma", base_model=BASE_MODEL)
        await model.register(backend)
        base = model.get_inference_name(0)  # the base model, served next to the trained adapters
        for step in range(await model.get_step(), args.steps):
            # Simultaneously rollout self-play games, and games versus the base model.
            self_play_trajectories, base_play_trajectories = await asyncio.gather(
                art.gather_trajectories(
                    (
                        rollout_game(
                            model,
                            (model.name, model.name),
                            args.rounds,
                            args.max_tokens,
                            seed=2 * (step * args.games + g),
                        )
                        for g in range(args.games)
                    ),
                    pbar_desc="versus-self",
                ),
                art.gather_trajectories(
                    (
                        rollout_game(
                            model,
                            (model.name, base),
                            args.rounds,
                            args.max_tokens,
                            seed=2 * (step * args.games + g) + 1,
                        )
                        for g in range(args.games)
                    ),
                    pbar_desc="versus-base",
                ),
            )
            # Log performance versus self and the base model, as well as the base model's performance.
            await model.log([t for ts in self_play_trajectories for t in ts], split="versus-self")
            await model.log([ts[0] for ts in base_play_trajectories], split="versus-base")
            await model.log([ts[1] for ts in base_play_trajectories], split="base-model")
            # Train the model on self-play and base-play trajectories.
            await model.train(
                trajectory_groups=[
                    # Self-play games are symmetric: all their trajectories form one group.
                    art.TrajectoryGroup(t for ts in self_play_trajectories for t in ts),
                    # Only the trained model's side of the base-play games (the base model's is off-policy).
                    art.TrajectoryGroup(ts[0] for ts in base_play_trajectories),
                ],
                config=art.TrainConfig(learning_rate=args.learning_rate),
            )
        print(f"{model.name} is at step {await model.get_step()}")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", default="001")
    p.add_argument("--home", default="./.dgrpo", help="the LocalBackend's directory")
    p.add_argument("--steps", type=int, default=1_000, help="ART: 1000")
    p.add_argument("--rounds", type=int, default=10, help="rounds per game (ART: 10)")
    p.add_argument("--games", type=int, default=8, help="games per kind per step (ART: 8)")
    p.add_argument("--max-tokens", type=int, default=512, help="tokens per answer (ART: 512)")
    p.add_argument("--learning-rate", type=float, default=5e-5, help="ART: 5e-5")
    return p.parse_args(argv)


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main(parse_args())))
