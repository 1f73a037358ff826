"""The client host's side of a fault test (tests/cluster/test_cluster_faults.py): the test, in the machine's own
namespace, cannot reach the cluster's Temporal or S3, so it asks this process, started on the client host, one
JSON line at a time on stdin; each answer is one JSON line on stdout ({"error": ...} when a request failed).

    {"op": "start", "run_id": R, "steps": N, "groups": G, "group_size": K,   start the TrainingRun (trainer
        "heartbeat_timeout_s": H, "epochs": E, "trainer_queue": Q}          queue Q, default the default one)
    {"op": "running", "activity": A, "after_s": S, "hosts": [H, ...]}       once A has run S s on one of the
        hosts: {"host", "run_id", "activity_id", "attempt"}
    {"op": "retried", "activity_id": A, "attempt": N}                      once attempt N of A failed or A completed
    {"op": "completed", "activity_id": A, "within_s": W}                   once A completed: {"completed": true};
        {"completed": false} if it has not in W s
    {"op": "late_write", "run_id": R, "activity_id": A, "attempt": N,       once that attempt's shard is stored:
        "within_s": W}                                                      {"key"}; {"key": null} if not in W s
    {"op": "phase", "phase": P, "step": N, "timeout_s": T}                  once the run is at P of step N
    {"op": "final", "timeout_s": T}                                        the run's final status
    {"op": "uploading", "step": N}                                         once checkpoint N's first object is
        stored: {"key"}
    {"op": "manifested"}                                                   the run's checkpoints that have a
        manifest, every file it lists sha256-verified (a missing or other file is an error)
    {"op": "verify", "faults": [...], "rows": R}                            what the run left, and each fault's
        seconds to the retry that succeeded
    {"op": "trained_by", "steps": N}                                       each checkpoint's world size (the
        ranks of the trainer gang that trained it; 1: a trainer alone)
    {"op": "succeeded", "activity_id": A}                                  the attempt of A that succeeded: {"attempt",
        "identity", "failure_before"} (the failure of the attempt before it)
    {"op": "retrain", "steps": N}                                          each step trained again here on one
        device from the checkpoint before it: how far each checkpoint is from it (tests/gang_checks.py)

    python tests/cluster/observer.py
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "chaos")]

from chaos_cluster import (  # noqa: E402
    Fault,
    MomentPassed,
    pending_activities,
    retry_delays,
    stored_steps,
    wait_for_phase,
)
from temporalio.api.enums.v1 import EventType, PendingActivityState, TimeoutType  # noqa: E402
from temporalio.client import Client, WorkflowHandle  # noqa: E402

from activities.checkpoints import TRAINER_STATE_FILE  # noqa: E402
from activities.object_store import ObjectStore  # noqa: E402
from dgrpo.client import run_control  # noqa: E402
from schemas.config import RunSpec, TaskQueues  # noqa: E402
from schemas.layout import checkpoint_prefix, rollout_shard_key  # noqa: E402
from schemas.run_state import RunStatus  # noqa: E402
from schemas.settings import S3Settings  # noqa: E402
from tests.gang_checks import retrained  # noqa: E402
from workers.temporal import connect_client, result_across_restarts  # noqa: E402


def manifested_steps(store: ObjectStore, run_id: str) -> list[int]:
    """The run's checkpoints that have a manifest, each downloaded with every file it lists sha256-verified
    (``ObjectStore.get_dir`` raises on a missing or other file): a manifest is written last, so one whose files
    are not all stored is a reader's trap."""
    steps: list[int] = []
    with tempfile.TemporaryDirectory(prefix="dgrpo-manifested-") as scratch:
        for step in store.checkpoint_steps(run_id):
            prefix = checkpoint_prefix(run_id, step)
            if store.is_complete(prefix):
                store.get_dir(prefix, Path(scratch) / str(step))
                steps.append(step)
    return steps


def host_of(identity: str) -> str:
    """The cluster host a worker identity (``pid@<host>-<netns>``, netns.py's hostnames) belongs to."""
    return identity.partition("@")[2].rsplit("-", 1)[0]


