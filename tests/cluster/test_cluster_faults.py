"""The faults a cluster has, on the cluster of tests/cluster/netns.py (hosts that share nothing but Temporal and
S3), in ONE run of 3 steps x 2 groups x 4 rollouts, each group its own rollouts shard so both inference hosts
share a step:

1. step 1: the inference host running a shard is killed whole (every process, its directories gone) while the
   other carries on, and a fresh host of the same role replaces it (a rescheduled pod); then the trainer host,
   mid-train, likewise;
2. step 2: the inference host running a shard is partitioned from Temporal and S3 (struck once the shard's
   rollouts run) until the shard's retry has completed on the other host (at most 60 s), then healed: the
   partitioned attempt, cancelled on its host when its heartbeats failed, still uploads its shard once healed,
   as a zombie, after the retry's shard is recorded (when its rollouts had ended; cancelled while they ran, it
   writes nothing: the test says which it saw);
3. step 3: S3 (served at an address of its own) unreachable from the host running a shard while it still
   reaches Temporal, until that attempt gives up (a worker rides out an S3 outage inside an attempt first);
4. step 3: the trainer host partitioned mid-publish (its traffic slowed so a publish lasts), for 15 s; while it
   is cut off, every checkpoint that has a manifest already holds every file it lists.

Faults cost what the settings for them say, set short here so the test takes minutes, not ten: the run's
``heartbeat_timeout_s`` (10 s, the least a run may set) and the workers' ``DGRPO_STORE_OUTAGE_S`` (30 s, which
against an unreachable store rides out about a minute: longer than the partition, so the partitioned attempt's
upload is still retrying when the host is healed).

Then: the run completed; one checkpoint per step, every file sha256-verified against its manifest; every step's
trajectories with its 8 rows, none doubled; every object a completed activity recorded in the history still
what was recorded, once the partitioned host's late shard is stored; and the seconds from each fault to the
attempt that succeeded, printed. The machine's own namespace cannot reach the cluster: a client host runs
tests/cluster/observer.py, which the test asks.

The same cluster holds two more trainer hosts, ``gang-a`` and ``gang-b``: one gang (activities/gang/, ``dgrpo
worker trainer --gang``, one rank each, gloo between the hosts, replicated) on a trainer queue of their own. The
second test trains ONE run of 3 steps on them:

1. step 1: both train it, one world of 2 ranks (their rendezvous through S3);
2. step 2: the host that follows the step's leader is cut off mid-step until the step's retry completed: the
   leader's attempt fails (the member stopped beating; else a collective's timeout), and its retry trains with the
   host that remains, a world of 1;
3. step 3: the host leading the step is killed for good mid-step: Temporal retries the step on the other host,
   which trains it alone (a gang that loses a host continues on the others).

Then: the run completed; its checkpoints' world sizes are 2, 1, 1; each struck attempt failed within 30 s of its
fault, of the gang's loss or its heartbeat timeout; and every checkpoint is the step trained again on one device
from the checkpoint before it (nothing lost, nothing trained twice, whatever the world size).
"""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from fleet import HERE, PYTHON, REPO, image_cache, logs, start_stack, start_worker, wait_healthy
from netns import SUBNET, Cluster, ip, tc, wait_for

from schemas.settings import ENV_STORE_OUTAGE_S

pytestmark = pytest.mark.slow

STEPS, GROUPS, GROUP_SIZE = 3, 2, 4
ROLES = {"control": "control", "inference-a": "inference", "inference-b": "inference", "trainer": "trainer"}
INFERENCE = ["inference-a", "inference-b"]
HEARTBEAT_S = 10.0
"""The run's heartbeat timeout: a killed or cut-off host's activity is retried elsewhere this long after."""
STORE_OUTAGE_S = 30.0
"""The workers' ``DGRPO_STORE_OUTAGE_S``: how long a store request rides out a store it cannot reach (each retry
also waits its 3 s connect timeout there, so about a minute)."""
GANG = ["gang-a", "gang-b"]
"""Two more trainer hosts, of one gang, on a trainer queue of their own: the gang's run (the second test)."""
GANG_QUEUE = "dgrpo-gang"
GANG_FLAGS = ("--trainer-queue", GANG_QUEUE, "--gang", "cluster-gang", "--ranks", "1", "--shard", "replicate")
GANG_EPOCHS = 4
"""A gang's step trains for some seconds on two hosts sharing two cores: a fault struck 2 s in lands mid-step."""
FAILS_WITHIN_S = 30.0
PARTITION_S, PUBLISH_PARTITION_S = 60.0, 15.0
"""The rollouts partition's longest (it ends once the shard's retry completed), and the publish partition's:
each past the heartbeat timeout, so the attempt is timed out while its host is cut off."""


