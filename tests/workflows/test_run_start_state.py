"""A start that fails leaves stored state untouched, and a run resumes only from a checkpoint of its own model
(the real `dgrpo` CLI, real Temporal, real S3, the real SmolLM2 trainer)."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from activities import trajectory_store
from activities.object_store import ObjectStore
from activities.training import TrainerActivities
from schemas import layout
from schemas.activities import InitialAdapterInput, TrainInput
from schemas.config import LoraConfig, ModelSpec, TrainConfig
from schemas.errors import CheckpointMismatchError
from schemas.trajectory import Choice, Trajectory, TrajectoryGroup

DGRPO = str(Path(sys.executable).parent / "dgrpo")
TRAINED = ModelSpec(name="agent-001", base_model="smollm2-135m-instruct", lora=LoraConfig(rank=8, alpha=16))


async def dgrpo(*args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        DGRPO, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode()


def spec_data(run_id: str, queue: str, model: ModelSpec) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "model": model.model_dump(mode="json"),
        "task": {"rollout": "examples.arithmetic:rollout", "scenarios": "examples.arithmetic:scenarios"},
        "steps": 3,
        "groups_per_step": 2,
        "group_size": 4,
        "metrics": {"wandb": False},
        "task_queues": {"control": queue, "inference": queue, "trainer": queue},
    }


async def workflow_exists(client: Client, workflow_id: str) -> bool:
    try:
        await client.get_workflow_handle(workflow_id).describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return False
        raise
    return True


async def test_train_with_a_running_run_id_leaves_its_stored_spec_alone(
    client: Client, tmp_path: Path
) -> None:
    run_id = f"start-{uuid.uuid4().hex[:8]}"
    queue = f"nobody-{run_id}"  # no worker polls it: the first start stays running
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    first.write_text(json.dumps(spec_data(run_id, queue, TRAINED)))
    other = TRAINED.model_copy(update={"lora": LoraConfig(rank=4, alpha=8)})
    second.write_text(json.dumps(spec_data(run_id, queue, other)))
    store = ObjectStore.from_env()
    try:
        code, out = await dgrpo("train", str(first), "--no-wait")
        assert code == 0 and "started run" in out, out
        stored = store.get_bytes(layout.spec_key(run_id))
        code, out = await dgrpo("train", str(second), "--no-wait")
        assert store.get_bytes(layout.spec_key(run_id)) == stored, out  # resume still finds the running spec
        assert code == 2 and f"run {run_id!r} is already running; its stored spec is unchanged" in out, out
    finally:
        await client.get_workflow_handle(run_id).terminate("test done")


def trainable_groups() -> list[TrajectoryGroup]:
    def answer(tokens: list[int], reward: float) -> Trajectory:
        choice = Choice(
            message={"role": "assistant", "content": "x"}, token_ids=tokens, prompt_token_ids=[1, 2]
        )
        return Trajectory(messages_and_choices=[{"role": "user", "content": "q"}, choice], reward=reward)

    return [TrajectoryGroup([answer([100, 101], 0.0), answer([200, 201], 1.0)])]


async def test_resume_refuses_a_checkpoint_of_another_lora_shape_or_base_model(
    client: Client, tmp_path: Path
) -> None:
    """The issue's sequence: a run's checkpoints were trained with one model, its stored spec now says another
    (a failed start of an older version overwrote it). `dgrpo resume` refuses, naming what differs, and starts
    nothing; a trainer given that checkpoint for the other model refuses it too (non-retryably)."""
    run_id = f"resume-{uuid.uuid4().hex[:8]}"
    store = ObjectStore.from_env()
    store.ensure_bucket()
    acts = TrainerActivities(store, tmp_path / "trainer", "worker-resume")
    checkpoint = await asyncio.to_thread(
        acts.publish_initial_sync, InitialAdapterInput(run_id=run_id, model=TRAINED, seed=0)
    )
    other = TRAINED.model_copy(update={"base_model": "some-org/other-model", "lora": LoraConfig(rank=4)})
    spec = spec_data(run_id, f"nobody-{run_id}", other)
    store.put_bytes(layout.spec_key(run_id), json.dumps(spec).encode())
    try:
        code, out = await dgrpo("resume", run_id)
        assert code == 2, out
        for words in (
            f"checkpoint {checkpoint.uri} (step 0 of run {run_id}) was trained with",
            "base_model 'smollm2-135m-instruct' (the spec says 'some-org/other-model')",
            "'rank': 8",
            "'rank': 4",
            "another run_id",
        ):
            assert words in out, (words, out)
        assert not await workflow_exists(client, run_id)  # nothing was started
    finally:
        if await workflow_exists(client, run_id):
            await client.get_workflow_handle(run_id).terminate("test done")

    smaller = TRAINED.model_copy(update={"lora": LoraConfig(rank=4, alpha=8)})
    ref = trajectory_store.upload_groups(
        store, trainable_groups(), run_id, 1, key=layout.advantages_key(run_id, 1), advantages=[[-1.0, 1.0]]
    ).ref
    inp = TrainInput(
        run_id=run_id, step=1, model=smaller, advantages=ref, train=TrainConfig(), start_from=checkpoint
    )
    with pytest.raises(
        CheckpointMismatchError, match=r"was trained with lora .*'rank': 8.* \(the spec says"
    ) as err:
        await asyncio.to_thread(acts.train_sync, inp, 1)
    assert not err.value.retryable
    assert not store.exists(layout.checkpoint_prefix(run_id, 1) + layout.MANIFEST_NAME)
