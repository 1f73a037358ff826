"""Random training sequences for timing a trainer: no task, no tokenizer, only shapes."""

from __future__ import annotations

import math
import random

from activities.tokenize import TrainSequence


def random_sequences(n: int, tokens: int, seed: int = 0) -> list[TrainSequence]:
    """``n`` sequences of ``tokens`` random tokens, the last two thirds trained, sampling logprobs unknown (the
    trainer takes its own: ratio 1), advantages random."""
    rng = random.Random(seed)
    prompt = tokens // 3
    return [
        TrainSequence(
            [rng.randrange(100, 40000) for _ in range(tokens)],
            [False] * prompt + [True] * (tokens - prompt),
            [math.nan] * tokens,
            rng.gauss(0, 1),
            i,
        )
        for i in range(n)
    ]
