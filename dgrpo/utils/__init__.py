"""ART's ``art.utils``: the helpers ART programs and tests import, each in the submodule ART has it in.

- ``iterate_dataset``: a training loop's batches (``DatasetBatch``), resumable at a step.
- ``retry``, ``limit_concurrency``, ``log_http_errors``: decorators for flaky or rate-limited calls.
- ``format_message``: a chat message as readable text; ``logging``: ART's coloured status lines.
- ``output_dirs``: where a model's local files are (``get_model_dir``); ``get_repo_root_path``.
- ``strip_logprobs``: a copy of a nested structure without its ``logprobs``.
- ``trajectory_logging``: trajectory groups to and from ART's Parquet log format.
- ``trajectory_migration``: ART's older JSONL logs read, written and converted to Parquet.
- ``sft``: SFT chats from JSONL files, learning-rate schedules, a dataset cut into ``train_sft`` calls.
- ``litellm``: a litellm ``Choices`` as the openai ``Choice`` a trajectory holds.
- ``benchmarking``: ``model.log``'s trajectory files as one polars table (``load_trajectories``).
- Refused saying why: ``get_model_step`` and ``record_provenance`` (functions), ``deployment``,
  ``deploy_model``, ``s3``, ``s3_checkpoint_utils`` (modules; dgrpo/art_compat/refusals.py).
"""

from __future__ import annotations

# Each name through its own submodule, as ART's package does: importing ``dgrpo.utils.retry`` later then
# leaves ``dgrpo.utils.retry`` the decorator rather than rebinding it to the module.
from dgrpo.utils.format_message import format_message
from dgrpo.utils.get_model_step import get_model_step
from dgrpo.utils.iterate_dataset import DatasetBatch, epoch_order, iterate_dataset
from dgrpo.utils.limit_concurrency import limit_concurrency
from dgrpo.utils.log_http_errors import log_http_errors
from dgrpo.utils.record_provenance import record_provenance
from dgrpo.utils.retry import retry

__all__ = [
    "DatasetBatch",
    "epoch_order",
    "format_message",
    "get_model_step",
    "iterate_dataset",
    "limit_concurrency",
    "log_http_errors",
    "record_provenance",
    "retry",
]