class Observer:
    """tests/cluster/observer.py on the client host, asked one JSON line at a time."""

    def __init__(self, c: Cluster, env: dict[str, str]) -> None:
        self.cluster, host = c, c["client"]
        with (host.root / "observer.log").open("ab") as err:
            self.proc = subprocess.Popen(
                host.inside([PYTHON, str(HERE / "observer.py")]), env={**host.env(), **env}, cwd=REPO,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, start_new_session=True,
            )  # fmt: skip
        host.processes.append(self.proc)
        self.answers: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self.read, daemon=True).start()

    def read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.answers.put(line.decode())

    def ask(self, op: str, wait_s: float = 2400.0, **args: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps({"op": op, **args}) + "\n").encode())
        self.proc.stdin.flush()
        try:
            answer: dict[str, Any] = json.loads(self.answers.get(timeout=wait_s))
        except queue.Empty:
            raise AssertionError(f"{op}: no answer in {wait_s:.0f} s\n{logs(self.cluster)}") from None
        if "error" in answer and len(answer) == 1:
            raise AssertionError(f"{op} {args}: {answer['error']}\n{logs(self.cluster)}")
        return answer


@dataclass
class Fault:
    """One fault as struck: what, on which host, when, and the activity attempt it hit."""

    kind: str
    host: str
    at: str
    activity: str
    run_id: str
    activity_id: str
    attempt: int


@pytest.fixture(scope="module")
def fleet() -> Iterator[tuple[Cluster, dict[str, str], Observer]]:
    with Cluster(["stack", *ROLES, *GANG, "client"], image_cache=image_cache()) as c:
        env = {
            **start_stack(c, s3_address=SUBNET.format(c.net, 200)),
            ENV_STORE_OUTAGE_S: str(STORE_OUTAGE_S),
        }
        for name, role in ROLES.items():
            start_worker(c[name], role, env)
        for name in GANG:
            start_worker(c[name], "trainer", env, GANG_FLAGS)
        for name, role in ROLES.items():
            wait_healthy(c[name], role, env)
        for name in GANG:
            wait_healthy(c[name], "trainer", env, GANG_QUEUE)
        yield c, env, Observer(c, env)


def s3_address(env: dict[str, str]) -> str:
    return env["DGRPO_S3_ENDPOINT"].rpartition(":")[0]


def later(seconds: float, action: Callable[[], object], pending: list[threading.Timer]) -> None:
    """``action`` in ``seconds``, while the run goes on (cancelled with the test if it has not run)."""
    timer = threading.Timer(seconds, action)
    pending.append(timer)
    timer.start()


