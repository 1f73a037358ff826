"""Real TrainingRuns on a GPU: real Temporal, real S3, a real `dgrpo worker all` serving with vLLM and training
with torch + peft on CUDA, the real SmolLM2-135M; 5 steps each in sync, shared and pipelined mode.

The CPU version is tests/workflows/test_training_run_real.py. Each run's reward curve and seconds per phase
go to ``$DGRPO_GPU_RESULTS`` (docs/gpu-results.md's table comes from them)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import pytest_asyncio
from temporalio.client import Client

from activities.checkpoints import METRICS_FILE
from activities.object_store import ObjectStore
from activities.trainer import ENV_BACKEND
from dgrpo.client import run_control
from schemas.config import RunSpec, TaskQueues
from schemas.layout import MANIFEST_NAME, checkpoint_prefix
from schemas.run_state import RunStatus
from schemas.settings import ENV_HOME, S3Settings
from workers.launcher import WorkerProcess
from workers.stack import EmbeddedStack
from workers.temporal import connect_client

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]
STEPS = 5
GROUPS, GROUP_SIZE = 4, 8
ENGINE_FLAGS = ["--engine", "vllm", "--dtype", "bf16", "--sleep-mode", "--max-lora-rank", "16"]
ENGINE_FLAGS += ["--gpu-memory-utilization", "0.3"]  # the trainer shares the GPU in every mode
Record = Callable[[str, dict[str, Any]], None]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def client(stack: EmbeddedStack) -> AsyncIterator[Client]:
    yield await connect_client(address=stack.temporal_address)


@pytest.fixture(scope="module")
def queues() -> TaskQueues:
    suffix = uuid.uuid4().hex[:8]
    return TaskQueues(
        control=f"gpu-control-{suffix}", inference=f"gpu-inference-{suffix}", trainer=f"gpu-trainer-{suffix}"
    )


@pytest.fixture(scope="module")
def workers(
    stack: EmbeddedStack, queues: TaskQueues, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """One `dgrpo worker all` with vLLM in sleep mode (shared runs need it) and the trainer on CUDA."""
    home = tmp_path_factory.mktemp("gpu-worker-home")
    env = {ENV_HOME: str(home), ENV_BACKEND: "torch"}
    proc = WorkerProcess(
        "all", home / "worker.log", task_queues=queues, env=env, cwd=REPO, extra_args=ENGINE_FLAGS
    )
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def gpu_spec(run_id: str, queues: TaskQueues, mode: str) -> RunSpec:
    data = json.loads((REPO / "examples" / "run.json").read_text())
    data.update(run_id=run_id, task_queues=queues.model_dump(), metrics={"wandb": False}, mode=mode)
    data.update(steps=STEPS, groups_per_step=GROUPS, group_size=GROUP_SIZE, serving={"engine": "vllm"})
    data["model"]["name"] = run_id
    data["train"] = {"learning_rate": 2e-4}
    return RunSpec.model_validate(data)


async def run_to_the_end(client: Client, spec: RunSpec) -> RunStatus:
    handle = await run_control.start_run(client, spec)
    return await asyncio.wait_for(run_control.watch(handle, lambda _: None, interval=0.5), 1800)


def trainer_metrics(store: ObjectStore, spec: RunSpec) -> list[dict[str, Any]]:
    """What the trainer measured at each step, from its checkpoint's ``metrics.json``: ``mean_ratio`` is the mean
    importance ratio exp(trainer logprob - vLLM's sampled logprob) over the step's tokens, taken before the
    step's only optimizer update, so it says how far vLLM bf16 sampling is from the fp32 trainer."""
    keys = ("mean_ratio", "clip_fraction", "kl", "loss", "grad_norm", "n_trainable_tokens")
    out = []
    for step in range(1, STEPS + 1):
        metrics = json.loads(store.get_bytes(checkpoint_prefix(spec.run_id, step) + METRICS_FILE))
        out.append({k: metrics.get(k) for k in keys})
    return out


def summarize(final: RunStatus, metrics: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "mode": final.mode,
        "trainer": metrics,
        "reward_mean": [h.reward_mean for h in final.history],
        "seconds_per_step": [h.seconds for h in final.history],
        "policy_step": [h.policy_step for h in final.history],
        "phase_seconds": final.phase_seconds,
    }


def assert_complete(final: RunStatus, store: ObjectStore, spec: RunSpec) -> None:
    assert final.phase == "done" and final.step == STEPS and final.adapter == f"{spec.run_id}@{STEPS}"
    assert [h.step for h in final.history] == list(range(1, STEPS + 1))
    assert all(h.n_trajectories == GROUPS * GROUP_SIZE and h.reward_mean is not None for h in final.history)
    for step in range(STEPS + 1):
        assert store.exists(checkpoint_prefix(spec.run_id, step) + MANIFEST_NAME), f"no checkpoint {step}"


def assert_ratio_near_one(metrics: list[dict[str, Any]]) -> None:
    """On-policy steps: vLLM sampled with the policy the trainer starts from, so the ratio is ~1."""
    ratios = [m["mean_ratio"] for m in metrics]
    assert all(r is not None and abs(r - 1) < 0.05 for r in ratios), (
        f"mean importance ratio per step: {ratios}"
    )


async def newest_adapter_answers(workers: WorkerProcess, spec: RunSpec) -> None:
    sdk = openai.AsyncOpenAI(base_url=workers.server_urls[0], api_key="unused", max_retries=0)
    reply = await sdk.chat.completions.create(
        model=f"{spec.run_id}@{STEPS}", messages=[{"role": "user", "content": "2+2?"}], max_tokens=4
    )
    assert reply.choices[0].finish_reason in ("stop", "length")


async def test_a_sync_run_on_vllm_and_cuda(
    client: Client, workers: WorkerProcess, queues: TaskQueues, s3_settings: S3Settings, record: Record
) -> None:
    spec = gpu_spec(f"gpu-sync-{uuid.uuid4().hex[:6]}", queues, "sync")
    final = await run_to_the_end(client, spec)
    store = ObjectStore(s3_settings)
    assert_complete(final, store, spec)
    await newest_adapter_answers(workers, spec)
    metrics = trainer_metrics(store, spec)
    record("run_sync", summarize(final, metrics))
    assert_ratio_near_one(metrics)


async def test_a_shared_run_sleeps_vllm_while_the_trainer_runs(
    client: Client, workers: WorkerProcess, queues: TaskQueues, s3_settings: S3Settings, record: Record
) -> None:
    spec = gpu_spec(f"gpu-shared-{uuid.uuid4().hex[:6]}", queues, "shared")
    final = await run_to_the_end(client, spec)
    store = ObjectStore(s3_settings)
    assert_complete(final, store, spec)
    assert all({"sleep", "wake_up"} <= h.seconds.keys() for h in final.history)
    await newest_adapter_answers(workers, spec)  # awake again after the last step
    metrics = trainer_metrics(store, spec)
    record("run_shared", summarize(final, metrics))
    assert_ratio_near_one(metrics)  # the adapter survived sleep and reload: samples match the trainer


async def test_a_pipelined_run_rolls_out_the_next_step_while_this_one_trains(
    client: Client, workers: WorkerProcess, queues: TaskQueues, s3_settings: S3Settings, record: Record
) -> None:
    spec = gpu_spec(f"gpu-pipe-{uuid.uuid4().hex[:6]}", queues, "pipelined")
    final = await run_to_the_end(client, spec)
    store = ObjectStore(s3_settings)
    assert_complete(final, store, spec)
    record("run_pipelined", summarize(final, trainer_metrics(store, spec)))
    assert final.dropped_stale_groups == 0
    assert [h.policy_step for h in final.history] == [0, 0, 1, 2, 3]
