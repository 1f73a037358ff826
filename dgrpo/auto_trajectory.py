"""ART's ``art.auto_trajectory`` module path: ``auto_trajectory`` and ``capture_auto_trajectory``
(dgrpo/capture/chat_completions.py records a rollout's chat completions)."""

from __future__ import annotations

from dgrpo.capture.chat_completions import auto_trajectory, capture_auto_trajectory

__all__ = ["auto_trajectory", "capture_auto_trajectory"]
