"""Heartbeats that mean progress, on a real Temporal server with the real trainer and serving activities.

A stage of an activity's work that stops advancing (activities/progress.py) no longer hides behind a ticker
that beats regardless: a chat render that runs on is stopped at its bound and fails as retryable; a download
that hangs stops the heartbeats, so Temporal's heartbeat timeout ends the attempt (and retries it, on another
worker if need be); a micro-batch or a model load that hangs on the trainer's compute thread fails its attempt,
and every attempt that comes while it is stuck, at once (a worker process then leaves for a fresh one:
tests/workers/test_stuck_trainer.py). The worker serves the next activity once its thread is free. The worker here has stage bounds
of a few seconds (an operator's ``DGRPO_STAGE_BOUNDS``), and the trainer trusts run specs' templates.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from temporalio import workflow
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities import sft, training
from activities.object_store import ObjectStore
from activities.serving import ServingActivities
from activities.training import TrainerActivities
from schemas import layout
from schemas.activities import ReloadInput, SftConfig, SftInput
from schemas.config import LoraConfig, ModelSpec
from schemas.errors import CONFIG_ERROR, STALLED
from schemas.refs import CheckpointRef, ObjectRef
from schemas.settings import S3Settings
from workers.error_contract import ErrorContract
from workers.heartbeat_ticker import HeartbeatTicker
from workers.stack import EmbeddedStack
from workers.temporal import connect_client

BOUNDS_S = {"render": 2.0, "micro_batch": 10.0, "download": 5.0}
"""Far above a healthy render, micro-batch or download here, even on a loaded machine."""
HEARTBEAT_TIMEOUT = timedelta(seconds=4)
START_TO_CLOSE = timedelta(seconds=60)
"""Far longer than a stalled stage takes to end here (its bound plus a heartbeat timeout); today's ticker kept
every one of these attempts alive until this."""
MODEL = ModelSpec(name="m", base_model="smollm2-135m-instruct", lora=LoraConfig(rank=4, alpha=8))
SLOW_TEMPLATE = (
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    "{% for m in messages %}{{ m['content'] }}{% endfor %}"
)
"""Ten billion loop turns: a render that would hold the trainer for hours."""


@workflow.defn(sandboxed=False)
class OneAttempt:
    """Runs one activity once, with a heartbeat timeout, and reports how it ended."""

    @workflow.run
    async def run(self, call: dict[str, Any]) -> dict[str, Any]:
        try:
            await workflow.execute_activity(
                call["activity"],
                call["input"],
                task_queue=call["queue"],
                start_to_close_timeout=START_TO_CLOSE,
                heartbeat_timeout=HEARTBEAT_TIMEOUT,
                retry_policy=RetryPolicy(maximum_attempts=1),
            )
        except ActivityError as err:
            cause = err.cause
            if isinstance(cause, TimeoutError):
                return {"ok": False, "timeout": cause.type.name if cause.type else None}
            if isinstance(cause, ApplicationError):
                return {"ok": False, "type": cause.type, "message": cause.message,
                        "non_retryable": cause.non_retryable}  # fmt: skip
            return {"ok": False, "other": repr(cause)}
        return {"ok": True}


@dataclass
class Harness:
    client: Client
    queue: str
    untrusting_queue: str
    short_load_queue: str
    """A trainer whose operator bounds the ``load`` stage to 3 s (``DGRPO_STAGE_BOUNDS=load=3``)."""
    trainer: TrainerActivities
    store: ObjectStore
    examples: ObjectRef

    async def attempt(self, activity: str, input: Any, queue: str | None = None) -> dict[str, Any]:
        call = {"activity": activity, "input": input.model_dump(mode="json"), "queue": queue or self.queue}
        out: dict[str, Any] = await self.client.execute_workflow(
            OneAttempt.run, call, id=f"attempt-{uuid.uuid4().hex[:10]}", task_queue=self.queue
        )
        return out

    def sft(self, run_id: str, model: ModelSpec = MODEL) -> SftInput:
        return SftInput(
            run_id=run_id, step=1, model=model, examples=self.examples,
            sft=SftConfig(learning_rates=[1e-4], batch_size=1, micro_batch_size=1),
        )  # fmt: skip


@pytest.fixture(scope="module")
def tarpit() -> Iterator[str]:
    """An S3 endpoint that takes connections and requests and never answers (a store hung mid-response)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def hold() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    listener.close()


