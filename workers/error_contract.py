"""The one error contract of every activity: a ``DgrpoError`` leaves the worker as an ``ApplicationError``.

Its type is the error's ``failure_type`` and it is non-retryable exactly when ``schemas.errors.RETRYABLE``
says so, the same table the workflows' retry policies read. Without it, an escaping ``StoreAuthError``
would reach Temporal typed by its class name, match nothing in the non-retryable list and be retried.
"""

from __future__ import annotations

from typing import Any

from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from activities.errors import application_error
from schemas.errors import DgrpoError


class ErrorContract(Interceptor):
    """Register on every ``Worker`` (``interceptors=[ErrorContract()]``)."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _TypedErrors(next)


class _TypedErrors(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        try:
            return await self.next.execute_activity(input)
        except DgrpoError as err:
            raise application_error(err) from err
