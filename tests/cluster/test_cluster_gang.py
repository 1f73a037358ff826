"""A trainer gang over two hosts (activities/gang/), on the cluster of tests/cluster/netns.py: hosts that share
nothing but Temporal and S3, two of them trainer workers of one gang (``dgrpo worker trainer --gang``, one rank
each, gloo between the hosts), in ONE run of 3 steps:

1. step 1: both trainer hosts train it, one world of 2 ranks (the rendezvous through S3);
2. step 2: the host that follows the step's leader is cut off mid-step, until the step's retry completed: the
   leader's attempt fails (the member stopped beating; or a collective's timeout), and its retry trains with the
   host that remains, a world of 1;
3. step 3: the host leading the step is killed for good mid-step (every process, its directories gone): Temporal
   retries the step on the other host, which trains it alone.

Then: the run completed; the checkpoints' world sizes are 2, 1, 1; each fault's step started the attempt that
succeeded within 30 s; and every checkpoint is the step trained again on one device from the checkpoint before it
(nothing lost, nothing trained twice; the world size changes between steps and the training does not).

The faults cost what the run's heartbeat timeout (10 s) and the gang's own bounds (a member silent for 8 s is gone,
every collective fails after 20 s) say.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import asdict
from datetime import UTC, datetime

import pytest
from fleet import image_cache, logs, start_stack, start_worker, wait_healthy
from netns import Cluster
from test_cluster_faults import Fault, Observer

pytestmark = pytest.mark.slow

STEPS, GROUPS, GROUP_SIZE = 3, 2, 4
EPOCHS = 4
"""A step trains for some seconds on two hosts sharing two cores, so a fault struck two seconds in lands mid-step."""
HEARTBEAT_S = 10.0
ROLES = {"control": "control", "inference": "inference", "trainer-a": "trainer", "trainer-b": "trainer"}
TRAINERS = ["trainer-a", "trainer-b"]
GANG_FLAGS = ("--gang", "cluster-gang", "--ranks", "1", "--shard", "replicate")
FAILS_WITHIN_S = 30.0


@pytest.fixture(scope="module")
def gang() -> Iterator[tuple[Cluster, dict[str, str], Observer]]:
    with Cluster(["stack", *ROLES, "client"], image_cache=image_cache()) as c:
        env = start_stack(c)
        for name, role in ROLES.items():
            start_worker(c[name], role, env, GANG_FLAGS if role == "trainer" else ())
        for name, role in ROLES.items():
            wait_healthy(c[name], role, env)
        yield c, env, Observer(c, env)


def test_two_hosts_train_as_one_gang_and_its_retries_train_with_the_hosts_that_remain(
    gang: tuple[Cluster, dict[str, str], Observer],
) -> None:
    c, _, observer = gang
    run_id = f"gang-{uuid.uuid4().hex[:6]}"
    faults: list[Fault] = []

    def strike(kind: str, action_on_other: bool, action: object) -> str:
        """``action`` on the leader of the train activity running now, or on the other trainer host."""
        hit = observer.ask("running", activity="train", after_s=2.0, hosts=TRAINERS)
        leader = str(hit["host"])
        target = next(h for h in TRAINERS if h != leader) if action_on_other else leader
        at = datetime.now(UTC)
        action(target)  # type: ignore[operator]
        faults.append(
            Fault(kind, target, at.isoformat(), "train", hit["run_id"], hit["activity_id"], hit["attempt"])
        )
        return target

    observer.ask("start", run_id=run_id, steps=STEPS, groups=GROUPS, group_size=GROUP_SIZE,
                 heartbeat_timeout_s=HEARTBEAT_S, epochs=EPOCHS)  # fmt: skip
    observer.ask("phase", phase="rollouts", step=2)
    observer.ask("phase", phase="train", step=2)
    cut = strike("the following host cut off mid-step", True, c.partition)
    # healed once the retry completed: the step's world is then the host that remained
    done = observer.ask("completed", activity_id=faults[-1].activity_id, within_s=300.0)
    c.heal(cut)
    assert done["completed"], logs(c)
    observer.ask("phase", phase="train", step=3)
    strike("the leading host killed for good mid-step", False, c.kill_host)
    final = observer.ask("final", timeout_s=900.0)
    assert final["phase"] == "done" and final["step"] == STEPS, (final, logs(c))
    report = observer.ask("verify", faults=[asdict(f) for f in faults], rows=GROUPS * GROUP_SIZE)
    trained_by = observer.ask("trained_by", steps=STEPS)
    retrained = observer.ask("retrain", steps=STEPS)
    for fault, delay in zip(faults, report["delays"], strict=True):
        print(f"  {fault.kind} ({fault.host}, train attempt {fault.attempt}): the attempt that succeeded started "
              f"{delay if delay is None else round(delay, 1)} s after")  # fmt: skip
    for step in retrained["steps"]:
        print(
            f"  step {step['step']} against one device trained from checkpoint {step['step'] - 1}: {step['distance']}"
        )
    assert trained_by["world_sizes"] == [2, 1, 1], (trained_by, logs(c))
    assert all(d is not None and d < FAILS_WITHIN_S for d in report["delays"]), report["delays"]
    assert [h["step"] for h in final["history"]] == list(range(1, STEPS + 1))
    assert report["changed"] == [], f"late attempts overwrote what the run recorded: {report['changed']}"
    assert all(not step["problems"] for step in retrained["steps"]), retrained
