"""Pipelined mode: the trainer never waits for durability (docs/pipelining.md).

Step n+1 trains as soon as step n's training has ended and step n+1's scored rollouts and advantages are in;
step n's publish and reload run beside that training, on the trainer that holds step n and on the inference
queue. What stays as in sync mode:

- a checkpoint counts once its manifest is written (``publish``, manifest last): only a published checkpoint
  is reloaded, and a step trained anywhere but on the trainer that staged its predecessor starts from that
  predecessor's published checkpoint;
- the step counter advances once adapter n is served, in step order (each step's reload waits for the one
  before it);
- rollouts for step n are sampled by a policy no older than ``n - 1 - max_staleness``: they wait for it;
- the trainer runs at most one step ahead of serving, so at most one checkpoint is in flight, and its staged
  files are on the trainer's disk until it is published;
- a publish or reload that fails is retried by its stage's policy, then fails the run, as in sync mode.

Step n+1 goes to the trainer that trained step n (its own task queue, ``TrainInput.continue_from``), which
continues from its model in memory, or from step n's staged files when a failed attempt left the model
changed. If that trainer is gone (the task is never picked up) or no longer holds that staging, step n+1 is
trained on any trainer from checkpoint n once it is published; if the trainer vanished before publishing
step n, step n is trained again from checkpoint n - 1 first (``train_and_publish``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from schemas.activities import (
        AdvantagesInput,
        AdvantagesResult,
        PublishInput,
        ReloadInput,
        ReloadResult,
        StagedRef,
        TrainInput,
        TrainResult,
    )
    from schemas.config import RunSpec
    from schemas.errors import STAGED_STATE_LOST
    from schemas.history_bounds import RESAMPLES_WITHOUT_SIGNAL
    from schemas.layout import worker_task_queue
    from schemas.refs import CheckpointRef, TrajectoriesRef
    from schemas.run_state import MAX_HISTORY, RunState, StepSummary, TrainStepInput

from workflows.stages import (
    ADVANTAGES,
    RELOAD,
    TRAIN,
    TRAIN_BESIDE,
    NoLearningSignal,
    StageFailed,
    is_lost_worker,
    run_stage,
    stage_failure,
)
from workflows.train_step import PhaseClock, no_learning_signal, publish_on_its_trainer, train_and_publish

T = TypeVar("T")


class PipelineHost(Protocol):
    """What ``Pipeline`` needs of the ``TrainingRun`` it runs in."""

    @property
    def spec(self) -> RunSpec: ...

    @property
    def state(self) -> RunState:
        """The run's state: the pipeline advances its step counter and reads its pause and stop flags."""
        ...

    async def roll_out(self, target: int, policy_step: int, resample: int) -> TrajectoriesRef:
        """Step ``target``'s rollouts sampled by ``policy_step``, judged."""
        ...

    def step_served(self, summary: StepSummary, scored: TrajectoriesRef) -> None:
        """Step ``summary.step`` is served: its metrics and retention, beside what follows."""
        ...

    def working(self, phase: str, step: int | None) -> None:
        """What the ``status`` query says the run is doing."""
        ...

    def train_step_input(self, target: int, scored: TrajectoriesRef) -> TrainStepInput:
        """What training step ``target`` on ``scored`` needs, as sync mode gives it (from the served checkpoint;
        the run's model, its stored texts, its scheduling and heartbeat timeout)."""
        ...


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
    """A trained step, its checkpoint being published and its adapter served beside the next training."""

    step: int
    prepared: Prepared
    result: TrainResult
    published: asyncio.Task[CheckpointRef]
    """Checkpoint ``step``, manifested (trained again elsewhere first if its trainer vanished)."""
    served: asyncio.Task[None] = field(init=False)
    """Done once the step counter reads ``step``."""
    seconds: dict[str, float] = field(default_factory=dict)


