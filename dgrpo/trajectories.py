"""``dgrpo.trajectories``: where ``from art.trajectories import History, Trajectory, ...`` points."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from schemas.trajectory import ExceptionRecord, History, Trajectory, TrajectoryGroup


def get_messages(messages_and_choices: Iterable[Any]) -> list[dict[str, Any]]:
    """The plain chat messages of a ``messages_and_choices`` list (choices as their assistant message)."""
    return Trajectory(messages_and_choices=list(messages_and_choices)).messages()


PydanticException = ExceptionRecord
"""ART's name for a recorded rollout exception (``type``, ``message``, ``traceback``)."""

__all__ = ["History", "PydanticException", "Trajectory", "TrajectoryGroup", "get_messages"]
