"""Run identity is injective (real Temporal, real S3, real `dgrpo worker all` with SmolLM2): two ART models
whose project and name join to the same text train their own steps, and `model.train` attaches only to a
`TrainStep` that trains this very model with these settings."""

from __future__ import annotations

import asyncio
import uuid

import pytest

import dgrpo
from activities.trajectory_store import download_groups
from dgrpo.errors import ModelConflictError
from schemas.config import LoraConfig, TaskQueues, TrainConfig
from schemas.layout import model_key, trajectories_key
from schemas.refs import ObjectRef, TrajectoriesRef
from schemas.run_state import TrainStepInput
from schemas.trajectory import Choice, Trajectory, TrajectoryGroup
from workers.launcher import WorkerProcess
from workers.stack import EmbeddedStack

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def queues(shared_queues: TaskQueues) -> TaskQueues:
    return shared_queues


@pytest.fixture(scope="module")
def workers(shared_worker: WorkerProcess) -> WorkerProcess:
    """The session's ``dgrpo worker all`` (tests/conftest.py)."""
    return shared_worker


def backend(stack: EmbeddedStack, workers: WorkerProcess, queues: TaskQueues) -> dgrpo.TemporalBackend:
    return dgrpo.TemporalBackend(
        address=stack.temporal_address,
        inference_url=workers.server_urls[0],
        s3=stack.s3_settings,
        task_queues=queues,
    )


def groups(label: str) -> list[TrajectoryGroup]:
    """One trainable group (two sampled answers, rewards 0 and 1) labelled with its owner."""

    def answer(tokens: list[int], reward: float) -> Trajectory:
        choice = Choice(
            message={"role": "assistant", "content": "x"}, token_ids=tokens, prompt_token_ids=[1, 504, 2]
        )
        return Trajectory(messages_and_choices=[{"role": "user", "content": "q"}, choice], reward=reward)

    return [TrajectoryGroup([answer([100, 101], 0.0), answer([200, 201], 1.0)], metadata={"owner": label})]


async def test_two_models_whose_names_join_alike_train_their_own_steps(
    stack: EmbeddedStack, workers: WorkerProcess, queues: TaskQueues
) -> None:
    """The issue's pair: ``rl``/``math-agent`` and ``rl-math``/``agent`` shared one run id, so the second
    model's ``train`` attached to the first's ``TrainStep`` and its groups were never uploaded."""
    tag = uuid.uuid4().hex[:6]
    first = dgrpo.TrainableModel(name=f"math-agent{tag}", project="rl", lora=LoraConfig(rank=4, alpha=8))
    second = dgrpo.TrainableModel(name=f"agent{tag}", project="rl-math", lora=LoraConfig(rank=4, alpha=8))
    assert first.run_id != second.run_id
    b = backend(stack, workers, queues)
    await first.register(b)
    await second.register(b)
    store = b.object_store()
    assert store.exists(model_key(first.run_id)) and store.exists(model_key(second.run_id))

    config = TrainConfig(learning_rate=1e-4)
    one = await asyncio.wait_for(first.train(groups("first"), config=config), 600)
    two = await asyncio.wait_for(second.train(groups("second"), config=config), 600)
    assert one is not None and two is not None
    assert (one.checkpoint.run_id, two.checkpoint.run_id) == (first.run_id, second.run_id)
    for model, owner in ((first, "first"), (second, "second")):
        (stored,) = download_groups(store, trajectories_key(model.run_id, 1))
        assert stored.metadata["owner"] == owner  # each model's own groups were uploaded and trained


async def test_train_refuses_to_attach_to_another_models_step(
    stack: EmbeddedStack, workers: WorkerProcess, queues: TaskQueues
) -> None:
    """A ``TrainStep`` already running under this model's workflow id for another model (or another LoRA
    shape) is refused, naming what differs, instead of being waited on and taken as this model's step."""
    tag = uuid.uuid4().hex[:6]
    model = dgrpo.TrainableModel(name=f"solo{tag}", project="rl", lora=LoraConfig(rank=4, alpha=8))
    b = backend(stack, workers, queues)
    await model.register(b)
    other = model.spec.model_copy(update={"name": f"other{tag}", "lora": LoraConfig(rank=8, alpha=16)})
    ref = ObjectRef(uri=f"s3://{b.object_store().bucket}/runs/x/t.parquet", size=0, sha256="0" * 64)
    started = TrainStepInput(
        run_id=model.run_id,
        model=other,
        trajectories=TrajectoriesRef(ref=ref, run_id=model.run_id, step=1, n_groups=1, n_trajectories=2),
        step=1,
    )
    client = await b.temporal_client()
    # On a queue no worker polls, so it stays running: the step another client is in the middle of.
    handle = await client.start_workflow(
        "TrainStep", started, id=model.train_workflow_id(1), task_queue=f"nobody-{tag}"
    )
    try:
        with pytest.raises(ModelConflictError) as err:
            await asyncio.wait_for(model.train(groups("mine"), config=TrainConfig()), 120)
        message = str(err.value)
        assert "model.name=" in message and "model.lora=" in message and "rank': 8" in message, message
        assert not b.object_store().exists(trajectories_key(model.run_id, 1))  # nothing was uploaded
    finally:
        await handle.terminate("test done")
