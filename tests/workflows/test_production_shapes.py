"""A Qwen3-architecture model through the whole loop, on each engine: the tests' tiny random Qwen3
(base_models/random_shapes.py, ``tiny_qwen3`` in tests/conftest.py) named by its directory as ``base_model`` (under
the workers' ``DGRPO_MODEL_ROOTS``), served by a real ``dgrpo worker all --model DIR`` with our CPU engine and with
vLLM's CPU build, trained by its trainer child: on vLLM's worker the trainer alone, on our engine's a gang of two
ranks under FSDP (``--ranks 2``, activities/gang/), whose checkpoints the server and a one-device trainer read as
they read any.

One run per engine: rollouts of a conversation with a tool call (examples/shape_check.py), the judge,
advantages, training, publish and reload for step 1; the run terminated and started again (resume from checkpoint
1); step 2 the same. Then the serving contract on the trained adapter: the trainer's logprobs of every token
step 2 sampled (with checkpoint 1's adapter) equal the server's, as tests/serving/test_serving_contract.py checks
for SmolLM2; and the importance ratio each step reports is 1."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import openai
import pytest
import pytest_asyncio
import torch
from temporalio.client import Client

from activities import trajectory_store
from activities.checkpoints import TRAINER_STATE_FILE, download_checkpoint
from activities.object_store import ObjectStore
from activities.tokenize import build_sequences
from activities.trainer import Trainer
from dgrpo.client import run_control
from schemas.config import RunSpec, TaskQueues
from schemas.layout import MANIFEST_NAME, checkpoint_prefix, trajectories_key
from schemas.refs import CheckpointRef
from schemas.run_state import RunStatus
from schemas.settings import ENV_HOME, S3Settings
from workers.launcher import WorkerProcess
from workers.stack import EmbeddedStack
from workers.temporal import connect_client
from workflows.training_run import TrainingRun

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
TASK = "examples.shape_check"
STEPS = 2
RUN_TIMEOUT_S = 900.0
MAX_LOGPROB_GAP = 1e-3
"""The serving contract's bound (fp32 on both sides)."""


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def client(stack: EmbeddedStack) -> AsyncIterator[Client]:
    yield await connect_client(address=stack.temporal_address)


@pytest.fixture(scope="module", params=["cpu", "vllm"])
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def queues(engine: str, tiny_gang_queues: TaskQueues) -> TaskQueues:
    if engine == "cpu":
        return tiny_gang_queues
    suffix = f"{engine}-{uuid.uuid4().hex[:8]}"
    return TaskQueues(control=f"sh-c-{suffix}", inference=f"sh-i-{suffix}", trainer=f"sh-t-{suffix}")


