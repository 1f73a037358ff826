"""Pipelined mode's durability beside the next training: each trained step published and reloaded, in step order.

``Pipeline`` (workflows/pipeline.py) trains; this module takes each trained step from there to served and
resumable while the next one trains. Runs whose history predates ``servable-before-resumable`` publish each step
whole before its reload (``Beside.publish_whole``); later ones (docs/pipelining.md#servable-before-resumable):

- ``servable``: the adapter goes up first, on the trainer that staged it; the reload needs nothing more. If that
  trainer vanished before, the step is trained again from checkpoint n - 1 and published whole;
- ``resumable``: the rest (optimizer and trainer state, the manifest last) goes up beside what follows, in step
  order (a checkpoint is never resumable before the one it was trained from). If the trainer vanished after its
  adapter was served, the step is trained again from checkpoint n - 1 on the same advantages and served again;
- every step trained from a checkpoint first checks that its rollouts were sampled by adapters the run holds
  (``on_lineage``): those a lost adapter sampled are dropped and rolled out again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from schemas.activities import AdvantagesResult, PublishInput, ReloadInput, ReloadResult, TrainResult
    from schemas.config import RunSpec
    from schemas.refs import AdapterRef, CheckpointRef, TrajectoriesRef
    from schemas.run_state import MAX_HISTORY, RunState, StepSummary, TrainStepInput, UnsettledStep

from workflows.servable import on_lineage
from workflows.stages import PUBLISH_ADAPTER, RELOAD, run_stage
from workflows.step_chain import PhaseClock, on_its_trainer, publish_on_its_trainer, train_and_publish

T = TypeVar("T")


class BesideHost(Protocol):
    """What ``Beside`` needs of the ``TrainingRun`` it serves steps of."""

    @property
    def spec(self) -> RunSpec: ...

    @property
    def state(self) -> RunState: ...

    def step_served(self, summary: StepSummary, scored: TrajectoriesRef) -> None: ...

    def train_step_input(self, target: int, scored: TrajectoriesRef) -> TrainStepInput: ...


@dataclass
class Prepared:
    """A step's scored rollouts and advantages: all it needs to train."""

    scored: TrajectoriesRef
    advantages: AdvantagesResult
    policy: int
    """The policy step that sampled ``scored``."""
    resampled: int
    seconds: dict[str, float]


@dataclass
class Trained:
    """A trained step, published and served beside the next training."""

    step: int
    prepared: Prepared
    result: TrainResult
    """Its training (the last one, when trained again)."""
    servable: asyncio.Task[CheckpointRef | AdapterRef] = field(init=False)
    """What the servers load: its adapter (a whole checkpoint when trained again before it went up)."""
    resumable: asyncio.Task[CheckpointRef] = field(init=False)
    """Checkpoint ``step``, manifested (trained again elsewhere first if its trainer vanished)."""
    served: asyncio.Task[None] = field(init=False)
    """Done once the step counter reads ``step``."""
    seconds: dict[str, float] = field(default_factory=dict)
    trained_again: bool = False
    rest_started: bool = False
    """The rest of its checkpoint is being written (or was): from then on it is settled in this execution."""


async def _done(value: T) -> T:
    return value


Reprepare = Callable[[int, Prepared], Awaitable[Prepared]]
"""Step ``n``'s rollouts checked against the adapters the run holds: as given, or rolled out again."""