def test_a_run_survives_hosts_killed_partitioned_cut_from_s3_and_a_partitioned_publish(
    fleet: tuple[Cluster, dict[str, str], Observer],
) -> None:
    c, env, observer = fleet
    run_id = f"faults-{uuid.uuid4().hex[:6]}"
    faults: list[Fault] = []
    timers: list[threading.Timer] = []

    def strike(kind: str, activity: str, hosts: list[str], action: Callable[[str], object], after_s: float = 0.3,
               logged: str = "") -> str:  # fmt: skip
        """``action`` on the host running ``activity`` (once its worker's log holds ``logged``, if given)."""
        hit = observer.ask("running", activity=activity, after_s=after_s, hosts=hosts)
        if logged:
            log = c[hit["host"]].root / "worker.log"
            wait_for(lambda: logged in log.read_text(errors="replace"), f"{logged!r} in {log}", timeout=120)
        at = datetime.now(UTC)
        action(hit["host"])
        faults.append(Fault(kind, hit["host"], at.isoformat(), activity, hit["run_id"], hit["activity_id"],
                            hit["attempt"]))  # fmt: skip
        return str(hit["host"])

    def replace(name: str) -> None:
        c.kill_host(name)
        start_worker(c[name], ROLES[name], env)  # a fresh host of the same role, as a rescheduled pod

    s3_route: list[str] = []

    def cut_s3(name: str) -> None:
        s3_route[:] = ["-n", c[name].netns, "route", "{}", "blackhole", f"{s3_address(env)}/32"]
        ip(*[a.replace("{}", "add") for a in s3_route])

    partitioned: list[str] = []

    def partition(seconds: float) -> Callable[[str], None]:
        def cut(name: str) -> None:
            c.partition(name)
            tc("-n", c[name].netns, "qdisc", "del", "dev", "eth0", "root", check=False)
            partitioned.append(name)
            later(seconds, lambda: c.heal(name), timers)

        return cut

    started = time.monotonic()
    try:
        observer.ask("start", run_id=run_id, steps=STEPS, groups=GROUPS, group_size=GROUP_SIZE,
                     heartbeat_timeout_s=HEARTBEAT_S)  # fmt: skip
        strike("host killed, replaced", "rollouts", INFERENCE, replace)
        strike("host killed, replaced", "train", ["trainer"], replace, after_s=1.0)
        observer.ask("phase", phase="rollouts", step=2)
        # Struck once the shard's rollouts run (its adapter loaded): the attempt then has a shard to upload
        # when it wakes.
        zombie = strike("host partitioned until the shard's retry completed", "rollouts", INFERENCE,
                        partition(PARTITION_S), logged=f"rollouts for {run_id} step 2 ")  # fmt: skip
        # Healed once the retry completed: the zombie's late upload comes after the shard the run recorded.
        observer.ask("completed", activity_id=faults[-1].activity_id, within_s=PARTITION_S)
        timers[-1].cancel()
        c.heal(zombie)
        observer.ask("phase", phase="rollouts", step=3)
        strike("S3 unreachable from one host", "rollouts", INFERENCE, cut_s3)
        # A worker rides out an S3 outage of STORE_OUTAGE_S inside one attempt: S3 stays cut until the attempt
        # gives up, so the shard must move to an attempt that can reach S3.
        observer.ask("retried", activity_id=faults[-1].activity_id, attempt=faults[-1].attempt)
        ip(*[a.replace("{}", "del") for a in s3_route])
        observer.ask("phase", phase="train", step=3)
        # A publish lasts about a second here: the trainer's uploads are slowed until the partition strikes.
        slow = ["tbf", "rate", "40mbit", "burst", "64kb", "latency", "400ms"]
        tc("-n", c["trainer"].netns, "qdisc", "add", "dev", "eth0", "root", *slow)
        # Struck once the checkpoint's first object is stored: the cut leaves a part-uploaded checkpoint.
        observer.ask("uploading", step=STEPS)
        strike(f"trainer partitioned {PUBLISH_PARTITION_S:.0f} s mid-publish", "publish", ["trainer"],
               partition(PUBLISH_PARTITION_S), after_s=0.0)  # fmt: skip
        # Cut off mid-upload, the publish has left no manifest naming a file that is not stored yet.
        observer.ask("manifested")
        final = observer.ask("final", timeout_s=1800.0)
        run_s = time.monotonic() - started
        assert final["phase"] == "done" and final["step"] == STEPS, (final, logs(c))
        # The partitioned host's attempt ends late, after the heal: only then is it known what it wrote (nothing,
        # when it was cancelled while its rollouts still ran).
        late = next(f for f in faults if f.host == zombie and f.kind.startswith("host partitioned"))
        zombie_wrote = observer.ask(
            "late_write",
            run_id=late.run_id,
            activity_id=late.activity_id,
            attempt=late.attempt,
            within_s=120.0,
        )["key"]
        report = observer.ask("verify", faults=[asdict(f) for f in faults], rows=GROUPS * GROUP_SIZE)
    finally:
        for timer in timers:
            timer.cancel()
    print(f"\nrun {run_id}: {run_s:.0f} s under {len(faults)} faults; the partitioned attempt's late shard: "
          f"{zombie_wrote or 'none (cancelled before its rollouts ended)'}")  # fmt: skip
    for fault, delay in zip(faults, report["delays"], strict=True):
        print(f"  {fault.kind} ({fault.host}, {fault.activity} attempt {fault.attempt}): "
              f"attempt that succeeded started {delay if delay is None else round(delay, 1)} s after")  # fmt: skip
    assert [h["step"] for h in final["history"]] == list(range(1, STEPS + 1))
    assert all(h["n_trajectories"] == GROUPS * GROUP_SIZE for h in final["history"]), final["history"]
    assert report["steps"] == [
        {"step": s, "rows": GROUPS * GROUP_SIZE, "distinct": GROUPS * GROUP_SIZE} for s in range(1, STEPS + 1)
    ], report["steps"]
    assert report["changed"] == [], f"late attempts overwrote what the run recorded: {report['changed']}"
    assert all(d is not None for d in report["delays"]), report["delays"]
    assert set(partitioned) == {zombie, "trainer"}