@pytest_asyncio.fixture(scope="module")
async def harness(
    stack: EmbeddedStack, s3_settings: S3Settings, tarpit: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Harness]:
    store = ObjectStore(s3_settings.model_copy(update={"bucket": f"live-{uuid.uuid4().hex[:10]}"}))
    store.ensure_bucket()
    chat = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
    ]
    examples = store.put_bytes(layout.sft_examples_key("examples", 1), sft.example_line(chat, None).encode())
    staging = tmp_path_factory.mktemp("live-staging")
    trainer = TrainerActivities(store, staging / "trusting", "live-trainer", trust_chat_template=True)
    untrusting = TrainerActivities(store, staging / "untrusting", "live-untrusting")
    short_load = TrainerActivities(store, staging / "short-load", "live-short-load")
    hung_store = ObjectStore(s3_settings.model_copy(update={"endpoint": tarpit, "bucket": store.bucket}))
    serving = ServingActivities(
        ["http://127.0.0.1:9/v1"], store=hung_store, adapter_root=staging / "adapters"
    )
    client = await connect_client(address=stack.temporal_address)
    queue = f"live-{uuid.uuid4().hex[:8]}"
    interceptors = [ErrorContract(), HeartbeatTicker(bounds_s=BOUNDS_S)]  # type: ignore[arg-type]
    workers = [
        Worker(client, task_queue=queue, workflows=[OneAttempt], activities=[*trainer.all(), serving.reload],
               interceptors=interceptors, workflow_runner=UnsandboxedWorkflowRunner(),
               max_heartbeat_throttle_interval=timedelta(seconds=1)),
        Worker(client, task_queue=f"{queue}-untrusting", activities=[untrusting.train_sft],
               interceptors=interceptors),
        Worker(client, task_queue=f"{queue}-load", activities=[short_load.train_sft],
               interceptors=[ErrorContract(), HeartbeatTicker(bounds_s={"load": 3.0})]),
    ]  # fmt: skip
    tasks = [asyncio.create_task(w.run()) for w in workers]
    try:
        yield Harness(client, queue, f"{queue}-untrusting", f"{queue}-load", trainer, store, examples)
    finally:
        for w in workers:
            await w.shutdown()
        for task in tasks:
            task.cancel()
        store.remove_bucket()


def until_free(trainer: TrainerActivities) -> None:
    """Return once the trainer's freed compute thread has moved on (is no longer stuck)."""
    while trainer.stuck() is not None:
        time.sleep(0.2)


async def expect_trained(h: Harness) -> None:
    """The worker serves the next activity: a good fine-tuning step on the same trainer."""
    out = await h.attempt("train_sft", h.sft(f"good-{uuid.uuid4().hex[:6]}"))
    assert out == {"ok": True}, out


async def test_a_render_that_runs_on_is_stopped_and_fails_as_retryable(harness: Harness) -> None:
    own = MODEL.model_copy(update={"chat_template": SLOW_TEMPLATE})
    out = await harness.attempt("train_sft", harness.sft("slow-render", own))
    assert out["ok"] is False and out.get("type") == STALLED, out
    assert not out["non_retryable"]
    assert "model.chat_template" in out["message"] and "render" in out["message"], out
    await expect_trained(harness)  # its thread is free: the next run's step does not wait behind it


