"""What the in-process ``PipelineTrainer`` loop (dgrpo/pipeline_trainer/in_process.py) reads and writes on a
group: the policy versions and scenario it was sampled with, how far off-policy a batch is, an eval's result
as groups, and a group whose every rollout failed refused."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from schemas.trajectory import Trajectory, TrajectoryGroup


def as_groups(items: Sequence[Trajectory | TrajectoryGroup]) -> list[TrajectoryGroup]:
    """An eval's result as groups: its groups, and its loose trajectories as one more group."""
    loose = [i for i in items if isinstance(i, Trajectory)]
    groups = [i for i in items if isinstance(i, TrajectoryGroup)]
    return [*groups, TrajectoryGroup(loose)] if loose else groups


def label_group(group: TrajectoryGroup, scenario: Any, initial: int, final: int) -> None:
    """The policy versions a group was sampled between (where the rollout left them unset), and its
    scenario's scalar ``metadata`` (``scenario_id`` as it is, other keys as ``scenario_<key>``)."""
    for trajectory in group.trajectories:
        if trajectory.initial_policy_version is None:
            trajectory.initial_policy_version = initial
        if trajectory.final_policy_version is None:
            trajectory.final_policy_version = final
    metadata = scenario.get("metadata") if isinstance(scenario, dict) else None
    for key, value in (metadata if isinstance(metadata, dict) else {}).items():
        if isinstance(key, str) and (value is None or isinstance(value, str | int | float | bool)):
            group.metadata[key if key == "scenario_id" else f"scenario_{key}"] = value


def policy_version_of(group: TrajectoryGroup) -> int | None:
    """The oldest policy a group's trajectories were sampled from (None: unknown)."""
    versions = [t.initial_policy_version for t in group.trajectories if t.initial_policy_version is not None]
    return min(versions, default=None)


def steps_off_policy(batch: list[TrajectoryGroup], step: int) -> float:
    """How many steps behind ``step`` the batch's groups were sampled, on average (0 when unknown)."""
    lags = [step - v for g in batch if (v := policy_version_of(g)) is not None]
    return sum(lags) / len(lags) if lags else 0.0


def refuse_all_failed(group: TrajectoryGroup) -> None:
    """A group whose every rollout raised stops training, as in ART (a broken rollout, not bad luck)."""
    if not group.trajectories and group.exceptions:
        first = group.exceptions[0]
        raise RuntimeError(
            f"all {len(group.exceptions)} rollouts of a group failed; the first: {first.type}: {first.message}"
        )
