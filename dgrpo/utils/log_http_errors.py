"""ART's ``log_http_errors``: an async function's ``httpx.HTTPStatusError`` re-raised as an ``Exception`` whose
message is ``[HTTP <status>] <url> <detail>``, the ``detail`` of the response's JSON body (None when absent);
an error whose body is not a JSON object is re-raised as it is."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

import httpx

P = ParamSpec("P")
R = TypeVar("R")


def log_http_errors(func: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Decorate an async function so an HTTP error status says its URL and the server's ``detail``."""

    @functools.wraps(func)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await func(*args, **kwargs)
        except httpx.HTTPStatusError as error:
            try:
                body = error.response.json()
            except ValueError:  # not JSON (UnicodeDecodeError is a ValueError too)
                raise error from None
            if not isinstance(body, dict):
                raise
            detail = body.get("detail")
            raise Exception(f"[HTTP {error.response.status_code}] {error.request.url} {detail}") from error

    return wrapper