class Pipeline:
    """Runs a pipelined ``TrainingRun``'s steps until the run ends, stops or should continue as new."""

    def __init__(self, host: PipelineHost) -> None:
        self.host = host
        self._served_at: datetime | None = None

    async def run(self) -> bool:
        """Train the run's remaining steps; True when the run should now continue as new. Every started step is
        served (or has failed the run) when this returns; rollouts made ahead are left in ``state.prefetched``."""
        spec, state = self.host.spec, self.host.state
        self._served_at = workflow.now()
        ahead: asyncio.Task[Prepared] | None = None
        last: Trained | None = None
        before_last: Trained | None = None
        trained_now = 0
        continue_as_new = False
        target = state.step + 1
        try:
            while target <= spec.steps and not state.stopping:
                if state.paused:
                    self.host.working("paused", None)
                    await self._beside(
                        workflow.wait_condition(lambda: not state.paused or state.stopping), last
                    )
                    if state.stopping:
                        break
                if trained_now >= spec.continue_as_new_every:
                    continue_as_new = True
                    break
                self.host.working("rollouts", target)
                prepared = await self._beside(ahead if ahead is not None else self._prepare(target), last)
                ahead = None
                if target < spec.steps and not state.stopping:
                    ahead = asyncio.create_task(self._prepare(target + 1))
                if before_last is not None:  # the trainer runs at most one step ahead of serving
                    await self._beside(before_last.served, last)
                self.host.working("train", target)
                started = workflow.now()
                result = await self._beside(self._train(target, prepared, last), last)
                before_last, last = last, self._serve_beside(target, prepared, result, last)
                last.seconds["train"] = (workflow.now() - started).total_seconds()
                target += 1
                trained_now += 1
            if continue_as_new and ahead is not None:
                prepared = await self._beside(ahead, last)
                ahead = None
                state.prefetched, state.prefetched_policy = prepared.scored, prepared.policy
            if last is not None:
                self.host.working("reload", last.step)
                await last.served
        except (StageFailed, NoLearningSignal):
            if last is not None:  # the step trained before the failure is still served, as in sync mode
                await workflow.wait([last.served])
            raise
        finally:
            if ahead is not None:
                ahead.cancel()
        return continue_as_new

    async def _beside(self, work: Awaitable[T], last: Trained | None) -> T:
        """``work``'s result; the failure of the newest step's publish or reload first, if it fails sooner."""
        task = asyncio.ensure_future(work)
        if last is None or last.served.done():
            if last is not None:
                last.served.result()  # raises its failure
            return await task
        await workflow.wait([task, last.served], return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            if last.served.exception() is None:
                return await task
            task.cancel()
            last.served.result()
        return task.result()

    # --- a step's data -----------------------------------------------------------------------------

    async def _prepare(self, target: int) -> Prepared:
        """Step ``target``'s rollouts (sampled by a fresh enough policy), judged, and their advantages; rolled
        out again on other scenarios when no group's rewards differ."""
        spec, state = self.host.spec, self.host.state
        started = workflow.now()
        scored, policy = self._carried(target), state.prefetched_policy
        state.prefetched = None
        resample = 0
        while True:
            if scored is None:
                # No rollout is sampled by a policy staler than max_staleness: wait for a fresh one.
                await workflow.wait_condition(lambda: state.step >= target - 1 - spec.max_staleness)
                policy = state.step
                scored = await self.host.roll_out(target, policy, resample)
            rolled = workflow.now()
            advantages = await run_stage(
                ADVANTAGES,
                AdvantagesInput(run_id=spec.run_id, step=target, trajectories=scored, train=spec.train),
                task_queue=spec.task_queues.control,
                step=target,
                scheduling=spec.scheduling(),
                heartbeat_s=spec.heartbeat_timeout_s,
                result_type=AdvantagesResult,
            )
            if advantages.n_trajectories > 0:
                seconds = {
                    "rollouts": (rolled - started).total_seconds(),
                    "advantages": (workflow.now() - rolled).total_seconds(),
                }
                return Prepared(scored, advantages, policy, resample, seconds)
            if resample >= RESAMPLES_WITHOUT_SIGNAL:
                raise no_learning_signal(target, advantages.n_groups)
            resample += 1
            workflow.logger.info(
                "step %d: no learning signal; rolling out other scenarios (%d)", target, resample
            )
            scored, started = None, workflow.now()

    def _carried(self, target: int) -> TrajectoriesRef | None:
        """Rollouts for ``target`` carried over a continue-as-new, unless their policy is too stale (dropped)."""
        spec, state = self.host.spec, self.host.state
        scored = state.prefetched
        if scored is None or scored.step != target:
            return None
        staleness = (target - 1) - state.prefetched_policy
        if staleness <= spec.max_staleness:
            return scored
        state.dropped_stale_groups += scored.n_groups
        workflow.logger.info("step %d: dropped %d groups sampled by policy %d (staleness %d > max_staleness %d)",
                             target, scored.n_groups, state.prefetched_policy, staleness, spec.max_staleness)  # fmt: skip
        return None

    # --- training ----------------------------------------------------------------------------------

    async def _train(self, target: int, prepared: Prepared, last: Trained | None) -> TrainResult:
        """Train ``target`` on the trainer that holds step ``target - 1``, or from its published checkpoint."""
        spec, state = self.host.spec, self.host.state
        step_input = self.host.train_step_input(target, prepared.scored)
        inp = TrainInput(
            run_id=spec.run_id,
            step=target,
            model=step_input.model,
            advantages=prepared.advantages.ref,
            train=spec.train,
            chat_template_ref=step_input.chat_template_ref,
        )
        if last is None:  # this execution's first step: from the served checkpoint, on any trainer
            start_from = state.checkpoint
        elif not last.result.staged_id:  # a trainer that does not name its stagings
            start_from = await last.published
        else:
            staged = StagedRef(run_id=spec.run_id, step=last.step, worker_id=last.result.worker_id,
                               staged_id=last.result.staged_id)  # fmt: skip
            queue = worker_task_queue(spec.task_queues.trainer, staged.worker_id)
            try:
                return await run_stage(TRAIN_BESIDE, inp.model_copy(update={"continue_from": staged}),
                                       task_queue=queue, step=target, result_type=TrainResult, reraise=True,
                                       scheduling=step_input.scheduling,
                                       heartbeat_s=step_input.heartbeat_timeout_s)  # fmt: skip
            except ActivityError as err:
                if not (is_lost_worker(err) or _is_staged_state_lost(err)):
                    raise stage_failure(TRAIN, target, err) from err
                workflow.logger.warning("step %d: trainer %s no longer holds step %d; training from checkpoint "
                                        "%d once it is published", target, staged.worker_id, last.step, last.step)  # fmt: skip
            start_from = await last.published
        return await run_stage(TRAIN, inp.model_copy(update={"start_from": start_from}),
                               task_queue=spec.task_queues.trainer, step=target, result_type=TrainResult,
                               scheduling=step_input.scheduling,
                               heartbeat_s=step_input.heartbeat_timeout_s)  # fmt: skip

    # --- publish and reload, beside the next training ----------------------------------------------

    def _serve_beside(
        self, step: int, prepared: Prepared, result: TrainResult, last: Trained | None
    ) -> Trained:
        published = asyncio.create_task(self._publish(step, prepared, result, last))
        trained = Trained(step, prepared, result, published)
        trained.served = asyncio.create_task(self._serve(trained, last))
        return trained

    async def _publish(
        self, step: int, prepared: Prepared, result: TrainResult, last: Trained | None
    ) -> CheckpointRef:
        """Publish ``step`` from the trainer that staged it; trained again from checkpoint ``step - 1`` first if
        that trainer vanished before publishing it."""
        spec, state = self.host.spec, self.host.state
        publish = PublishInput(run_id=spec.run_id, step=step, staging_dir=result.staging_dir,
                               metrics={"loss": result.loss, "grad_norm": result.grad_norm})  # fmt: skip
        checkpoint = await publish_on_its_trainer(publish, result.worker_id, spec.task_queues.trainer,
                                                  spec.scheduling(), spec.heartbeat_timeout_s, lost_ok=True)  # fmt: skip
        if checkpoint is not None:
            return checkpoint
        workflow.logger.warning("step %d: trainer %s vanished before publishing; training again", step,
                                result.worker_id)  # fmt: skip
        start_from = state.checkpoint if last is None else await last.published
        again = self.host.train_step_input(step, prepared.scored).model_copy(
            update={"start_from": start_from}
        )
        _, checkpoint = await train_and_publish(again, prepared.advantages, PhaseClock())
        return checkpoint

    async def _serve(self, trained: Trained, last: Trained | None) -> None:
        """Reload ``trained``'s checkpoint once published and once step ``trained.step - 1`` is served, then
        advance the step counter."""
        spec, state = self.host.spec, self.host.state
        started = workflow.now()
        checkpoint = await trained.published
        published = workflow.now()
        if last is not None:
            await last.served  # in step order
        reloading = workflow.now()
        reloaded = await run_stage(
            RELOAD,
            ReloadInput(
                model_name=spec.model.name,
                checkpoint=checkpoint,
                serving=spec.serving,
                lora_rank=spec.model.lora.rank,
                chat_template=spec.model.chat_template is not None,
            ),
            task_queue=spec.task_queues.inference,
            step=trained.step,
            scheduling=spec.scheduling(),
            heartbeat_s=spec.heartbeat_timeout_s,
            result_type=ReloadResult,
        )
        adapter = reloaded.adapter
        now = workflow.now()
        assert self._served_at is not None
        prepared, result = trained.prepared, trained.result
        seconds = {
            **prepared.seconds,
            **trained.seconds,
            "publish": (published - started).total_seconds(),
            "reload": (now - reloading).total_seconds(),
            "step": (now - self._served_at).total_seconds(),
        }
        self._served_at = now
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
        )
        # The step advances only now: its adapter is served.
        state.step, state.checkpoint, state.adapter = trained.step, checkpoint, adapter
        state.history = [*state.history, summary][-MAX_HISTORY:]
        self.host.step_served(summary, prepared.scored)


def _is_staged_state_lost(err: ActivityError) -> bool:
    cause = err.cause
    return isinstance(cause, ApplicationError) and cause.type == STAGED_STATE_LOST