class Observer:
    def __init__(self, client: Client) -> None:
        self.client = client
        self.store = ObjectStore(S3Settings.from_env())
        self.handle: WorkflowHandle[Any, Any] | None = None
        self.result: asyncio.Future[RunStatus] | None = None
        self.spec: RunSpec | None = None

    async def start(
        self,
        run_id: str,
        steps: int,
        groups: int,
        group_size: int,
        heartbeat_timeout_s: float,
        epochs: int = 4,
        trainer_queue: str | None = None,
    ) -> dict[str, Any]:
        data = json.loads((REPO / "examples" / "run.json").read_text())
        data.update(run_id=run_id, steps=steps, groups_per_step=groups, group_size=group_size)
        data.update(heartbeat_timeout_s=heartbeat_timeout_s)
        # 4 epochs: a training lasts a few seconds, so a fault struck a second into it lands mid-training (one
        # epoch of this run trains in about half a second since the trainer writes its state beside the next step)
        data.update(
            groups_per_shard=1, metrics={"wandb": False}, train={"learning_rate": 2e-4, "epochs": epochs}
        )
        data["model"]["name"] = run_id
        if trainer_queue is not None:
            data["task_queues"] = TaskQueues(trainer=trainer_queue).model_dump()
        self.spec = RunSpec.model_validate(data)
        self.handle = await run_control.start_run(self.client, self.spec, self.store)
        self.result = asyncio.ensure_future(result_across_restarts(self.handle))
        return {"workflow_id": run_id}

    async def running(self, activity: str, after_s: float, hosts: list[str]) -> dict[str, Any]:
        """Once ``activity`` has run ``after_s`` seconds on one of ``hosts`` (the run ending first raises)."""
        assert self.handle is not None and self.result is not None
        while not self.result.done():
            run_id, pendings = await pending_activities(self.handle)
            for pending in pendings:
                host = host_of(pending.last_worker_identity)
                if (
                    pending.activity_type.name == activity
                    and pending.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
                    and host in hosts
                    and datetime.now(UTC) - pending.last_started_time.ToDatetime(tzinfo=UTC)
                    >= timedelta(seconds=after_s)
                ):
                    return {
                        "host": host,
                        "run_id": run_id,
                        "activity_id": pending.activity_id,
                        "attempt": pending.attempt,
                    }
            await asyncio.sleep(0.2)
        raise MomentPassed(f"the run ended before {activity} ran on one of {hosts}: {self.result.result()}")

    async def retried(self, activity_id: str, attempt: int) -> dict[str, Any]:
        """Once attempt ``attempt`` of ``activity_id`` has failed (a later attempt is pending) or it completed."""
        assert self.handle is not None and self.result is not None
        while not self.result.done():
            _, pendings = await pending_activities(self.handle)
            later = [p.attempt for p in pendings if p.activity_id == activity_id]
            if not later or later[0] > attempt:
                return {"attempt": later[0] if later else None}
            await asyncio.sleep(0.2)
        raise MomentPassed(
            f"the run ended before {activity_id} attempt {attempt} ended: {self.result.result()}"
        )

    async def completed(self, activity_id: str, within_s: float) -> dict[str, Any]:
        """Once ``activity_id`` is no longer pending (an attempt completed it), or ``within_s`` passed."""
        assert self.handle is not None and self.result is not None
        deadline = asyncio.get_running_loop().time() + within_s
        while asyncio.get_running_loop().time() < deadline and not self.result.done():
            _, pendings = await pending_activities(self.handle)
            if all(p.activity_id != activity_id for p in pendings):
                return {"completed": True}
            await asyncio.sleep(0.2)
        return {"completed": False}

    async def late_write(
        self, run_id: str, activity_id: str, attempt: int, within_s: float
    ) -> dict[str, Any]:
        """Once the rollouts shard of attempt ``attempt`` of ``activity_id`` is in the store: a partitioned
        attempt, cancelled on its host when its heartbeats failed, still finishes the upload it was in once
        healed. Its key is that attempt's own (schemas/layout.py), so only then is all it wrote there. An attempt
        cancelled while its rollouts still ran (a slow machine) has nothing to upload: ``{"key": None}`` once
        ``within_s`` passed without the key (asked long after the heal, when such an upload is done)."""
        assert self.handle is not None
        history = self.client.get_workflow_handle(self.handle.id, run_id=run_id)
        async for event in history.fetch_history_events():
            attrs = event.activity_task_scheduled_event_attributes
            if (
                event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
                and attrs.activity_id == activity_id
            ):
                shard = json.loads(attrs.input.payloads[0].data)
                break
        else:
            raise LookupError(f"no activity {activity_id} in run {run_id}")
        key = rollout_shard_key(self.handle.id, shard["step"], shard["shard"], attempt)
        deadline = asyncio.get_running_loop().time() + within_s
        while asyncio.get_running_loop().time() < deadline:
            if await asyncio.to_thread(self.store.exists, key):
                return {"key": key}
            await asyncio.sleep(0.5)
        return {"key": None}

    async def phase(self, phase: str, step: int, timeout_s: float = 1800.0) -> dict[str, Any]:
        assert self.handle is not None
        try:
            await wait_for_phase(self.handle, phase, step, timeout_s)
        except MomentPassed:
            return {"passed": True}
        return {"passed": False}

    async def final(self, timeout_s: float) -> dict[str, Any]:
        assert self.result is not None
        final = await asyncio.wait_for(asyncio.shield(self.result), timeout_s)
        return {
            "phase": final.phase,
            "step": final.step,
            "error": final.error,
            "history": [h.model_dump(mode="json", include={"step", "n_trajectories", "n_exceptions"})
                        for h in final.history],
        }  # fmt: skip

    async def uploading(self, step: int) -> dict[str, Any]:
        """Once the first object of checkpoint ``step`` is stored: its publish is under way, part uploaded."""
        assert self.handle is not None and self.result is not None
        prefix = checkpoint_prefix(self.handle.id, step)
        while not self.result.done():
            if keys := await asyncio.to_thread(self.store.list, prefix):
                return {"key": keys[0]}
            await asyncio.sleep(0.1)
        raise MomentPassed(f"the run ended before checkpoint {step} was uploaded: {self.result.result()}")

    async def manifested(self) -> dict[str, Any]:
        """Asked while a publish is cut off mid-upload: every checkpoint with a manifest is whole already."""
        assert self.handle is not None
        return {"steps": await asyncio.to_thread(manifested_steps, self.store, self.handle.id)}

    async def verify(self, faults: list[dict[str, Any]], rows: int) -> dict[str, Any]:
        """Each fault's seconds to the attempt that succeeded; every step's checkpoint downloaded with each file
        sha256-verified against its manifest; every step's rows, distinct (group, rollout) pairs among them;
        and every object a completed activity recorded in the history (its sha256) as the store holds it now."""
        assert self.handle is not None
        recorded = [Fault(f["kind"], f["host"], datetime.fromisoformat(f["at"]), f["activity"], f["run_id"],
                          f["activity_id"], f["attempt"]) for f in faults]  # fmt: skip
        delays = await retry_delays(self.client, self.handle.id, recorded)
        steps = len((await self.final(60))["history"])
        return {
            "delays": [delays.get(i) for i in range(len(recorded))],
            "steps": await asyncio.to_thread(stored_steps, self.store, self.handle.id, steps),
            "changed": await self.changed_since_recorded(),
        }

    async def trained_by(self, steps: int) -> dict[str, Any]:
        """Each checkpoint's world size, as its trainer state says (1: a trainer alone, which does not say)."""
        assert self.handle is not None
        states = [
            json.loads(
                await asyncio.to_thread(
                    self.store.get_bytes, checkpoint_prefix(self.handle.id, step) + TRAINER_STATE_FILE
                )
            )
            for step in range(1, steps + 1)
        ]
        return {"world_sizes": [state.get("world_size", 1) for state in states]}

    async def succeeded(self, activity_id: str) -> dict[str, Any]:
        """The attempt of ``activity_id`` that succeeded (in any run of the chain), and the failure before it."""
        assert self.handle is not None
        async for execution in self.client.list_workflows(f"WorkflowId = '{self.handle.id}'"):
            scheduled: dict[int, str] = {}
            history = self.client.get_workflow_handle(self.handle.id, run_id=execution.run_id)
            async for event in history.fetch_history_events():
                if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                    scheduled[event.event_id] = event.activity_task_scheduled_event_attributes.activity_id
                elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                    attrs = event.activity_task_started_event_attributes
                    if scheduled.get(attrs.scheduled_event_id) == activity_id:
                        failure = attrs.last_failure
                        kind = ""
                        if failure.HasField("application_failure_info"):
                            kind = failure.application_failure_info.type
                        elif failure.HasField("timeout_failure_info"):
                            kind = TimeoutType.Name(failure.timeout_failure_info.timeout_type)
                        before = f"{kind}: {failure.message}"
                        return {
                            "attempt": attrs.attempt,
                            "identity": attrs.identity,
                            "failure_before": before,
                        }
        return {"attempt": None}

    async def retrain(self, steps: int) -> dict[str, Any]:
        """Each step trained again here on one device from the run's checkpoint before it: how far each checkpoint
        of the run is from it (tests/gang_checks.py)."""
        assert self.spec is not None
        distances = await asyncio.to_thread(retrained, self.store, self.spec, steps)
        return {
            "steps": [
                {"step": i + 1, "problems": d.problems, "distance": str(d)} for i, d in enumerate(distances)
            ]
        }

    async def changed_since_recorded(self) -> list[str]:
        """Objects and checkpoints that completed activities recorded (in every run of the chain) whose content
        is no longer what was recorded: what a late attempt overwrote."""
        assert self.handle is not None
        changed: list[str] = []
        async for execution in self.client.list_workflows(f"WorkflowId = '{self.handle.id}'"):
            history = self.client.get_workflow_handle(self.handle.id, run_id=execution.run_id)
            async for event in history.fetch_history_events():
                if event.event_type != EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
                    continue
                for payload in event.activity_task_completed_event_attributes.result.payloads:
                    try:
                        found = json.loads(payload.data)
                    except ValueError:
                        continue
                    changed += self.check_refs(found)
        return changed

    def check_refs(self, value: object) -> list[str]:
        """The refs in ``value`` (a decoded activity result) whose object or manifest changed."""
        if isinstance(value, list):
            return [uri for item in value for uri in self.check_refs(item)]
        if not isinstance(value, dict):
            return []
        uri = value.get("uri")
        if isinstance(uri, str) and uri.startswith("s3://"):
            if "manifest_sha256" in value:
                _, sha = self.store.read_manifest(self.store.key(uri))
                return [] if sha == value["manifest_sha256"] else [uri]
            if "sha256" in value:
                sha = hashlib.sha256(self.store.get_bytes(self.store.key(uri))).hexdigest()
                return [] if sha == value["sha256"] else [uri]
        return [uri for item in value.values() for uri in self.check_refs(item)]


async def main() -> None:
    observer = Observer(await connect_client(wait_s=120))
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        request = json.loads(line)
        ops = {"start": observer.start, "running": observer.running, "phase": observer.phase,
               "retried": observer.retried, "completed": observer.completed,
               "uploading": observer.uploading, "manifested": observer.manifested,
               "late_write": observer.late_write, "final": observer.final, "verify": observer.verify,
               "trained_by": observer.trained_by, "retrain": observer.retrain,
               "succeeded": observer.succeeded}  # fmt: skip
        try:
            answer = await ops[request.pop("op")](**request)
        except Exception as err:  # the test shows it, with the hosts' logs
            answer = {"error": f"{type(err).__name__}: {err}"}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
