"""Trainer workers of one gang (``--gang``) in this process, each with a rank of its own, their rendezvous through the
real S3 (activities/gang/rendezvous.py): a step trains in one world of both ranks under FSDP whoever leads it, the
same adapter as one device (a fine-tuning step too); the world outlives a change of leader (no rank restarted); and a
member busy with a step of its own declines, so the leader trains alone instead of waiting (no two leaders wait on each other).

The faults of a gang over hosts (a member cut off, a host killed) are tests/cluster/test_cluster_faults.py's.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from activities import trajectory_store
from activities.advantages import compute_step_advantages
from activities.gang.activities import GangTrainerActivities
from activities.object_store import ObjectStore
from activities.training import TrainerActivities
from schemas import layout
from schemas.activities import InitialAdapterInput
from schemas.settings import GangSettings
from tests.activities.test_gang_training import (
    CONFIG,
    assert_same_fine_tuning,
    assert_same_step,
    spec,
    step_groups,
    train,
)


def test_gang_members_train_one_world_whoever_leads_and_a_busy_member_declines(
    object_store: ObjectStore, tmp_path: Path, tiny_qwen3: Path
) -> None:
    model = spec(tiny_qwen3)
    one = TrainerActivities(object_store, tmp_path / "one", "one")
    start = one.publish_initial_sync(InitialAdapterInput(run_id="one", model=model, seed=7))
    adv = compute_step_advantages(step_groups(one.trainer_for(model, "fp32"), seed=1), CONFIG)
    ref = trajectory_store.upload_groups(object_store, adv.groups, "data", 1, key=layout.advantages_key("data", 1),
                                         advantages=adv.advantages).ref  # fmt: skip
    want, _ = train(one, "one", model, ref, 1, start)

    settings = GangSettings(ranks=1, gang=f"g-{uuid.uuid4().hex[:6]}")
    a = GangTrainerActivities(object_store, tmp_path / "a", settings, "worker-a")
    b = GangTrainerActivities(object_store, tmp_path / "b", settings, "worker-b")
    try:
        assert a.coordinator.member is not None and b.coordinator.member is not None
        deadline = time.monotonic() + 30
        while not a.coordinator.member.others() or not b.coordinator.member.others():
            assert time.monotonic() < deadline, "the members never saw each other"
            time.sleep(0.2)
        start = a.publish_initial_sync(InitialAdapterInput(run_id="gang", model=model, seed=7))
        got, _ = train(a, "gang", model, ref, 1, start)
        assert a.world_size == 2 and a.last_roster is not None
        assert [m.worker_id for m in a.last_roster.members] == ["worker-a", "worker-b"]
        assert_same_step(got.staging_dir, want.staging_dir, got, want)
        ranks = {a.local.rank_pids(), b.local.rank_pids()}

        # b leads the same step (a retry elsewhere): the same world, its ranks not restarted, the same training.
        again, _ = train(b, "gang", model, ref, 1, start)
        assert b.world_size == 2 and not b.last_roster.fresh  # type: ignore[union-attr]
        assert {a.local.rank_pids(), b.local.rank_pids()} == ranks
        assert_same_step(again.staging_dir, want.staging_dir, again, want)
        # a fine-tuning step too: its batches go to the other host with its sequences
        assert_same_fine_tuning(object_store, model, one, b)
        assert b.world_size == 2

        # b busy with a step of its own (it holds its trainer's lock): it declines, and a trains alone at once.
        with b._lock:
            alone, _ = train(a, "gang", model, ref, 1, start)
        assert a.world_size == 1
        assert_same_step(alone.staging_dir, want.staging_dir, alone, want)
    finally:
        a.close()
        b.close()
