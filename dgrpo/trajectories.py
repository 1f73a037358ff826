"""``dgrpo.trajectories``: where ``from art.trajectories import ...`` points (ART 0.5.18's names and 0.5.23's).

ART 0.5.23's ``Trajectory`` holds either captured ``exchanges`` or 0.5.18's ``messages_and_choices``;
``LegacyHistory`` is 0.5.18's ``History`` (0.5.23 gave that name to its protocol-native histories, which
dgrpo does not have: ``History`` here stays 0.5.18's class, which 0.5.18 programs build). Importing this
module installs the capture of HTTP calls (dgrpo/capture/transports.py), so ``with art.Trajectory():``
records the calls begun inside it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dgrpo.capture.scopes import current_trajectory, no_capture, trajectory, trajectory_group
from dgrpo.capture.transports import install
from schemas.exchanges import (
    ChatCompletionsExchange,
    CompletionsExchange,
    MessagesExchange,
    ResponsesExchange,
    TrajectoryExchanges,
)
from schemas.trajectory import ExceptionRecord, History, Trajectory, TrajectoryGroup

install()

LegacyHistory = History
"""ART 0.5.23's name for 0.5.18's ``History`` (``messages_and_choices`` and ``tools``)."""

MetadataValue = Any
"""ART 0.5.23's type of a metadata value."""


def get_messages(messages_and_choices: Iterable[Any]) -> list[dict[str, Any]]:
    """The plain chat messages of a ``messages_and_choices`` list (choices as their assistant message)."""
    return Trajectory(messages_and_choices=list(messages_and_choices)).messages()


PydanticException = ExceptionRecord
"""ART's name for a recorded rollout exception (``type``, ``message``, ``traceback``)."""

__all__ = [
    "ChatCompletionsExchange",
    "CompletionsExchange",
    "History",
    "LegacyHistory",
    "MessagesExchange",
    "MetadataValue",
    "PydanticException",
    "ResponsesExchange",
    "Trajectory",
    "TrajectoryExchanges",
    "TrajectoryGroup",
    "current_trajectory",
    "get_messages",
    "no_capture",
    "trajectory",
    "trajectory_group",
]
