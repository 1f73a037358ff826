"""Typed errors shared by every layer, and the Temporal failure types they map to: the one error contract.

An activity raises a ``DgrpoError`` (or an ``ApplicationError`` with one of the types below); every worker's
``ErrorContract`` interceptor (workers/error_contract.py) turns a ``DgrpoError`` into
``ApplicationError(message, type=err.failure_type, non_retryable=...)``, and the workflows' retry policies
list ``NON_RETRYABLE``: both read ``RETRYABLE``, so a type's retry behaviour is defined once, here.
"""

from __future__ import annotations

# ApplicationError.type values. Non-retryable ones are listed in NON_RETRYABLE.
CONFIG_ERROR = "ConfigError"
"""Bad configuration or input: retrying cannot help; the message says what to fix."""
OUT_OF_MEMORY = "OutOfMemory"
"""The trainer ran out of memory; retried with a smaller micro-batch."""
CORRUPT_CHECKPOINT = "CorruptCheckpoint"
"""A checkpoint's manifest is missing or a file's sha256 does not match."""
STORE_UNAVAILABLE = "StoreUnavailable"
"""The object store could not be reached; retried."""
STORE_AUTH = "StoreAuth"
"""The object store refused the credentials; not retried."""
ROLLOUT_FAILED = "RolloutFailed"
"""More rollouts failed than the task tolerates."""
TASK_IMPORT = "TaskImportError"
"""A rollout or scenarios import path does not import, or names code the worker's operator did not allow."""
CORRUPT_LOCAL_COPY = "CorruptLocalCopy"
"""A worker's downloaded copy of a checkpoint failed verification; the retry downloads it again."""
BAD_REWARD = "BadReward"
"""A reward is NaN, infinite or too large; the message names the group and trajectory."""
BAD_LOGPROB = "BadLogprob"
"""A sampling logprob is NaN, infinite or outside the range a sampler returns; the message names the group
and trajectory."""
NON_FINITE_UPDATE = "NonFiniteUpdate"
"""A step's loss, gradient norm or adapter weights are NaN or infinite: the update is refused, never published."""
ENGINE_RESTARTED = "EngineRestarted"
"""The inference server stopped answering (or died) and was restarted; the work that used it is retried."""
STALLED = "Stalled"
"""A stage of the work did not advance within its bound and the attempt was failed: a chat render that ran on
(stopped), or work on the trainer's compute thread that cannot be stopped (that trainer then leaves for a fresh
process); retried."""
STAGED_STATE_LOST = "StagedStateLost"
"""A trainer no longer holds the unpublished step it was asked to continue from (pipelined mode): the workflow
trains from that step's checkpoint once it is manifested instead."""

GANG_LOST = "GangLost"
"""A rank of the trainer's gang died, stopped answering or was cut off: the gang's attempt failed and its processes
were recycled; the retry trains the step again from its start, with the ranks that remain."""

RETRYABLE: dict[str, bool] = {
    CONFIG_ERROR: False,
    OUT_OF_MEMORY: True,
    CORRUPT_CHECKPOINT: False,
    CORRUPT_LOCAL_COPY: True,
    STORE_UNAVAILABLE: True,
    STORE_AUTH: False,
    ROLLOUT_FAILED: True,
    TASK_IMPORT: False,
    BAD_REWARD: False,
    BAD_LOGPROB: False,
    NON_FINITE_UPDATE: False,
    ENGINE_RESTARTED: True,
    STALLED: True,
    STAGED_STATE_LOST: False,
    GANG_LOST: True,
}
"""Every failure type, and whether another attempt can help."""
NON_RETRYABLE: tuple[str, ...] = tuple(name for name, retry in RETRYABLE.items() if not retry)


class DgrpoError(Exception):
    """Base class of the errors durable-grpo raises on purpose."""

    failure_type: str = CONFIG_ERROR

    @property
    def retryable(self) -> bool:
        return RETRYABLE[self.failure_type]


class EngineSetupError(DgrpoError, RuntimeError):
    """The inference engine a worker was told to run cannot run here: vLLM's runtime environment missing or
    broken, or a feature its build lacks (sleep mode on vLLM's CPU build). Said at start, with the fix."""


class RunSpecError(DgrpoError, ValueError):
    """A RunSpec (or another config file) failed validation; the message names each field."""


class StoreError(DgrpoError):
    """The object store could not be used; ``failure_type`` tells auth from reachability."""

    failure_type = STORE_UNAVAILABLE


class StoreAuthError(StoreError):
    """The object store refused the credentials."""

    failure_type = STORE_AUTH


class CheckpointMismatchError(RunSpecError):
    """A run's newest checkpoint was trained for another base model or LoRA shape than its spec says."""


class ForeignObjectError(DgrpoError, ValueError):
    """A ref names something outside the worker's object store (a local file, another bucket, another
    scheme): a worker reads only its own store's objects."""


class CorruptCheckpointError(DgrpoError):
    """A checkpoint is incomplete (no manifest) or corrupt (sha256 mismatch)."""

    failure_type = CORRUPT_CHECKPOINT


class CorruptTrajectoriesError(DgrpoError, ValueError):
    """A trajectory Parquet file is unreadable or was not written by durable-grpo."""


class StoredScenariosError(DgrpoError, ValueError):
    """A run's stored scenario list is missing, at another key than the run's, or not the bytes it stored."""


class StoredRunTextError(DgrpoError, ValueError):
    """A run's stored chat template or rubric is missing, at another key than the run's, or not the bytes it
    stored."""


class TaskImportError(DgrpoError, ImportError):
    """A task's rollout or scenarios path does not import, or is outside the worker's allowed modules."""

    failure_type = TASK_IMPORT


class UnsafePathError(DgrpoError, ValueError):
    """A local path built from a run's names would leave the directory it belongs under."""


class UnsupportedModelError(DgrpoError, ValueError):
    """The CPU engine cannot run this model's architecture (vLLM can)."""


class BadRewardError(DgrpoError, ValueError):
    """A trajectory's reward is not finite or beyond the allowed magnitude."""

    failure_type = BAD_REWARD


class BadLogprobError(DgrpoError, ValueError):
    """A trajectory's sampling logprob is not finite or outside ``[MIN_SAMPLING_LOGPROB, 0]``."""

    failure_type = BAD_LOGPROB


class StalledError(DgrpoError):
    """A stage of an activity's work ran past its bound without advancing and was stopped (activities/progress.py)."""

    failure_type = STALLED


class NonFiniteUpdateError(DgrpoError, ArithmeticError):
    """A step's loss, gradient norm or adapter weights are not finite; nothing is applied or published."""

    failure_type = NON_FINITE_UPDATE


class StagedStateLostError(DgrpoError):
    """The trainer asked to continue from its own staged step no longer holds it (another staging replaced it)."""

    failure_type = STAGED_STATE_LOST


class GangLostError(DgrpoError):
    """A rank of the trainer's gang died, went silent or was cut off mid-attempt (activities/gang/)."""

    failure_type = GANG_LOST
