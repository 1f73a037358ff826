"""The one error contract of every activity: a ``DgrpoError`` leaves the worker as an ``ApplicationError``,
and no failure is too large for Temporal to record.

Its type is the error's ``failure_type`` and it is non-retryable exactly when ``schemas.errors.RETRYABLE``
says so, the same table the workflows' retry policies read. Without it, an escaping ``StoreAuthError``
would reach Temporal typed by its class name, match nothing in the non-retryable list and be retried.

Temporal refuses a failure over its blob size limit (2 MB) and records "Failure exceeds size limit"
(non-retryable) instead, losing the cause; an error whose messages and details, down its chain of causes,
exceed ``MAX_FAILURE_CHARS`` leaves as one ``ApplicationError`` with the head and tail of its message, its
type and its retryability.
"""

from __future__ import annotations

from typing import Any

from temporalio.exceptions import ApplicationError
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from activities.errors import application_error
from schemas.errors import DgrpoError

MAX_FAILURE_CHARS = 16_000
"""Well under Temporal's 2 MB, and more than any message meant for a person."""


class ErrorContract(Interceptor):
    """Register on every ``Worker`` (``interceptors=[ErrorContract()]``)."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _TypedErrors(next)


class _TypedErrors(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        try:
            return await self.next.execute_activity(input)
        except DgrpoError as err:
            failure = application_error(err)
            if failure_chars(err) > MAX_FAILURE_CHARS:
                raise bounded(failure) from None
            raise failure from err
        except Exception as err:
            if failure_chars(err) > MAX_FAILURE_CHARS:
                raise bounded(err) from None
            raise


def failure_chars(err: BaseException) -> int:
    """The characters of messages and details down ``err``'s chain of causes (what Temporal would record)."""
    total, seen = 0, set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        total += len(str(current))
        if isinstance(current, ApplicationError):
            total += len(repr(current.details))
        current = current.__cause__ or current.__context__
    return total


def bounded(err: BaseException) -> ApplicationError:
    """``err`` as an ``ApplicationError`` of at most ``MAX_FAILURE_CHARS``: its message's head and tail, its
    type, its retryability; no details and no chain of causes."""
    message, half = str(err), MAX_FAILURE_CHARS // 2 - 100
    if len(message) > 2 * half:
        cut = len(message) - 2 * half
        message = f"{message[:half]} [... {cut} characters cut ...] {message[-half:]}"
    if isinstance(err, ApplicationError):
        return ApplicationError(message, type=err.type, non_retryable=err.non_retryable)
    return ApplicationError(message, type=type(err).__name__)
