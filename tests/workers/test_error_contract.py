"""The one error contract, end to end: every failure type through a real worker and a real Temporal server.

A seam activity raises a ``DgrpoError`` of each failure type; the worker's ``ErrorContract`` turns it into an
``ApplicationError`` and the stage's retry policy (``workflows/stages.py``) retries it, or not, as
``schemas.errors.RETRYABLE`` says. The last test does the same with a real store refusing wrong credentials.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest
from pydantic import SecretStr
from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.exceptions import ActivityError, ApplicationError, RetryState
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

import base_models.resolve
import schemas.errors
from activities.metrics import MetricsActivities
from activities.object_store import ObjectStore
from schemas.activities import MetricsInput
from schemas.config import Scheduling
from schemas.errors import NON_RETRYABLE, RETRYABLE, STORE_AUTH, DgrpoError
from schemas.settings import S3Settings
from workers.error_contract import ErrorContract
from workers.stack import EmbeddedStack
from workers.temporal import connect_client
from workflows.stages import METRICS, Stage, run_stage

RAISE = "raise_typed_error"
SEAM = Stage(RAISE, timedelta(seconds=30), max_attempts=2)  # type: ignore[arg-type]


@activity.defn(name=RAISE)
async def raise_typed_error(failure_type: str) -> None:
    """The seam: whatever activity code raises a ``DgrpoError`` of this failure type."""
    kind = type(f"Raised{failure_type}", (DgrpoError,), {"failure_type": failure_type})
    raise kind(f"a {failure_type} on attempt {activity.info().attempt}")


@workflow.defn(sandboxed=False)
class CallStage:
    """Runs one stage with its retry policy; returns the failure's type, retry state and message."""

    @workflow.run
    async def run(
        self, queue: str, failure_type: str | None, metrics: MetricsInput | None
    ) -> tuple[str, str, str]:
        stage, arg = (SEAM, failure_type) if metrics is None else (METRICS, metrics)
        try:
            await run_stage(stage, arg, task_queue=queue, step=1, scheduling=Scheduling(), reraise=True)
        except ActivityError as err:
            cause = err.cause
            assert isinstance(cause, ApplicationError)
            return cause.type or "", RetryState(err.retry_state).name, cause.message
        return "", "", "succeeded"


HUGE = "raise_huge_error"
HUGE_STAGE = Stage(HUGE, timedelta(seconds=30), max_attempts=2)  # type: ignore[arg-type]


@activity.defn(name=HUGE)
async def raise_huge_error(_: None) -> None:
    """An error whose message is over Temporal's 2 MB limit (a server's whole answer, a log quoted in full)."""
    raise RuntimeError(f"the real cause, attempt {activity.info().attempt}: " + "x" * 3_000_000 + " (end)")


@workflow.defn(sandboxed=False)
class CallHuge:
    @workflow.run
    async def run(self, queue: str) -> tuple[str, str, str, str]:
        try:
            await run_stage(HUGE_STAGE, None, task_queue=queue, step=1, scheduling=Scheduling(), reraise=True)
        except ActivityError as err:
            cause = err.cause
            kind = cause.type or "" if isinstance(cause, ApplicationError) else type(cause).__name__
            return kind, RetryState(err.retry_state).name, str(cause)[:60], str(cause)[-20:]
        return "", "", "succeeded", ""


async def call(
    client: Client, queue: str, failure_type: str | None = None, metrics: MetricsInput | None = None
) -> tuple[str, str, str]:
    return await client.execute_workflow(
        CallStage.run,
        args=[queue, failure_type, metrics],
        id=f"contract-{uuid.uuid4().hex[:8]}",
        task_queue=queue,
        execution_timeout=timedelta(minutes=2),
    )


def test_every_typed_error_has_a_failure_type_in_the_table() -> None:
    defined = [schemas.errors, base_models.resolve]
    classes = [
        c for m in defined for c in vars(m).values() if isinstance(c, type) and issubclass(c, DgrpoError)
    ]
    assert len(classes) >= 7
    assert all(c.failure_type in RETRYABLE for c in classes), [
        c for c in classes if c.failure_type not in RETRYABLE
    ]
    assert set(NON_RETRYABLE) == {t for t, retry in RETRYABLE.items() if not retry}


async def test_each_failure_type_is_retried_exactly_when_the_table_says(
    stack: EmbeddedStack, task_queue: str
) -> None:
    client = await connect_client(address=stack.temporal_address)
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[CallStage],
        activities=[raise_typed_error],
        interceptors=[ErrorContract()],
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        results = await asyncio.gather(*(call(client, task_queue, t) for t in RETRYABLE))
    for (failure_type, retry), (seen_type, state, message) in zip(RETRYABLE.items(), results, strict=True):
        assert seen_type == failure_type
        if retry:
            assert state == "MAXIMUM_ATTEMPTS_REACHED" and "on attempt 2" in message, (failure_type, state)
        else:
            assert state == "NON_RETRYABLE_FAILURE" and "on attempt 1" in message, (failure_type, state)


async def test_wrong_store_credentials_fail_at_once_not_after_retries(
    stack: EmbeddedStack, task_queue: str, s3_settings: S3Settings
) -> None:
    client = await connect_client(address=stack.temporal_address)
    wrong = ObjectStore(s3_settings.model_copy(update={"secret_key": SecretStr("not-the-secret")}))
    metrics = MetricsActivities(wrong)
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[CallStage],
        activities=metrics.all(),
        interceptors=[ErrorContract()],
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        inp = MetricsInput(
            run_id="r", project="p", model_name="m", step=1, metrics={"reward": 1.0}, wandb=False
        )
        failure_type, state, message = await call(client, task_queue, metrics=inp)
    assert (failure_type, state) == (STORE_AUTH, "NON_RETRYABLE_FAILURE"), message
    assert "not-the-secret" not in message


@pytest.mark.parametrize("failure_type", sorted(RETRYABLE))
def test_a_typed_error_maps_to_its_application_error(failure_type: str) -> None:
    from activities.errors import application_error

    err = type("E", (DgrpoError,), {"failure_type": failure_type})("what to fix")
    mapped = application_error(err)
    assert (mapped.type, mapped.non_retryable, mapped.message) == (
        failure_type,
        not RETRYABLE[failure_type],
        "what to fix",
    )


async def test_a_failure_too_large_for_temporal_keeps_its_cause_and_is_retried(
    stack: EmbeddedStack, task_queue: str
) -> None:
    client = await connect_client(address=stack.temporal_address)
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[CallHuge],
        activities=[raise_huge_error],
        interceptors=[ErrorContract()],
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        kind, state, head, tail = await client.execute_workflow(
            CallHuge.run,
            task_queue,
            id=f"huge-{uuid.uuid4().hex[:8]}",
            task_queue=task_queue,
            execution_timeout=timedelta(minutes=2),
        )
    # Not Temporal's "Failure exceeds size limit" (non-retryable, the cause lost): the cause, retried.
    assert (kind, state) == ("RuntimeError", "MAXIMUM_ATTEMPTS_REACHED"), head
    assert "the real cause, attempt 2" in head and tail.endswith("(end)")
