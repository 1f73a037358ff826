"""``dgrpo.rewards`` (ART's ``art.rewards``): RULER, ``ruler_score_group`` and ``ruler``, in ``dgrpo.rewards.ruler``."""

from __future__ import annotations

from dgrpo.rewards.ruler import (
    DEFAULT_RUBRIC,
    JudgeFailed,
    JudgeUnreachable,
    TrajectoryScore,
    ruler,
    ruler_score_group,
)

__all__ = [
    "DEFAULT_RUBRIC",
    "JudgeFailed",
    "JudgeUnreachable",
    "TrajectoryScore",
    "ruler",
    "ruler_score_group",
]