def test_two_hosts_train_as_one_gang_and_its_retries_train_with_the_hosts_that_remain(
    fleet: tuple[Cluster, dict[str, str], Observer],
) -> None:
    c, _, observer = fleet
    run_id = f"gang-{uuid.uuid4().hex[:6]}"
    faults: list[Fault] = []
    failed_after: list[float | None] = []

    def strike(kind: str, on_leader: bool, action: Callable[[str], object]) -> str:
        """``action`` on the host leading the training running now (``on_leader``), or on the other one."""
        hit = observer.ask("running", activity="train", after_s=2.0, hosts=GANG)
        leader = str(hit["host"])
        target = leader if on_leader else next(h for h in GANG if h != leader)
        at = datetime.now(UTC)
        action(target)
        faults.append(
            Fault(kind, target, at.isoformat(), "train", hit["run_id"], hit["activity_id"], hit["attempt"])
        )
        # the struck attempt failed (a later one is pending) or the training completed: when, after the fault
        later_attempt = observer.ask("retried", activity_id=hit["activity_id"], attempt=hit["attempt"])[
            "attempt"
        ]
        failed_after.append(None if later_attempt is None else (datetime.now(UTC) - at).total_seconds())
        return target

    observer.ask("start", run_id=run_id, steps=STEPS, groups=GROUPS, group_size=GROUP_SIZE,
                 heartbeat_timeout_s=HEARTBEAT_S, epochs=GANG_EPOCHS, trainer_queue=GANG_QUEUE)  # fmt: skip
    observer.ask("phase", phase="rollouts", step=2)
    observer.ask("phase", phase="train", step=2)
    cut = strike("the following host cut off mid-step", False, c.partition)
    # healed once the retry completed: the step's world is then the host that remained
    done = observer.ask("completed", activity_id=faults[-1].activity_id, within_s=300.0)
    c.heal(cut)
    assert done["completed"], logs(c)
    observer.ask("phase", phase="train", step=3)
    strike("the leading host killed for good mid-step", True, c.kill_host)
    final = observer.ask("final", timeout_s=900.0)
    assert final["phase"] == "done" and final["step"] == STEPS, (final, logs(c))
    report = observer.ask("verify", faults=[asdict(f) for f in faults], rows=GROUPS * GROUP_SIZE)
    trained_by = observer.ask("trained_by", steps=STEPS)
    retrained = observer.ask("retrain", steps=STEPS)
    succeeded = [observer.ask("succeeded", activity_id=f.activity_id) for f in faults]
    for fault, failed, delay, good in zip(faults, failed_after, report["delays"], succeeded, strict=True):
        print(f"  {fault.kind} ({fault.host}, train attempt {fault.attempt}): it failed {failed and round(failed, 1)} s "
              f"after, attempt {good['attempt']} succeeded, started {delay and round(delay, 1)} s after; the "
              f"failure before it: {good.get('failure_before', '')[:160]}")  # fmt: skip
    for step in retrained["steps"]:
        print(
            f"  step {step['step']} against one device trained from checkpoint {step['step'] - 1}: {step['distance']}"
        )
    assert trained_by["world_sizes"] == [2, 1, 1], (trained_by, logs(c))
    # Each struck attempt failed within the bound. Its retry may start later: a task Temporal handed to a poll
    # the cut-off host had open is lost with it until its heartbeat timeout, as for any worker cut off.
    assert all(f is not None and f < FAILS_WITHIN_S for f in failed_after), (failed_after, logs(c))
    assert all(d is not None for d in report["delays"]), report["delays"]
    # and the attempt before the one that succeeded failed of the gang's loss, or of its heartbeat timeout (lost)
    assert all(g["failure_before"].startswith(("GangLost", "TIMEOUT_TYPE_HEARTBEAT")) for g in succeeded), (
        succeeded
    )
    assert [h["step"] for h in final["history"]] == list(range(1, STEPS + 1))
    assert report["changed"] == [], f"late attempts overwrote what the run recorded: {report['changed']}"
    assert all(not step["problems"] for step in retrained["steps"]), retrained
