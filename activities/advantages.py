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

import pyarrow as pa
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import trajectory_store
from activities.object_store import ObjectStore
from schemas import layout
from schemas.activities import ActivityName, AdvantagesInput, AdvantagesResult
from schemas.config import TrainConfig
from schemas.errors import BadLogprobError, BadRewardError
from schemas.refs import ObjectRef
from schemas.trajectory import TrajectoryGroup

log = logging.getLogger(__name__)

ZERO_VARIANCE_TOL = 1e-12
"""Groups whose reward std is at most this are treated as having equal rewards."""
MAX_ABS_REWARD = 1e6
"""Larger rewards are refused: they are a reward function's bug, and squared they overflow the std."""


MIN_SAMPLING_LOGPROB = -60.0
"""Lower sampling logprobs are refused. vLLM and our engine return ``log_softmax`` of fp32 logits, and no
sampler draws a token of probability e^-60 (~1e-26); OpenAI's placeholder for "no value" is -9999. Above
this bound the importance ratio ``exp(logprob - sampling_logprob)`` stays finite in fp32 (it overflows past
e^88), so one bad number cannot turn a step's loss into inf."""
MAX_SAMPLING_LOGPROB = 1e-3
"""A log-probability is at most 0; this much above it is rounding."""


def _group_label(group: TrajectoryGroup, g: int) -> str:
    """``group <g>`` and its scenario, as an error names it."""
    scenario = group.metadata.get("scenario_id")
    scenario = group.metadata.get("scenario_index") if scenario is None else scenario
    return f"group {g}" + (f" (scenario {scenario!r})" if scenario is not None else "")


def check_rewards(groups: Sequence[TrajectoryGroup], source: str) -> None:
    """Raise ``BadRewardError`` naming the first trajectory whose reward is NaN, infinite or beyond
    ``MAX_ABS_REWARD`` (group and trajectory are 0-based indices in the step's file)."""
    for g, group in enumerate(groups):
        for i, trajectory in enumerate(group.trajectories):
            reward = trajectory.reward
            if math.isfinite(reward) and abs(reward) <= MAX_ABS_REWARD:
                continue
            raise BadRewardError(
                f"{source}: {_group_label(group, g)}, trajectory {i} has reward {reward!r}; a reward must be a "
                f"finite number with |reward| <= {MAX_ABS_REWARD:g}; fix the function that sets it"
            )


def check_logprobs(groups: Sequence[TrajectoryGroup], source: str) -> None:
    """Raise ``BadLogprobError`` naming the first trajectory with a sampling logprob (of a choice's sampled
    tokens) that is NaN, infinite or outside ``[MIN_SAMPLING_LOGPROB, MAX_SAMPLING_LOGPROB]``."""
    for g, group in enumerate(groups):
        for i, trajectory in enumerate(group.trajectories):
            for c, choice in enumerate(trajectory.choices()):
                for t, logprob in enumerate(choice.sampled_logprobs() or ()):
                    if MIN_SAMPLING_LOGPROB <= logprob <= MAX_SAMPLING_LOGPROB:  # False for NaN
                        continue
                    raise BadLogprobError(
                        f"{source}: {_group_label(group, g)}, trajectory {i}, choice {c}, token {t} has "
                        f"sampling logprob {logprob!r}; a sampled token's logprob must be finite and within "
                        f"[{MIN_SAMPLING_LOGPROB:g}, 0] (-9999 is a server's placeholder, not a value); "
                        "send the logprobs the server returned for the sampled tokens, or none (logprobs=None "
                        "trains that choice with ratio 1)"
                    )


def check_numbers(groups: Sequence[TrajectoryGroup], source: str) -> None:
    """Every reward and sampling logprob of ``groups`` checked before it counts (``check_rewards``,
    ``check_logprobs``)."""
    check_rewards(groups, source)
    check_logprobs(groups, source)


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
    """Advantages for every group of a step; pure (no I/O). A bad reward raises ``BadRewardError``, a bad
    sampling logprob ``BadLogprobError``."""
    check_numbers(groups, "the step's scored trajectories")
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


def read_step_table(store: ObjectStore, ref: ObjectRef) -> pa.Table:
    """The Arrow table behind a trajectories/advantages ref, verified against its recorded sha256."""
    return trajectory_store.read_ref(store, ref)


class AdvantagesActivities:
    """The control queue's advantages activity. ``AdvantagesActivities(store)``: the worker's ObjectStore."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    @activity.defn(name=ActivityName.ADVANTAGES)
    async def compute_advantages(self, inp: AdvantagesInput) -> AdvantagesResult:
        """Read the step's scored trajectories, write ``advantages.parquet`` (idempotent: same key)."""
        return await asyncio.to_thread(self.compute_advantages_sync, inp)

    def compute_advantages_sync(self, inp: AdvantagesInput) -> AdvantagesResult:
        ref = inp.trajectories.ref
        groups = trajectory_store.table_to_groups(read_step_table(self.store, ref), ref.uri)
        try:
            step = compute_step_advantages(groups, inp.train)
        except (BadRewardError, BadLogprobError) as err:
            raise ApplicationError(f"{ref.uri}: {err}", type=err.failure_type, non_retryable=True) from err
        written = trajectory_store.upload_groups(
            self.store,
            step.groups,
            inp.run_id,
            inp.step,
            key=layout.advantages_key(inp.run_id, inp.step),
            advantages=[list(a) for a in step.advantages],
        )
        return AdvantagesResult(
            ref=written.ref,
            n_trajectories=step.n_trajectories,
            n_groups=step.n_groups,
            n_groups_zero_variance=step.n_groups_zero_variance,
        )
