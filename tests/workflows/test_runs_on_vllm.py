"""Whole TrainingRuns on vLLM, with no GPU: a real ``dgrpo worker all --engine vllm`` (vLLM's CPU build from the
runtime environment ``deploy/install.sh --vllm`` makes) serves the rollouts and reloads each step's adapter in
place, its trainer child trains on the CPU, real Temporal and real S3 hold the rest. Two steps in sync mode,
two in pipelined mode (both in every test run), and a vLLM server killed mid-rollout that the worker starts
again with its adapters (``extended``: ``pytest -m extended``, beyond CI's 30 minutes).

Each run prints the trainer's mean importance ratio per step, exp(trainer logprob - vLLM's sampled logprob)
before the step's update: with fp32 on both sides it is 1 to a few parts in a million."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import psutil
import pytest
import pytest_asyncio
from temporalio.client import Client

from activities.checkpoints import METRICS_FILE
from activities.object_store import ObjectStore
from dgrpo.client import run_control
from schemas.config import RunSpec, TaskQueues
from schemas.layout import MANIFEST_NAME, checkpoint_prefix
from schemas.run_state import RunStatus
from schemas.settings import S3Settings
from workers.launcher import WorkerProcess
from workers.stack import EmbeddedStack
from workers.temporal import connect_client
from workflows.training_run import TrainingRun

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
STEPS = 2
RUN_TIMEOUT_S = 900.0
VLLM_MARKER = "vllm.entrypoints"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def client(stack: EmbeddedStack) -> AsyncIterator[Client]:
    yield await connect_client(address=stack.temporal_address)


@pytest.fixture(scope="module")
def queues(vllm_queues: TaskQueues) -> TaskQueues:
    return vllm_queues


@pytest.fixture(scope="module")
def worker(vllm_worker: WorkerProcess) -> WorkerProcess:
    """The session's ``dgrpo worker all --engine vllm`` (tests/conftest.py), whose server the serving contract
    has just been run against."""
    return vllm_worker


def vllm_servers(worker: WorkerProcess) -> list[psutil.Process]:
    """The worker's live vLLM API processes (each one's engine core and workers are its children)."""
    found = []
    for child in psutil.Process(worker.info.pid).children():
        try:
            if VLLM_MARKER in " ".join(child.cmdline()) and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


def vllm_server(worker: WorkerProcess) -> psutil.Process:
    found = vllm_servers(worker)
    assert len(found) == 1, [" ".join(c.cmdline()) for c in found]
    return found[0]


async def served_again(worker: WorkerProcess, key: str, killed: int, adapter: str) -> float:
    """Seconds until a vLLM process other than ``killed`` lists ``adapter`` (the worker loaded it back)."""
    start = time.monotonic()
    sdk = openai.AsyncOpenAI(base_url=worker.server_urls[0], api_key=key, max_retries=0, timeout=5)
    while True:
        if any(p.pid != killed for p in vllm_servers(worker)):
            try:
                if adapter in {m.id for m in (await sdk.models.list()).data}:
                    return time.monotonic() - start
            except openai.APIError:
                pass  # still starting
        await asyncio.sleep(0.5)


def spec_for(run_id: str, queues: TaskQueues, mode: str) -> RunSpec:
    data = json.loads((REPO / "examples" / "run.json").read_text())
    data.update(
        run_id=run_id, steps=STEPS, task_queues=queues.model_dump(), metrics={"wandb": False}, mode=mode
    )
    data.update(serving={"engine": "vllm"})
    data["model"]["name"] = run_id
    data["model"]["lora"] = {"rank": 8, "alpha": 16}  # the worker's --max-lora-rank
    data["train"] = {"learning_rate": 2e-4}
    return RunSpec.model_validate(data)


def mean_ratios(store: ObjectStore, spec: RunSpec) -> list[float]:
    """The trainer's mean importance ratio at the start of each step (its checkpoint's metrics.json)."""
    ratios = []
    for step in range(1, STEPS + 1):
        metrics: dict[str, Any] = json.loads(
            store.get_bytes(checkpoint_prefix(spec.run_id, step) + METRICS_FILE)
        )
        ratios.append(float(metrics["mean_ratio"]))
    return ratios


def assert_complete(final: RunStatus, store: ObjectStore, spec: RunSpec) -> None:
    assert final.phase == "done" and final.step == STEPS and final.adapter == f"{spec.run_id}@{STEPS}", final
    assert [h.step for h in final.history] == list(range(1, STEPS + 1))
    groups = spec.groups_per_step * spec.group_size
    assert all(h.n_trajectories == groups and h.reward_mean is not None for h in final.history)
    for step in range(STEPS + 1):
        assert store.exists(checkpoint_prefix(spec.run_id, step) + MANIFEST_NAME), f"no checkpoint {step}"


async def assert_served_by_vllm(worker: WorkerProcess, key: str, spec: RunSpec) -> None:
    """vLLM serves the last step's adapter (reloaded in place by name each step) and answers with it."""
    sdk = openai.AsyncOpenAI(base_url=worker.server_urls[0], api_key=key, max_retries=2, timeout=120)
    served = {m.id for m in (await sdk.models.list()).data}
    assert f"{spec.run_id}@{STEPS}" in served, served
    reply = await sdk.chat.completions.create(
        model=f"{spec.run_id}@{STEPS}", messages=[{"role": "user", "content": "2+2?"}], max_tokens=4
    )
    assert reply.choices[0].finish_reason in ("stop", "length")


