"""ART's ``art.yield_trajectory`` module path: ``yield_trajectory`` and ``capture_yielded_trajectory``
(dgrpo/capture/chat_completions.py)."""

from __future__ import annotations

from dgrpo.capture.chat_completions import capture_yielded_trajectory, yield_trajectory

__all__ = ["capture_yielded_trajectory", "yield_trajectory"]
