"""Typed errors shared by every layer, and the Temporal failure types they map to.

Activities raise ``temporalio.exceptions.ApplicationError(message, type=<one of the names below>)``;
workflows and clients match on the same names, so the contract lives here once.
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
BAD_REWARD = "BadReward"
"""A reward is NaN, infinite or too large; the message names the group and trajectory."""

NON_RETRYABLE: tuple[str, ...] = (CONFIG_ERROR, STORE_AUTH, TASK_IMPORT, CORRUPT_CHECKPOINT, BAD_REWARD)


class DgrpoError(Exception):
    """Base class of the errors durable-grpo raises on purpose."""

    failure_type: str = CONFIG_ERROR


class RunSpecError(DgrpoError, ValueError):
    """A RunSpec (or another config file) failed validation; the message names each field."""


class StoreError(DgrpoError):
    """The object store could not be used; ``failure_type`` tells auth from reachability."""

    failure_type = STORE_UNAVAILABLE


class StoreAuthError(StoreError):
    """The object store refused the credentials."""

    failure_type = STORE_AUTH


class CorruptCheckpointError(DgrpoError):
    """A checkpoint is incomplete (no manifest) or corrupt (sha256 mismatch)."""

    failure_type = CORRUPT_CHECKPOINT


class CorruptTrajectoriesError(DgrpoError, ValueError):
    """A trajectory Parquet file is unreadable or was not written by durable-grpo."""


class TaskImportError(DgrpoError, ImportError):
    """A task's rollout or scenarios path does not import, or is outside the worker's allowed modules."""

    failure_type = TASK_IMPORT


class UnsafePathError(DgrpoError, ValueError):
    """A local path built from a run's names would leave the directory it belongs under."""


class BadRewardError(DgrpoError, ValueError):
    """A trajectory's reward is not finite or beyond the allowed magnitude."""

    failure_type = BAD_REWARD