async def run(client: Client, spec: RunSpec) -> RunStatus:
    handle = await run_control.start_run(client, spec)
    return await asyncio.wait_for(run_control.watch(handle, lambda _: None, interval=0.5), RUN_TIMEOUT_S)


async def test_a_sync_run_on_vllm(
    client: Client,
    worker: WorkerProcess,
    vllm_api_key: str,
    queues: TaskQueues,
    s3_settings: S3Settings,
) -> None:
    spec = spec_for(f"vl-sync-{uuid.uuid4().hex[:6]}", queues, "sync")
    final = await run(client, spec)
    store = ObjectStore(s3_settings)
    assert_complete(final, store, spec)
    await assert_served_by_vllm(worker, vllm_api_key, spec)
    ratios = mean_ratios(store, spec)
    print(f"sync on vLLM: reward {[h.reward_mean for h in final.history]}, mean importance ratio {ratios}")
    assert all(abs(r - 1) < 1e-3 for r in ratios), f"vLLM fp32 samples far from the trainer's: {ratios}"
    assert all(h.policy_step == h.step - 1 for h in final.history)  # on-policy: vLLM served each new step


async def test_a_pipelined_run_on_vllm(
    client: Client,
    worker: WorkerProcess,
    vllm_api_key: str,
    queues: TaskQueues,
    s3_settings: S3Settings,
) -> None:
    spec = spec_for(f"vl-pipe-{uuid.uuid4().hex[:6]}", queues, "pipelined")
    final = await run(client, spec)
    store = ObjectStore(s3_settings)
    assert_complete(final, store, spec)
    await assert_served_by_vllm(worker, vllm_api_key, spec)
    assert final.dropped_stale_groups == 0
    assert [h.policy_step for h in final.history] == [0, 0]  # step 2 rolled out while step 1 trained
    print(f"pipelined on vLLM: mean importance ratio {mean_ratios(store, spec)}")


@pytest.mark.extended  # beyond CI's 30 minutes (issue 23): run with `pytest -m extended`
async def test_a_killed_vllm_server_is_started_again_with_its_adapters(
    client: Client,
    worker: WorkerProcess,
    vllm_api_key: str,
    queues: TaskQueues,
    s3_settings: S3Settings,
) -> None:
    """kill -9 of vLLM's API process while step 2 rolls out on step 1's adapter: the worker ends what it left
    behind (its engine core), starts vLLM again, loads the adapters back, and the retried rollouts finish."""
    server = vllm_server(worker)
    spec = spec_for(f"vl-kill-{uuid.uuid4().hex[:6]}", queues, "sync")
    handle = await run_control.start_run(client, spec)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not (len((s := await handle.query(TrainingRun.status)).history) == 1 and s.phase == "rollouts"):
        assert time.monotonic() < deadline and s.phase != "done", f"the run never rolled out step 2: {s}"
        await asyncio.sleep(0.2)
    os.kill(server.pid, signal.SIGKILL)
    back = asyncio.create_task(served_again(worker, vllm_api_key, server.pid, f"{spec.run_id}@1"))
    final = await asyncio.wait_for(handle.result(), RUN_TIMEOUT_S)
    seconds = await asyncio.wait_for(back, 10)  # it served step 2's rollouts, so it has long been back
    print(f"vLLM killed mid-rollout: serving {spec.run_id}@1 again after {seconds:.0f} s")
    assert_complete(final, ObjectStore(s3_settings), spec)
    assert vllm_server(worker).pid != server.pid
    with pytest.raises(ProcessLookupError):  # nothing of the killed server's process group is left
        os.killpg(server.pid, 0)
    log = worker.log_path.read_text()
    assert "the inference server exited" in log
    restored = [
        line for line in log.splitlines() if "inference server restarted; adapters loaded again" in line
    ]
    assert restored and f"{spec.run_id}@1" in restored[-1], restored
    await assert_served_by_vllm(worker, vllm_api_key, spec)