class Beside:
    """Publishes and reloads a pipelined run's trained steps (see the module doc)."""

    def __init__(self, host: BesideHost, servable_first: bool, on_lineage_or_again: Reprepare) -> None:
        self.host = host
        self.servable_first = servable_first
        self.checked = on_lineage_or_again
        self.served_at = workflow.now()
        state = host.state
        self.lineage: dict[int, str | None] = {state.step: state.adapter_sha256}
        """Step -> the ``adapter_sha256`` of the adapter the run holds for it (served in this execution)."""
        self.carrying: int | None = None
        """The run continues as new after this step: once served, its rest is left to the continued run unless it has
        started (the steps before it are settled here)."""

    def start(self, step: int, prepared: Prepared, result: TrainResult, last: Trained | None) -> Trained:
        trained = Trained(step, prepared, result)
        if self.servable_first:
            trained.servable = asyncio.create_task(self._servable(trained, last))
            trained.resumable = asyncio.create_task(self._resumable(trained, last))
        else:
            trained.servable = trained.resumable = asyncio.create_task(self.publish_whole(trained, last))
        trained.served = asyncio.create_task(self._serve(trained, last))
        return trained

    def unsettled(self, trained: Trained) -> UnsettledStep | None:
        """``trained`` as the continued run takes it over, when it is served and the rest of its checkpoint has not
        started (``carrying``): its rest task is cancelled. None when it is settled, or being settled, here."""
        if not (self.carrying == trained.step and trained.served.done() and not trained.rest_started):
            return None
        if trained.resumable.done() or trained.served.exception() is not None:
            return None
        servable = trained.servable.result()
        if not isinstance(servable, AdapterRef):  # trained again and published whole: resumable already
            return None
        trained.resumable.cancel()
        prepared = trained.prepared
        return UnsettledStep(step=trained.step, scored=prepared.scored, advantages=prepared.advantages,
                             policy=prepared.policy, resampled=prepared.resampled, result=trained.result,
                             adapter=servable)  # fmt: skip

    def take_over(self, unsettled: UnsettledStep) -> Trained:
        """A step served by the run before it continued as new, whose rest this run writes: resumable beside the
        next training, which continues from its staging (or, its trainer lost, trained again and served again)."""
        prepared = Prepared(unsettled.scored, unsettled.advantages, unsettled.policy, unsettled.resampled, {})
        trained = Trained(unsettled.step, prepared, unsettled.result)
        trained.servable = asyncio.create_task(_done(unsettled.adapter))
        trained.served = asyncio.create_task(_done(None))
        trained.resumable = asyncio.create_task(self._resumable(trained, None))
        return trained

    def watched(self, last: Trained) -> list[asyncio.Task[Any]]:
        """What of ``last`` fails the run as soon as it fails."""
        return [last.served, last.resumable] if self.servable_first else [last.served]

    def _publish_input(self, trained: Trained) -> PublishInput:
        result = trained.result
        return PublishInput(run_id=self.host.spec.run_id, step=trained.step, staging_dir=result.staging_dir,
                            metrics={"loss": result.loss, "grad_norm": result.grad_norm})  # fmt: skip

    async def publish_whole(self, trained: Trained, last: Trained | None) -> CheckpointRef:
        """Publish ``trained`` whole from the trainer that staged it; trained again from checkpoint ``step - 1``
        first if that trainer vanished before publishing it."""
        spec = self.host.spec
        checkpoint = await publish_on_its_trainer(self._publish_input(trained), trained.result.worker_id,
                                                  spec.task_queues.trainer, spec.scheduling(),
                                                  spec.heartbeat_timeout_s, lost_ok=True)  # fmt: skip
        if checkpoint is not None:
            return checkpoint
        workflow.logger.warning("step %d: trainer %s vanished before publishing; training again", trained.step,
                                trained.result.worker_id)  # fmt: skip
        return await self._train_again(trained, last)

    async def _train_again(self, trained: Trained, last: Trained | None) -> CheckpointRef:
        """Train ``trained``'s step again from checkpoint ``step - 1`` on any trainer and publish it whole."""
        state = self.host.state
        start_from = state.checkpoint if last is None else await last.resumable
        if self.servable_first:
            trained.prepared = await self.checked(trained.step, trained.prepared)
        prepared = trained.prepared
        again = self.host.train_step_input(trained.step, prepared.scored).model_copy(
            update={"start_from": start_from}
        )
        trained.result, checkpoint = await train_and_publish(again, prepared.advantages, PhaseClock())
        return checkpoint

    async def _servable(self, trained: Trained, last: Trained | None) -> CheckpointRef | AdapterRef:
        """``trained``'s adapter, up from the trainer that staged it; the step trained again and published whole
        when that trainer vanished before."""
        spec = self.host.spec
        adapter = await on_its_trainer(PUBLISH_ADAPTER, self._publish_input(trained), trained.result.worker_id,
                                       spec.task_queues.trainer, spec.scheduling(), spec.heartbeat_timeout_s,
                                       AdapterRef, lost_ok=True)  # fmt: skip
        if adapter is not None:
            return adapter
        workflow.logger.warning("step %d: trainer %s vanished before publishing its adapter; training again",
                                trained.step, trained.result.worker_id)  # fmt: skip
        return await self._train_again(trained, last)

    async def _resumable(self, trained: Trained, last: Trained | None) -> CheckpointRef:
        """The rest of ``trained``'s checkpoint, once step ``step - 1``'s is written: resumable. When its trainer
        vanished after its adapter went up, the step is trained again and served again."""
        spec, state = self.host.spec, self.host.state
        servable = await trained.servable
        if isinstance(servable, CheckpointRef):  # trained again before its adapter went up: whole already
            checkpoint = servable
        else:
            # Once served: the reload, which the next rollouts wait for, does not share the store with this upload.
            await workflow.wait([trained.served])
            if last is not None:
                await last.resumable  # in step order
            # Left to the continued run (this task is cancelled), unless the run fails first.
            if self.carrying == trained.step:
                await workflow.wait_condition(lambda: self.carrying != trained.step)
            trained.rest_started = True
            written = await publish_on_its_trainer(self._publish_input(trained), trained.result.worker_id,
                                                   spec.task_queues.trainer, spec.scheduling(),
                                                   spec.heartbeat_timeout_s, lost_ok=True)  # fmt: skip
            checkpoint = written or await self._served_again(trained, last)
        if trained.step <= state.step:
            self._resumed(trained.step, checkpoint)
        return checkpoint

    async def _served_again(self, trained: Trained, last: Trained | None) -> CheckpointRef:
        """``trained``'s trainer vanished after its adapter went up: train the step again, and once its first
        adapter is served (in step order), serve the new one under its name."""
        state = self.host.state
        workflow.logger.warning(
            "step %d: trainer %s vanished after its adapter went up, before its optimizer state was written; "
            "training the step again", trained.step, trained.result.worker_id,
        )  # fmt: skip
        await workflow.wait([trained.served])  # never two adapters of one step published at once
        checkpoint = await self._train_again(trained, last)
        trained.trained_again = True
        if trained.served.exception() is None:
            reloaded = await self._reload(trained.step, checkpoint)
            self.lineage[trained.step] = reloaded.adapter_sha256
            if state.step == trained.step:
                state.adapter_sha256 = reloaded.adapter_sha256
            self._amend(trained.step, trained_again=True, adapter_sha256=reloaded.adapter_sha256,
                        loss=trained.result.loss)  # fmt: skip
        return checkpoint

    def _resumed(self, step: int, checkpoint: CheckpointRef) -> None:
        """Served step ``step``'s checkpoint is resumable: the run's newest, and its summary's."""
        state = self.host.state
        if state.checkpoint is None or state.checkpoint.step <= step:
            state.checkpoint = checkpoint
        self._amend(step, checkpoint=checkpoint)

    def _amend(self, step: int, **update: object) -> None:
        state = self.host.state
        state.history = [h.model_copy(update=update) if h.step == step else h for h in state.history]

    async def _reload(self, step: int, checkpoint: CheckpointRef | AdapterRef) -> ReloadResult:
        spec = self.host.spec
        return await run_stage(
            RELOAD,
            ReloadInput(
                model_name=spec.model.name,
                checkpoint=checkpoint,
                serving=spec.serving,
                lora_rank=spec.model.lora.rank,
                chat_template=spec.model.chat_template is not None,
            ),
            task_queue=spec.task_queues.inference,
            step=step,
            scheduling=spec.scheduling(),
            heartbeat_s=spec.heartbeat_timeout_s,
            result_type=ReloadResult,
        )

    async def _serve(self, trained: Trained, last: Trained | None) -> None:
        """Reload ``trained``'s adapter once servable and once step ``trained.step - 1`` is served, then advance
        the step counter."""
        state = self.host.state
        started = workflow.now()
        servable = await trained.servable
        published = workflow.now()
        if last is not None:
            await last.served  # in step order
        reloading = workflow.now()
        reloaded = await self._reload(trained.step, servable)
        now = workflow.now()
        prepared, result = trained.prepared, trained.result
        seconds = {
            **prepared.seconds,
            **trained.seconds,
            "publish": (published - started).total_seconds(),
            "reload": (now - reloading).total_seconds(),
            "step": (now - self.served_at).total_seconds(),
        }
        self.served_at = now
        resumable = trained.resumable.done() and trained.resumable.exception() is None
        checkpoint = trained.resumable.result() if resumable else None
        summary = StepSummary(
            step=trained.step,
            reward_mean=prepared.scored.reward_mean,
            reward_std=prepared.scored.reward_std,
            n_trajectories=prepared.scored.n_trajectories,
            n_exceptions=prepared.scored.n_exceptions,
            n_groups_zero_variance=prepared.advantages.n_groups_zero_variance,
            policy_step=prepared.policy,
            loss=result.loss,
            checkpoint=checkpoint,
            resampled=prepared.resampled,
            seconds=seconds,
            train_metrics=result.metrics,
            adapter_sha256=reloaded.adapter_sha256,
        )
        # The step advances only now: its adapter is served.
        state.step, state.adapter = trained.step, reloaded.adapter
        state.history = [*state.history, summary][-MAX_HISTORY:]
        if self.servable_first:
            state.adapter_sha256 = reloaded.adapter_sha256
            self.lineage[trained.step] = reloaded.adapter_sha256
            if checkpoint is not None:
                self._resumed(trained.step, checkpoint)
        else:
            assert isinstance(servable, CheckpointRef)
            state.checkpoint = servable
        self.host.step_served(summary, prepared.scored)

    def holds(self, scored: TrajectoriesRef, policy: int) -> bool:
        """Whether ``scored`` (sampled by ``policy``) was sampled by the adapter the run holds for that step."""
        return on_lineage(scored, self.lineage.get(policy))
