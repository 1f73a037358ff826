"""ART's ``art.utils``: the helpers ART programs and tests import, each in the submodule ART has it in.

- ``iterate_dataset``: a training loop's batches (``DatasetBatch``), resumable at a step.
- ``strip_logprobs``: a copy of a nested structure without its ``logprobs``.
- ``trajectory_logging``: trajectory groups to and from ART's Parquet log format.
- ``trajectory_migration``: ART's older JSONL logs read, written and converted to Parquet.
- ``sft``: SFT chats from JSONL files, learning-rate schedules, a dataset cut into ``train_sft`` calls.
- ``litellm``: a litellm ``Choices`` as the openai ``Choice`` a trajectory holds.
- ``benchmarking``: ``model.log``'s trajectory files as one polars table (``load_trajectories``).
- ``retry`` (from ``dgrpo.retries``).
"""

from __future__ import annotations

from dgrpo.retries import retry
from dgrpo.utils.iterate_dataset import DatasetBatch, epoch_order, iterate_dataset

__all__ = ["DatasetBatch", "epoch_order", "iterate_dataset", "retry"]
