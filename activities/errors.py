"""Typed errors as the failures Temporal records: one mapping for every activity (``schemas.errors.RETRYABLE``)."""

from __future__ import annotations

from temporalio.exceptions import ApplicationError

from schemas.errors import DgrpoError


def application_error(err: DgrpoError) -> ApplicationError:
    """``err`` as an ``ApplicationError``: its message, its failure type, non-retryable when no retry helps.

    Every worker applies it to whatever ``DgrpoError`` escapes an activity (workers/error_contract.py);
    an activity calls it itself only where it adds context first.
    """
    return ApplicationError(str(err), type=err.failure_type, non_retryable=not err.retryable)
