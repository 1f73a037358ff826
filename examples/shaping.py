"""Partial credit for a reply that is not yet in the format a task asks for.

A 135M model rarely writes ``<move>left</move>`` at first; ART's examples then score every rollout the
same (-1), and GRPO has nothing to compare. How close a reply came to a well-formed answer differs
between replies, so it ranks them, and pulls the policy toward the format.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closeness(reply: str, answers: Iterable[str]) -> float:
    """0..1: how much of the nearest well-formed answer the reply spells out (difflib's match ratio)."""
    return max(difflib.SequenceMatcher(None, reply.strip(), answer).ratio() for answer in answers)
