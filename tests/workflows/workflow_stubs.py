"""Scripted stand-ins for the activities at the workflow's seams (the real ones fill them in other tests).

Each stub records what it was asked, keeps published checkpoints in memory (so a restarted run finds
them, like the object store), and can be told to fail, block or be slow at a given step.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import defaultdict
from dataclasses import dataclass, field

from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from schemas.activities import (
    ActivityName,
    AdvantagesInput,
    AdvantagesResult,
    CheckpointLookup,
    InitialAdapterInput,
    JudgeInput,
    MergeRolloutsInput,
    MetricsInput,
    PublishInput,
    ReloadInput,
    ReloadResult,
    RepublishInput,
    RetentionInput,
    RolloutsInput,
    RunTexts,
    ServingControlInput,
    StoreRunTextsInput,
    StoreScenariosInput,
    TrainInput,
    TrainResult,
)
from schemas.errors import STAGED_STATE_LOST
from schemas.layout import adapter_name, run_text_key, scenarios_key, worker_task_queue
from schemas.refs import AdapterRef, CheckpointRef, ObjectRef, TrajectoriesRef
from workers.worker import INTERCEPTORS
from workflows.train_step import TrainStep
from workflows.training_run import TrainingRun

WORKER_ID = "stub-trainer"


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class Failure:
    message: str
    type: str
    non_retryable: bool = False


@dataclass
class ScriptedActivities:
    """Every activity a ``TrainingRun`` calls, scripted."""

    calls: list[tuple[str, int]] = field(default_factory=list)
    rollout_policies: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    checkpoints: dict[str, dict[int, CheckpointRef]] = field(default_factory=lambda: defaultdict(dict))
    published: list[tuple[str, int]] = field(default_factory=list)
    metrics: list[MetricsInput] = field(default_factory=list)
    retained: list[RetentionInput] = field(default_factory=list)
    rollout_failure: Failure | None = None
    train_failure: Failure | None = None
    train_gates: dict[int, asyncio.Event] = field(default_factory=dict)
    """Training step n waits for ``train_gates[n]`` when present."""
    train_entry_gates: dict[int, asyncio.Event] = field(default_factory=dict)
    """Training step n waits for ``train_entry_gates[n]`` before it looks at what it continues from."""
    train_started: dict[int, asyncio.Event] = field(default_factory=lambda: defaultdict(asyncio.Event))
    metrics_gates: dict[int, asyncio.Event] = field(default_factory=dict)
    """Step n's metrics wait for ``metrics_gates[n]`` when present."""
    no_signal: dict[int, int] = field(default_factory=dict)
    """Step -> how many of its advantage computations find every group's rewards equal."""
    rollout_seeds: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    rollout_shards: dict[int, list[tuple[int, int, int, int]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    """Step -> (shard, shards, scenario_offset, groups) of each rollouts call."""
    rollout_inputs: dict[int, list[RolloutsInput]] = field(default_factory=lambda: defaultdict(list))
    """Step -> the input of each rollouts call, as the activity received it."""
    merges: dict[int, list[list[int]]] = field(default_factory=lambda: defaultdict(list))
    """Step -> the shard numbers (read from each ref's URI) of each merge, in the order given."""
    lost_workers: int = 0
    """The first ``lost_workers`` trainings report a worker that no longer polls (publish never starts)."""
    advantages_inputs: dict[int, list[AdvantagesInput]] = field(default_factory=lambda: defaultdict(list))
    """Step -> the input of each advantages computation (the rollouts a training of it trains on)."""
    train_inputs: dict[int, list[TrainInput]] = field(default_factory=lambda: defaultdict(list))
    """Step -> the input of each training of it that started."""
    staged: dict[tuple[str, int], str] = field(default_factory=dict)
    """(run, step) -> the staging the trainer holds of it (what ``continue_from`` must name)."""
    publish_gates: dict[int, asyncio.Event] = field(default_factory=dict)
    """Publishing step n waits for ``publish_gates[n]`` when present."""
    reload_gates: dict[int, asyncio.Event] = field(default_factory=dict)
    """Reloading checkpoint n waits for ``reload_gates[n]`` when present."""
    reload_started: dict[int, asyncio.Event] = field(default_factory=lambda: defaultdict(asyncio.Event))
    publish_failures: dict[int, list[Failure]] = field(default_factory=dict)
    """Step -> failures its next publish attempts raise, one each."""
    reload_failures: dict[int, list[Failure]] = field(default_factory=dict)
    """Step -> failures its next reload attempts raise, one each."""
    rollout_seconds: float = 0.0
    train_seconds: float = 0.0
    rollout_gate: asyncio.Event | None = None
    """When present, every rollouts call waits for it once it has recorded its input."""
    rollout_gates: dict[int, asyncio.Event] = field(default_factory=dict)
    """Step n's rollouts wait for ``rollout_gates[n]`` when present."""
    adapters: dict[tuple[str, int], str] = field(default_factory=dict)
    """(run, step) -> the adapter_sha256 of its adapter as last published (servable or whole)."""
    checkpoint_adapters: dict[str, str] = field(default_factory=dict)
    """A published checkpoint's manifest sha256 -> its adapter's."""
    trained_from: dict[tuple[str, str], str] = field(default_factory=dict)
    """(run, staged id) -> the adapter_sha256 that training started from."""
    lineage: dict[tuple[str, int], str | None] = field(default_factory=dict)
    """(run, step) -> the adapter its resumable checkpoint was trained from, as last published."""
    served: dict[tuple[str, int], str] = field(default_factory=dict)
    """(run, step) -> the adapter_sha256 the servers hold under ``<run>@<step>``."""
    reloaded: list[tuple[int, str | None]] = field(default_factory=list)
    """(step, adapter_sha256) of each reload, in order."""
    lost_after_adapter: set[int] = field(default_factory=set)
    """Steps whose trainer is started again without its disk when the rest of their checkpoint is to be written
    (their adapter is up): what it staged is gone, so publishing it, or continuing from it, fails with
    ``StagedStateLost``."""
    lost_stagings: set[str] = field(default_factory=set)
    same_adapter_when_trained_again: bool = False
    """A step trained again comes out bit for bit the same adapter (else another: its sha256 differs)."""
    publish_adapter_gates: dict[int, asyncio.Event] = field(default_factory=dict)
    """Publishing step n's adapter waits for ``publish_adapter_gates[n]`` when present."""

    def names(self, name: str) -> list[int]:
        """Steps that activity ``name`` was called for, in order."""
        return [step for n, step in self.calls if n == name]

    def _checkpoint(self, run_id: str, step: int, staged_id: str = "initial") -> CheckpointRef:
        adapter = self._adapter(run_id, step, staged_id)
        ref = CheckpointRef(
            run_id=run_id,
            step=step,
            uri=f"s3://stub/runs/{run_id}/checkpoints/{step:06d}/",
            manifest_sha256=_sha(f"{run_id}/{step}/{adapter.adapter_sha256}"),
        )
        self.checkpoints[run_id][step] = ref
        self.checkpoint_adapters[ref.manifest_sha256] = adapter.adapter_sha256
        self.lineage[(run_id, step)] = self.trained_from.get((run_id, staged_id))
        self.published.append((run_id, step))
        return ref

    def _adapter_sha(self, run_id: str, step: int, staged_id: str) -> str:
        """The adapter staging ``staged_id`` of the step holds (another one once trained again, unless alike)."""
        return _sha(f"{run_id}/{step}/{'same' if self.same_adapter_when_trained_again else staged_id}")

    def _adapter(self, run_id: str, step: int, staged_id: str) -> AdapterRef:
        sha = self.adapters[(run_id, step)] = self._adapter_sha(run_id, step, staged_id)
        return AdapterRef(
            run_id=run_id,
            step=step,
            uri=f"s3://stub/runs/{run_id}/checkpoints/{step:06d}/",
            adapter_sha256=sha,
        )

    def assert_each_checkpoint_trained_from_the_one_before(self, run_id: str, steps: int) -> None:
        """Every resumable checkpoint of steps 1..``steps`` was trained from the adapter the run holds for the step
        before it (none from an adapter lost with its trainer)."""
        for step in range(1, steps + 1):
            assert self.lineage[(run_id, step)] == self.adapters[(run_id, step - 1)], step

    @activity.defn(name=ActivityName.LATEST_CHECKPOINT)
    async def latest_checkpoint(self, inp: CheckpointLookup) -> CheckpointRef | None:
        self.calls.append(("latest_checkpoint", -1))
        found = self.checkpoints.get(inp.run_id)
        return found[max(found)] if found else None

    @activity.defn(name=ActivityName.PUBLISH_INITIAL)
    async def publish_initial(self, inp: InitialAdapterInput) -> CheckpointRef:
        self.calls.append(("publish_initial", 0))
        return self._checkpoint(inp.run_id, 0)

    @activity.defn(name=ActivityName.ROLLOUTS)
    async def rollouts(self, inp: RolloutsInput) -> TrajectoriesRef:
        self.calls.append(("rollouts", inp.step))
        self.rollout_policies[inp.step].append(inp.policy_step)
        self.rollout_seeds[inp.step].append(inp.seed)
        self.rollout_inputs[inp.step].append(inp)
        self.rollout_shards[inp.step].append(
            (inp.shard, inp.shards, inp.scenario_offset, inp.groups_per_step)
        )
        if self.rollout_failure is not None:
            f = self.rollout_failure
            raise ApplicationError(f.message, type=f.type, non_retryable=f.non_retryable)
        if inp.adapter is not None:
            assert inp.adapter == adapter_name(inp.run_id, inp.policy_step)
        sampler = self.served.get((inp.run_id, inp.policy_step))  # read before sampling, as the real one
        for gate in (self.rollout_gate, self.rollout_gates.get(inp.step)):
            if gate is not None:
                await gate.wait()
        await asyncio.sleep(self.rollout_seconds)
        n = inp.groups_per_step * inp.group_size
        return TrajectoriesRef(
            ref=ObjectRef(
                uri=f"s3://stub/runs/{inp.run_id}/steps/{inp.step}/t-{inp.shard}.parquet",
                size=1,
                sha256=_sha("t"),
            ),
            run_id=inp.run_id,
            step=inp.step,
            n_groups=inp.groups_per_step,
            n_trajectories=n,
            reward_mean=0.1 * inp.policy_step,
            reward_std=0.05,
            policy_adapters=[] if sampler is None else [sampler],
        )

    @activity.defn(name=ActivityName.STORE_SCENARIOS)
    async def store_scenarios(self, inp: StoreScenariosInput) -> ObjectRef:
        self.calls.append(("store_scenarios", -1))
        data = json.dumps(inp.scenarios).encode()
        sha256 = hashlib.sha256(data).hexdigest()
        return ObjectRef(uri=f"s3://stub/{scenarios_key(inp.run_id, sha256)}", size=len(data), sha256=sha256)

    @activity.defn(name=ActivityName.STORE_RUN_TEXTS)
    async def store_run_texts(self, inp: StoreRunTextsInput) -> RunTexts:
        self.calls.append(("store_run_texts", -1))
        refs = {}
        for kind, text in inp.texts.items():
            sha256 = hashlib.sha256(text.encode()).hexdigest()
            uri = f"s3://stub/{run_text_key(inp.run_id, kind, sha256)}"
            refs[kind] = ObjectRef(uri=uri, size=len(text.encode()), sha256=sha256)
        return RunTexts.model_validate(refs)

    @activity.defn(name=ActivityName.MERGE_ROLLOUTS)
    async def merge_rollouts(self, inp: MergeRolloutsInput) -> TrajectoriesRef:
        self.calls.append(("merge_rollouts", inp.step))
        self.merges[inp.step].append([int(s.ref.uri.rsplit("-", 1)[1].split(".")[0]) for s in inp.shards])
        first = inp.shards[0]
        return first.model_copy(
            update={
                "n_groups": sum(s.n_groups for s in inp.shards),
                "n_trajectories": sum(s.n_trajectories for s in inp.shards),
                "policy_adapters": sorted({sha for s in inp.shards for sha in s.policy_adapters}),
            }
        )

    @activity.defn(name=ActivityName.JUDGE)
    async def judge(self, inp: JudgeInput) -> TrajectoriesRef:
        self.calls.append(("judge", inp.step))
        return inp.trajectories

    @activity.defn(name=ActivityName.ADVANTAGES)
    async def compute_advantages(self, inp: AdvantagesInput) -> AdvantagesResult:
        self.calls.append(("compute_advantages", inp.step))
        self.advantages_inputs[inp.step].append(inp)
        flat = self.no_signal.get(inp.step, 0) > 0
        if flat:
            self.no_signal[inp.step] -= 1
        return AdvantagesResult(
            ref=ObjectRef(
                uri=f"s3://stub/runs/{inp.run_id}/steps/{inp.step}/a.parquet", size=1, sha256=_sha("a")
            ),
            n_trajectories=0 if flat else inp.trajectories.n_trajectories,
            n_groups=inp.trajectories.n_groups,
            n_groups_zero_variance=inp.trajectories.n_groups if flat else 0,
        )

    @activity.defn(name=ActivityName.TRAIN)
    async def train(self, inp: TrainInput) -> TrainResult:
        self.calls.append(("train", inp.step))
        self.train_inputs[inp.step].append(inp)
        entry = self.train_entry_gates.get(inp.step)
        if entry is not None:
            await entry.wait()
        staged = inp.continue_from
        if staged is not None:
            if (
                staged.worker_id != WORKER_ID
                or self.staged.get((inp.run_id, staged.step)) != staged.staged_id
            ):
                raise ApplicationError(f"not holding {staged}", type=STAGED_STATE_LOST, non_retryable=True)
        elif inp.start_from is None and inp.step != 1:
            raise ApplicationError(f"step {inp.step} without a checkpoint", non_retryable=True)
        elif inp.start_from is not None and inp.start_from != self.checkpoints[inp.run_id].get(inp.step - 1):
            raise ApplicationError(f"step {inp.step} from {inp.start_from}", non_retryable=True)
        self.train_started[inp.step].set()
        if self.train_failure is not None:
            f = self.train_failure
            raise ApplicationError(f.message, type=f.type, non_retryable=f.non_retryable)
        gate = self.train_gates.get(inp.step)
        if gate is not None:
            await gate.wait()
        await asyncio.sleep(self.train_seconds)
        staged_id = f"{inp.step}-{len(self.train_inputs[inp.step])}"
        self.staged[(inp.run_id, inp.step)] = staged_id
        if staged is not None:
            parent = self._adapter_sha(inp.run_id, staged.step, staged.staged_id)
        elif inp.start_from is not None:
            parent = self.checkpoint_adapters[inp.start_from.manifest_sha256]
        else:
            parent = self._adapter_sha(inp.run_id, 0, "initial")
        self.trained_from[(inp.run_id, staged_id)] = parent
        return TrainResult(
            run_id=inp.run_id,
            step=inp.step,
            staging_dir=f"/stub/{inp.run_id}/{inp.step}/{staged_id}",
            staged_id=staged_id,
            worker_id=self._worker_for_attempt(),
            loss=1.0 / inp.step,
            grad_norm=0.5,
            n_sequences=8,
            n_trainable_tokens=80,
            micro_batch_size=8,
            seconds=0.0,
        )

    def _worker_for_attempt(self) -> str:
        if self.lost_workers > 0:
            self.lost_workers -= 1
            return "vanished-trainer"
        return WORKER_ID

    @activity.defn(name=ActivityName.PUBLISH)
    async def publish(self, inp: PublishInput) -> CheckpointRef:
        self.calls.append(("publish", inp.step))
        await self._gate_or_fail(inp.step, self.publish_gates, self.publish_failures)
        if inp.step in self.lost_after_adapter:  # the trainer restarts without its disk
            self.lost_after_adapter.discard(inp.step)
            self.lost_stagings.update(self.staged.values())
            self.staged.clear()
        return self._checkpoint(inp.run_id, inp.step, self._still_staged(inp))

    def _still_staged(self, inp: PublishInput) -> str:
        """The staged id of ``inp``'s staging, still held; else StagedStateLost."""
        staged_id = inp.staging_dir.rsplit("/", 1)[-1]
        if staged_id in self.lost_stagings:
            raise ApplicationError(f"{inp.staging_dir} is gone", type=STAGED_STATE_LOST, non_retryable=True)
        return staged_id

    @activity.defn(name=ActivityName.PUBLISH_ADAPTER)
    async def publish_adapter(self, inp: PublishInput) -> AdapterRef:
        self.calls.append(("publish_adapter", inp.step))
        gate = self.publish_adapter_gates.get(inp.step)
        if gate is not None:
            await gate.wait()
        return self._adapter(inp.run_id, inp.step, self._still_staged(inp))

    @staticmethod
    async def _gate_or_fail(
        step: int, gates: dict[int, asyncio.Event], failures: dict[int, list[Failure]]
    ) -> None:
        gate = gates.get(step)
        if gate is not None:
            await gate.wait()
        if failures.get(step):
            f = failures[step].pop(0)
            raise ApplicationError(f.message, type=f.type, non_retryable=f.non_retryable)

    @activity.defn(name=ActivityName.REPUBLISH)
    async def republish(self, inp: RepublishInput) -> CheckpointRef:
        self.calls.append(("republish", inp.step))
        assert inp.source == self.checkpoints[inp.source.run_id][inp.step - 1], inp.source
        return self._checkpoint(inp.source.run_id, inp.step)

    @activity.defn(name=ActivityName.RELOAD)
    async def reload(self, inp: ReloadInput) -> ReloadResult:
        ref = inp.checkpoint
        self.calls.append(("reload", ref.step))
        self.reload_started[ref.step].set()
        await self._gate_or_fail(ref.step, self.reload_gates, self.reload_failures)
        sha = (
            ref.adapter_sha256
            if isinstance(ref, AdapterRef)
            else self.checkpoint_adapters.get(ref.manifest_sha256)
        )
        if sha is not None:
            self.served[(ref.run_id, ref.step)] = sha
        self.reloaded.append((ref.step, sha))
        return ReloadResult(adapter=adapter_name(ref.run_id, ref.step), servers=["stub"], adapter_sha256=sha)

    @activity.defn(name=ActivityName.SERVING_CONTROL)
    async def serving_control(self, inp: ServingControlInput) -> None:
        self.calls.append((inp.action, -1))

    @activity.defn(name=ActivityName.RETAIN_CHECKPOINTS)
    async def retain_checkpoints(self, inp: RetentionInput) -> list[int]:
        self.calls.append(("retain_checkpoints", max(inp.protect, default=inp.keep_from or 0)))
        self.retained.append(inp)
        return []

    @activity.defn(name=ActivityName.METRICS)
    async def metrics_activity(self, inp: MetricsInput) -> None:
        self.calls.append(("metrics", inp.step))
        gate = self.metrics_gates.get(inp.step)
        if gate is not None:
            await gate.wait()
        self.metrics.append(inp)

    def workers(self, client, task_queue: str, **worker_options) -> list[Worker]:  # type: ignore[no-untyped-def]
        """One worker for every queue (the spec's three queues are ``task_queue``), plus the pinned one."""
        everything = [
            self.latest_checkpoint,
            self.publish_initial,
            self.republish,
            self.rollouts,
            self.store_scenarios,
            self.store_run_texts,
            self.merge_rollouts,
            self.judge,
            self.compute_advantages,
            self.train,
            self.reload,
            self.serving_control,
            self.metrics_activity,
            self.retain_checkpoints,
        ]
        return [
            Worker(
                client,
                task_queue=task_queue,
                workflows=[TrainingRun, TrainStep],
                activities=everything,
                interceptors=INTERCEPTORS,
                **worker_options,
            ),
            Worker(
                client,
                task_queue=worker_task_queue(task_queue, WORKER_ID),
                activities=[self.publish, self.publish_adapter, self.train],
                interceptors=INTERCEPTORS,
            ),
        ]
