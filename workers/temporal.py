"""The one way every client and worker connects to Temporal, and rides out a Temporal that does not answer.

``connect_client``: the pydantic data converter (with the error contract's failure converter), settings from
the environment, traces when an OTLP endpoint is configured (``workers/telemetry.py``); with ``wait_s`` it keeps trying (a worker started before Temporal, or while it restarts). ``across_restarts``: a call (a workflow's result, a
describe) made again while Temporal is unreachable, since a restart cuts every RPC and long poll in flight.
Both back off up to ``BACKOFF_CAP_S`` and log each try.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, RPCStatusCode

from schemas.errors import DgrpoError
from schemas.settings import TemporalSettings
from workers.error_contract import ContractFailureConverter
from workers.telemetry import tracing_interceptors

log = logging.getLogger(__name__)

T = TypeVar("T")

DATA_CONVERTER = dataclasses.replace(
    pydantic_data_converter, failure_converter_class=ContractFailureConverter
)
"""Pydantic payloads; failures by the one error contract (an input that does not validate is not retried)."""

FIRST_BACKOFF_S = 0.5
BACKOFF_CAP_S = 5.0
RESTART_WAIT_S = 600.0
"""How long a client waiting on a workflow keeps asking a Temporal that does not answer."""


class TemporalUnreachable(DgrpoError, ConnectionError):
    """No Temporal server answered at the address."""


CUT_OFF = "transport error"
"""The message (status UNKNOWN) of a call whose connection broke mid-way: a server killed under a long poll."""


def unreachable(err: BaseException) -> bool:
    """Temporal did not answer: a connect that failed, an RPC refused for lack of a server, one cut off, or
    one a restarting or overloaded server did not answer in time."""
    if isinstance(err, TemporalUnreachable):
        return True
    if not isinstance(err, RPCError):
        return False
    if err.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED):
        return True
    return err.status == RPCStatusCode.UNKNOWN and err.message == CUT_OFF


async def across_restarts(call: Callable[[], Awaitable[T]], what: str, wait_s: float = RESTART_WAIT_S) -> T:
    """``await call()``, made again while Temporal is unreachable, for up to ``wait_s``; other errors (and the
    last unreachable one) are raised. ``what`` names the call in the log line of each try."""
    deadline = time.monotonic() + wait_s
    delay = FIRST_BACKOFF_S
    while True:
        try:
            return await call()
        except Exception as err:
            if not unreachable(err) or time.monotonic() + delay > deadline:
                raise
            log.warning("%s: Temporal does not answer (%s); trying again in %.1fs", what, err, delay)
        await asyncio.sleep(delay)
        delay = min(delay * 2, BACKOFF_CAP_S)


async def result_across_restarts(handle: WorkflowHandle[Any, T], wait_s: float = RESTART_WAIT_S) -> T:
    """The workflow's result, waited for across Temporal restarts (the long poll dies with the server)."""
    return await across_restarts(handle.result, f"waiting for workflow {handle.id}", wait_s)


async def connect_client(
    settings: TemporalSettings | None = None,
    *,
    address: str | None = None,
    namespace: str | None = None,
    tls: bool = False,
    api_key: str | None = None,
    wait_s: float = 0.0,
) -> Client:
    """Connect with the pydantic data converter; arguments override ``settings`` (default: the environment,
    ``DGRPO_TEMPORAL_ADDRESS`` / ``DGRPO_TEMPORAL_NAMESPACE``). ``api_key`` is Temporal Cloud's. ``wait_s``:
    keep trying that long while no server answers (0: one try; ``TemporalUnreachable`` says where)."""
    s = settings or TemporalSettings.from_env()
    target = address or s.address

    async def connect() -> Client:
        try:
            return await Client.connect(
                target,
                namespace=namespace or s.namespace,
                tls=tls,
                api_key=api_key,
                data_converter=DATA_CONVERTER,
                interceptors=tracing_interceptors(),  # on its workers too
            )
        except RuntimeError as err:  # the SDK's bridge raises a bare RuntimeError when it cannot connect
            raise TemporalUnreachable(
                f"no Temporal server answers at {target} ({err}); start one with `dgrpo up`, or set "
                "DGRPO_TEMPORAL_ADDRESS to yours"
            ) from err

    return await across_restarts(connect, f"connecting to Temporal at {target}", wait_s)
