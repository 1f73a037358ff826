"""Checkpoint retention against the real S3 store: the newest N, the best by a metric and the protected
(served) step stay; the rest go, manifest and files; the ART-style client's rule is the same code."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError
from temporalio.testing import ActivityEnvironment

from activities.metrics import record_step
from activities.object_store import ObjectStore
from activities.retention import RetentionActivities, complete_checkpoint_steps
from schemas import layout
from schemas.activities import RetentionInput
from schemas.config import CheckpointsSpec

RUN = "keep-1"


def publish_steps(store: ObjectStore, tmp_path: Path, rewards: dict[int, float]) -> None:
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_model.safetensors").write_bytes(b"weights")
    for step, reward in rewards.items():
        store.publish_checkpoint(adapter, RUN, step)
        record_step(store, RUN, "agent", step, {"train/reward": reward})


async def test_retention_keeps_newest_best_and_served_and_deletes_the_rest(
    object_store: ObjectStore, tmp_path: Path
) -> None:
    publish_steps(object_store, tmp_path, {0: 0.1, 1: 0.2, 2: 0.9, 3: 0.3, 4: 0.4, 5: 0.5})
    retain = RetentionActivities(object_store).retain_checkpoints
    inp = RetentionInput(run_id=RUN, keep_last=2, keep_best_metric="train/reward", protect=[1])
    deleted = await ActivityEnvironment().run(retain, inp)
    assert deleted == [0, 3]
    assert complete_checkpoint_steps(object_store, RUN) == [1, 2, 4, 5]
    for step in deleted:  # nothing left of them, the manifest included
        assert object_store.list(layout.checkpoint_prefix(RUN, step)) == []
    assert object_store.is_complete(layout.checkpoint_prefix(RUN, 2))  # the best by train/reward
    # Idempotent: a retried activity finds nothing more to delete.
    assert await ActivityEnvironment().run(retain, inp) == []
    # Without a metric only the newest and the protected stay; and every step from keep_from on.
    inp = RetentionInput(run_id=RUN, keep_last=1, protect=[4], keep_from=2)
    assert await ActivityEnvironment().run(retain, inp) == [1]
    inp = RetentionInput(run_id=RUN, keep_last=1, protect=[4])
    assert await ActivityEnvironment().run(retain, inp) == [2]
    assert complete_checkpoint_steps(object_store, RUN) == [4, 5]


def test_checkpoints_setting_is_bounded_and_says_what_to_fix() -> None:
    assert CheckpointsSpec().keep_last is None  # the default keeps every checkpoint
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        CheckpointsSpec(keep_last=0)
    with pytest.raises(ValidationError, match="set keep_last too"):
        CheckpointsSpec(keep_best_metric="val/reward")
    with pytest.raises(ValidationError, match="should match pattern"):
        CheckpointsSpec(keep_last=2, keep_best_metric="val reward; drop")