async def test_a_micro_batch_that_hangs_fails_its_attempt_and_the_next_at_once(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planted: the micro-batch hangs (as a deadlocked kernel would). Its attempt fails as ``Stalled`` at the stage's
    bound (its heartbeats stop with it), and an attempt that comes while the thread is still stuck fails at once
    instead of waiting behind it, heartbeating; once the thread frees, the trainer trains."""
    released = threading.Event()
    real: Callable[..., Any] = sft.sft_update

    def hangs_once(*args: Any, **kwargs: Any) -> Any:
        if not released.is_set():
            released.wait(120)
        return real(*args, **kwargs)

    monkeypatch.setattr(sft, "sft_update", hangs_once)
    try:
        stuck = await harness.attempt("train_sft", harness.sft("hung-micro-batch"))
        behind = await harness.attempt("train_sft", harness.sft("behind-hung-micro-batch"))
    finally:
        released.set()
    for out in (stuck, behind):
        assert out["ok"] is False and out.get("type") == STALLED and not out["non_retryable"], out
        assert "compute thread is stuck" in out["message"] and "stage 'micro_batch'" in out["message"], out
    await asyncio.to_thread(until_free, harness.trainer)
    await expect_trained(harness)


async def test_a_base_model_load_that_hangs_is_bounded_as_a_stage(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planted: loading the base model never returns (a dead NFS mount) on a trainer whose operator bounds the
    ``load`` stage to 3 s. The attempt fails as ``Stalled`` naming the stage, and so does one that comes while it is
    stuck, at once."""
    released = threading.Event()
    real = training.Trainer

    class LoadsFromADeadMount(real):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            released.wait(120)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(training, "Trainer", LoadsFromADeadMount)
    try:
        stuck = await harness.attempt("train_sft", harness.sft("hung-load"), queue=harness.short_load_queue)
        behind = await harness.attempt(
            "train_sft", harness.sft("behind-load"), queue=harness.short_load_queue
        )
    finally:
        released.set()
    for out in (stuck, behind):
        assert out["ok"] is False and out.get("type") == STALLED, out
        assert "compute thread is stuck" in out["message"] and "stage 'load'" in out["message"], out


async def test_a_download_that_hangs_stops_the_heartbeats(harness: Harness) -> None:
    """The store takes the request and never answers: the reload's download stage does not advance."""
    ref = CheckpointRef(
        run_id="hung-download", step=1, uri=harness.store.uri("runs/hung-download/checkpoints/000001/"),
        manifest_sha256="0" * 64,
    )  # fmt: skip
    out = await harness.attempt("reload", ReloadInput(model_name="m", checkpoint=ref))
    assert out == {"ok": False, "timeout": "HEARTBEAT"}, out


async def test_a_trainer_without_the_trust_flag_refuses_a_runs_own_chat_template(harness: Harness) -> None:
    own = MODEL.model_copy(update={"chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"})
    out = await harness.attempt("train_sft", harness.sft("untrusted", own), queue=harness.untrusting_queue)
    assert out["ok"] is False and out["type"] == CONFIG_ERROR and out["non_retryable"], out
    assert "--trust-request-chat-template" in out["message"] and "model.chat_template" in out["message"]


def test_stage_bounds_come_from_the_operators_environment(tmp_path: Path) -> None:
    from schemas.settings import DEFAULT_STAGE_BOUNDS_S, ENV_STAGE_BOUNDS, WorkerLifecycle

    lifecycle = WorkerLifecycle.from_env({ENV_STAGE_BOUNDS: "micro_batch=3600, render=5"})
    assert lifecycle.stage_bounds_s == {**DEFAULT_STAGE_BOUNDS_S, "micro_batch": 3600.0, "render": 5.0}
    for bad in ("micro_batch", "gpu=3", "render=0", "render=inf", "download=-1"):
        with pytest.raises(ValueError, match=ENV_STAGE_BOUNDS):
            WorkerLifecycle.from_env({ENV_STAGE_BOUNDS: bad})