@pytest.fixture(scope="module")
def worker(
    engine: str,
    tiny_qwen3: Path,
    stack: EmbeddedStack,
    queues: TaskQueues,
    tiny_gang_worker: WorkerProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[WorkerProcess]:
    """Our engine: the session's ``dgrpo worker all --model <tiny Qwen3> --ranks 2`` (tests/conftest.py); vLLM:
    ``dgrpo worker all --model <tiny Qwen3> --engine vllm`` of its own."""
    if engine == "cpu":
        yield tiny_gang_worker
        return
    home = tmp_path_factory.mktemp(f"shapes-{engine}")
    flags = ["--model", str(tiny_qwen3), "--engine", "vllm", "--max-lora-rank", "16"]
    env = {ENV_HOME: str(home)}
    proc = WorkerProcess("all", home / "worker.log", task_queues=queues, env=env, cwd=REPO, extra_args=flags)
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def shape_spec(run_id: str, queues: TaskQueues, base_model: Path, engine: str) -> RunSpec:
    return RunSpec.model_validate(
        {
            "run_id": run_id,
            "model": {"name": run_id, "base_model": str(base_model), "lora": {"rank": 8, "alpha": 16}},
            "task": {"rollout": f"{TASK}:rollout", "scenarios": f"{TASK}:scenarios"},
            "steps": STEPS,
            "groups_per_step": 2,
            "group_size": 4,
            "train": {"learning_rate": 1e-3},
            "judge": {"kind": "rollout"},
            "serving": {"engine": engine},
            "task_queues": queues.model_dump(),
            "metrics": {"wandb": False},
        }
    )


async def run_with_a_restart(client: Client, spec: RunSpec) -> RunStatus:
    """Start the run, terminate it once step 1 is served, start it again: the same run resumes at step 2."""
    handle = await run_control.start_run(client, spec)
    deadline = asyncio.get_running_loop().time() + RUN_TIMEOUT_S
    while (await handle.query(TrainingRun.status)).step < 1:
        assert asyncio.get_running_loop().time() < deadline, "step 1 never finished"
        await asyncio.sleep(0.5)
    await handle.terminate("a crash after step 1")
    again = await run_control.start_run(client, spec)
    return await asyncio.wait_for(run_control.watch(again, lambda _: None, interval=0.5), RUN_TIMEOUT_S)


def trainer_gaps(store: ObjectStore, spec: RunSpec, tmp_path: Path) -> torch.Tensor:
    """|trainer logprob - the server's sampled logprob| of every token step 2 sampled, with the trainer holding
    checkpoint 1 (the adapter the server sampled with)."""
    groups = trajectory_store.table_to_groups(
        trajectory_store.download_table(store, trajectories_key(spec.run_id, 2)), "step 2"
    )
    trajectories = [t for g in groups for t in g.trajectories]
    tokenized = build_sequences(trajectories, [1.0] * len(trajectories), max_seq_len=4096)
    prefix = checkpoint_prefix(spec.run_id, 1)
    ref = CheckpointRef(
        run_id=spec.run_id, step=1, uri=store.uri(prefix), manifest_sha256=store.read_manifest(prefix)[1]
    )
    trainer = Trainer(spec.model, "fp32")
    download_checkpoint(store, ref, tmp_path / "checkpoint-1")
    trainer.load_state(tmp_path / "checkpoint-1")
    gaps = []
    for seq, logprobs in zip(
        tokenized.sequences, trainer.sequence_logprobs(tokenized.sequences), strict=True
    ):
        for sampled, mine in zip(seq.sampling_logprobs[1:], logprobs, strict=True):
            if sampled == sampled:  # NaN off the sampled tokens
                gaps.append(abs(sampled - mine))
    return torch.tensor(gaps)


async def test_a_qwen3_shaped_model_trains_publishes_reloads_and_resumes(
    client: Client,
    worker: WorkerProcess,
    queues: TaskQueues,
    engine: str,
    tiny_qwen3: Path,
    s3_settings: S3Settings,
    tmp_path: Path,
) -> None:
    spec = shape_spec(f"shape-{engine}-{uuid.uuid4().hex[:6]}", queues, tiny_qwen3, engine)
    final = await run_with_a_restart(client, spec)
    assert final.phase == "done" and final.step == STEPS and final.adapter == f"{spec.run_id}@{STEPS}", final
    assert [h.step for h in final.history] == [STEPS]  # step 1 was not redone after the restart
    store = ObjectStore(s3_settings)
    for step in range(STEPS + 1):
        assert store.exists(checkpoint_prefix(spec.run_id, step) + MANIFEST_NAME), f"no checkpoint {step}"
    trained_by = json.loads(store.get_bytes(checkpoint_prefix(spec.run_id, STEPS) + TRAINER_STATE_FILE))
    assert trained_by.get("world_size", 1) == (2 if engine == "cpu" else 1), trained_by

    # The rollouts carried the tool call, its result and two sampled turns each, offered the tool.
    groups = trajectory_store.table_to_groups(
        trajectory_store.download_table(store, trajectories_key(spec.run_id, STEPS)), "step 2"
    )
    trajectory = groups[0].trajectories[0]
    assert trajectory.tools and [m.get("role") for m in trajectory.messages()][:4] == [
        "system", "user", "assistant", "tool",
    ]  # fmt: skip
    assert len(trajectory.choices()) == 2 and '"price"' in str(trajectory.messages()[3]["content"])

    # The served adapter answers, through the model's own chat template.
    sdk = openai.AsyncOpenAI(base_url=worker.server_urls[0], api_key="unused", max_retries=2, timeout=120)
    served = f"{spec.run_id}@{STEPS}"
    reply = await sdk.chat.completions.create(
        model=served, messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert reply.model == served and reply.choices[0].finish_reason in ("stop", "length")

    ratios = [h.train_metrics["loss/mean_importance_ratio"] for h in final.history]
    gaps = trainer_gaps(store, spec, tmp_path)
    print(
        f"{engine}: tiny Qwen3 (random weights), step {STEPS}'s {gaps.numel()} sampled tokens: trainer vs server "
        f"mean |Δ logprob| {float(gaps.mean()):.2e}, max {float(gaps.max()):.2e}; mean importance ratio {ratios}"
    )
    assert gaps.numel() > 0 and float(gaps.max()) < MAX_LOGPROB_GAP
    assert all(abs(r - 1) < MAX_LOGPROB_GAP for r in ratios), ratios
