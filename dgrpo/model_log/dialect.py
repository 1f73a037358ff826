"""Which ART release's files ``model.log`` writes: 0.5.18's (the default) or 0.5.23's.

The two cannot both be the default: 0.5.23 renamed group metrics (``<split>/group_<m>`` became
``<split>/group/<m>``), dropped ``reward`` from the sections kept unprefixed (a logged ``reward/x`` is
``train/reward/x``), dropped the wall-clock key (``time/wall_clock_sec``; the running wall time is
``time/cum/wall_s``), computes ``throughput/avg_trainer_tok_per_s`` from other inputs, defines its W&B metrics
otherwise, and writes the trajectories Parquet in its version 2. A program shows which release it was written
for: ``TrainableModel(run_name=...)`` is 0.5.23's (that release requires it), and ``DGRPO_ART_VERSION`` says it
for every model of the process (``0.5.23`` or ``0.5.18``; it wins over ``run_name``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from activities.metrics import WANDB_SECTIONS

ENV_ART_VERSION = "DGRPO_ART_VERSION"
"""``0.5.23`` or ``0.5.18``: the ART release whose files every model's ``log`` writes."""


@dataclass(frozen=True)
class LogDialect:
    """What differs between the releases' ``model.log`` files."""

    version: str
    sections: frozenset[str]
    """A ``<section>/...`` number logged under a split keeps its name (``loss/train``)."""
    group_prefix: str
    """``<split>/<group_prefix><metric>``: how a group metric's mean is named."""
    wall_clock: bool
    """Each ``history.jsonl`` row carries ``time/wall_clock_sec`` (seconds since the model was made)."""
    throughputs: tuple[tuple[str, str, str], ...]
    """``(throughput, running tokens, running seconds)`` the metrics builder divides."""
    idle_totals: bool
    """The builder keeps ``throughput/cum/*_idle_s`` running totals."""
    parquet_version: int
    """The trajectories Parquet format (1: 0.5.18's columns; 2: 0.5.23's, with its version in the schema)."""
    wandb_sections: tuple[str, ...]
    """The sections whose ``<section>/*`` its W&B run plots against ``training_step``, in the release's order."""


ART_0_5_18 = LogDialect(
    version="0.5.18",
    sections=frozenset({"reward", "loss", "offpolicy", "pipeline", "throughput", "costs", "time", "data"}),
    group_prefix="group_",
    wall_clock=True,
    throughputs=(
        ("throughput/avg_trainer_tok_per_s", "data/cum/trainer_tokens", "time/cum/trainer_s"),
        ("throughput/avg_actor_tok_per_s", "data/cum/actor_tokens", "time/cum/actor_s"),
    ),
    idle_totals=True,
    parquet_version=1,
    wandb_sections=WANDB_SECTIONS,
)
ART_0_5_23 = LogDialect(
    version="0.5.23",
    sections=frozenset(
        {
            "loss",
            "objective",
            "offpolicy",
            "pipeline",
            "pipeline_settings",
            "queue",
            "sample_efficiency",
            "throughput",
            "costs",
            "discarded",
            "time",
            "data",
            "vllm",
        }
    ),
    group_prefix="group/",
    wall_clock=False,
    throughputs=(
        (
            "throughput/avg_trainer_tok_per_s",
            "data/cum/trainable_assistant_tokens",
            "time/cum/backend_train_s",
        ),
        ("throughput/avg_rollout_tok_per_s", "data/cum/rollout_tokens", "time/cum/rollout_s"),
    ),
    idle_totals=False,
    parquet_version=2,
    wandb_sections=(
        "train",
        "val",
        "test",
        "loss",
        "objective",
        "sample_efficiency",
        "offpolicy",
        "throughput",
        "costs",
        "time",
        "data",
        "discarded",
        "pipeline_settings",
        "vllm",
    ),
)
DIALECTS = {d.version: d for d in (ART_0_5_18, ART_0_5_23)}


def log_dialect(run_name_given: bool) -> LogDialect:
    """The dialect of a model: ``$DGRPO_ART_VERSION``'s when set, else 0.5.23's for a model given a
    ``run_name``, else 0.5.18's."""
    asked = os.environ.get(ENV_ART_VERSION, "").strip()
    if asked:
        if asked not in DIALECTS:
            raise ValueError(f"{ENV_ART_VERSION}={asked!r}: give one of {', '.join(sorted(DIALECTS))}")
        return DIALECTS[asked]
    return ART_0_5_23 if run_name_given else ART_0_5_18
