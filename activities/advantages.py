"""GRPO advantages: each trajectory's reward compared with the other rollouts of its scenario.

Per group, ``A_i = (r_i - mean(r)) / (std(r) + eps)`` with the population std (``ddof=0``), or only
``r_i - mean(r)`` when ``TrainConfig.scale_rewards`` is off (Dr. GRPO). A group whose rewards are all
equal carries no learning signal (every advantage is 0): it is dropped and counted. Length weighting
(``TrainConfig.length_weighting``) is applied by the loss, where token counts are known (see grpo_loss).

The pure functions are separate from the activity, which only reads the step's scored trajectories
and writes them back with an ``advantage`` column.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

from temporalio import activity

from schemas import layout
from schemas.activities import AdvantagesInput, AdvantagesResult
from schemas.config import TrainConfig
from schemas.trajectory import TrajectoryGroup

log = logging.getLogger(__name__)

ZERO_VARIANCE_TOL = 1e-12
"""Groups whose reward std is at most this are treated as having equal rewards."""


def group_advantages(rewards: Sequence[float], scale: bool = True, eps: float = 1e-6) -> list[float] | None:
    """Advantages of one group's rewards, or None when the group has no reward variance."""
    n = len(rewards)
    if n < 2:
        return None
    mean = math.fsum(rewards) / n
    std = math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / n)
    if std <= ZERO_VARIANCE_TOL:
        return None
    denom = std + eps if scale else 1.0
    return [(r - mean) / denom for r in rewards]


@dataclass
class StepAdvantages:
    """The step's groups with advantages, zero-variance groups removed."""

    groups: list[TrajectoryGroup]
    """Kept groups (trajectories only; exceptions stay in the step's trajectory file)."""
    advantages: list[list[float]]
    """``advantages[g][i]`` belongs to ``groups[g].trajectories[i]``."""
    n_groups: int
    """Groups in the input."""
    n_groups_zero_variance: int
    """Groups dropped because every reward was equal (or fewer than two trajectories)."""

    @property
    def n_trajectories(self) -> int:
        return sum(len(a) for a in self.advantages)


def compute_step_advantages(groups: Sequence[TrajectoryGroup], config: TrainConfig) -> StepAdvantages:
    """Advantages for every group of a step; pure (no I/O)."""
    kept: list[TrajectoryGroup] = []
    advantages: list[list[float]] = []
    dropped = 0
    for group in groups:
        adv = group_advantages(
            [t.reward for t in group.trajectories], config.scale_rewards, config.advantage_eps
        )
        if adv is None:
            dropped += 1
            continue
        kept.append(group)
        advantages.append(adv)
    if dropped:
        log.info("dropped %d of %d groups with no reward variance", dropped, len(groups))
    return StepAdvantages(kept, advantages, len(groups), dropped)


class AdvantagesActivities:
    """The control queue's advantages activity; constructed by the worker with the object store."""

    def __init__(self, store: object) -> None:
        from activities.trajectory_store import TrajectoryStore

        self.store = store
        self.trajectories = TrajectoryStore(store)  # type: ignore[arg-type]

    @activity.defn(name="compute_advantages")
    async def compute_advantages(self, inp: AdvantagesInput) -> AdvantagesResult:
        """Read the step's scored trajectories, write ``advantages.parquet`` (idempotent: same key)."""
        return await asyncio.to_thread(self._run, inp)

    def _run(self, inp: AdvantagesInput) -> AdvantagesResult:
        groups = self.trajectories.read_groups(inp.trajectories.ref)
        step = compute_step_advantages(groups, inp.train)
        ref = self.trajectories.write_groups(
            layout.advantages_key(inp.run_id, inp.step), step.groups, advantages=step.advantages
        )
        return AdvantagesResult(
            ref=ref,
            n_trajectories=step.n_trajectories,
            n_groups=step.n_groups,
            n_groups_zero_variance=step.n_groups_zero_variance,
        )
