"""The group both RULER test files judge: two answers to 2+2, the wrong one rewarded by its rollout."""

from __future__ import annotations

import dgrpo as art


def group() -> art.TrajectoryGroup:
    def trajectory(answer: str, reward: float) -> art.Trajectory:
        messages = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": answer}]
        return art.Trajectory(messages_and_choices=messages, reward=reward)  # type: ignore[arg-type]

    return art.TrajectoryGroup([trajectory("4, correct", 0.0), trajectory("5", 1.0)])
