"""The one error contract of every activity: a ``DgrpoError`` leaves the worker as an ``ApplicationError``,
and no failure is too large for Temporal to record.

Its type is the error's ``failure_type`` and it is non-retryable exactly when ``schemas.errors.RETRYABLE``
says so, the same table the workflows' retry policies read. Without it, an escaping ``StoreAuthError``
would reach Temporal typed by its class name, match nothing in the non-retryable list and be retried.

Temporal refuses a failure over its blob size limit (2 MB) and records "Failure exceeds size limit"
(non-retryable) instead, losing the cause; an error whose messages and details, down its chain of causes,
exceed ``MAX_FAILURE_CHARS`` leaves as one ``ApplicationError`` with the head and tail of its message, its
type and its retryability.

An activity whose input does not validate fails before any interceptor runs: the SDK raises a plain, retryable
"Failed decoding arguments". ``ContractFailureConverter`` (the failure converter of every client and worker,
``workers/temporal.py``) records it as a non-retryable ``ConfigError`` carrying the validation error, since
no attempt can decode the same input.
"""

from __future__ import annotations

from typing import Any

import temporalio.api.failure.v1
from pydantic import ValidationError
from temporalio.converter import DefaultFailureConverter, PayloadConverter
from temporalio.exceptions import ApplicationError
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from activities.errors import application_error
from schemas.errors import CONFIG_ERROR, DgrpoError

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


UNDECODABLE = "Failed decoding arguments"
"""The SDK's message for an activity input its data converter could not decode."""


class ContractFailureConverter(DefaultFailureConverter):
    """The default failure converter, but an input that does not validate is refused for good."""

    def to_failure(
        self,
        exception: BaseException,
        payload_converter: PayloadConverter,
        failure: temporalio.api.failure.v1.Failure,
    ) -> None:
        super().to_failure(refused_input(exception) or exception, payload_converter, failure)


def refused_input(err: BaseException) -> ApplicationError | None:
    """``err``, the SDK's retryable decode failure of an input that does not validate, as a non-retryable
    ``ConfigError`` naming each field; None for any other error."""
    if not (isinstance(err, ApplicationError) and err.message == UNDECODABLE and not err.non_retryable):
        return None
    invalid = err.__cause__
    while invalid is not None and not isinstance(invalid, ValidationError):
        invalid = invalid.__cause__
    if invalid is None:
        return None
    refused = ApplicationError(
        f"{UNDECODABLE}: the input does not validate, so no attempt can run it; fix {invalid}",
        type=CONFIG_ERROR,
        non_retryable=True,
    )
    refused.__traceback__ = err.__traceback__
    refused.__cause__ = err.__cause__
    return bounded(refused) if failure_chars(refused) > MAX_FAILURE_CHARS else refused
