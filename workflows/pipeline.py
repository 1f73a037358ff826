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
step n, step n is trained again from checkpoint n - 1 first (``train_and_publish``). Publishing and reloading
are workflows/beside.py's: since ``servable-before-resumable`` a step is reloaded once its adapter is up, and
"published" above means resumable.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Protocol, TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from schemas.activities import (
        AdvantagesInput,
        AdvantagesResult,
        StagedRef,
        TrainInput,
        TrainResult,
    )
    from schemas.config import RunSpec
    from schemas.history_bounds import RESAMPLES_WITHOUT_SIGNAL
    from schemas.layout import worker_task_queue
    from schemas.refs import TrajectoriesRef
    from schemas.run_state import RunState, StepSummary, TrainStepInput

from workflows.beside import Beside, Prepared, Trained
from workflows.stages import (
    ADVANTAGES,
    TRAIN,
    TRAIN_BESIDE,
    NoLearningSignal,
    StageFailed,
    is_lost_worker,
    is_staged_state_lost,
    run_stage,
    stage_failure,
)
from workflows.step_chain import no_learning_signal

T = TypeVar("T")

CARRY_PATCH = "unsettled-step-across-continue-as-new"
"""A pipelined run continues as new once its last step is served, leaving the rest of that step's checkpoint
to the continued run (``RunState.unsettled``) with the next step's advantages; runs whose history predates it
wait for that checkpoint to be resumable first (and the continued run computes the advantages again)."""


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


class Pipeline:
    """Runs a pipelined ``TrainingRun``'s steps until the run ends, stops or should continue as new."""

    def __init__(self, host: PipelineHost, servable_first: bool = False) -> None:
        self.host = host
        self.servable_first = servable_first
        self.beside = Beside(host, servable_first, self._on_lineage)
        state = host.state
        self._rolled_out = state.step + (state.prefetched is not None)
        """The newest step whose rollouts are done: the next step's start once its policy is served (servable
        first), one step's rollouts at a time on the inference devices."""

    async def run(self) -> bool:
        """Train the run's remaining steps; True when the run should now continue as new. Every started step is
        served (or has failed the run) when this returns; rollouts made ahead are left in ``state.prefetched``."""
        spec, state = self.host.spec, self.host.state
        ahead: asyncio.Task[Prepared] | None = None
        last: Trained | None = self._taken_over()
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
                    # The continued run writes the last step's rest, and trains on without waiting for it.
                    if last is not None and self.servable_first and workflow.patched(CARRY_PATCH):
                        self.beside.carrying = last.step
                    break
                self.host.working("rollouts", target)
                if (
                    self.servable_first
                ):  # the next step rolls out once its policy is served and these are done
                    current = ahead or asyncio.create_task(self._prepare(target))
                    ahead = None
                    if target < spec.steps and not state.stopping:
                        ahead = asyncio.create_task(self._prepare(target + 1))
                    prepared = await self._beside(current, last)
                else:
                    prepared = await self._beside(ahead if ahead is not None else self._prepare(target), last)
                    ahead = None
                    if target < spec.steps and not state.stopping:
                        ahead = asyncio.create_task(self._prepare(target + 1))
                if before_last is not None:  # the trainer runs at most one step ahead of serving
                    await self._beside(before_last.served, last)
                self.host.working("train", target)
                started = workflow.now()
                result, prepared = await self._beside(self._train(target, prepared, last), last)
                before_last, last = last, self.beside.start(target, prepared, result, last)
                last.seconds["train"] = (workflow.now() - started).total_seconds()
                target += 1
                trained_now += 1
            if continue_as_new and ahead is not None:
                prepared = await self._beside(ahead, last)
                ahead = None
                state.prefetched, state.prefetched_policy = prepared.scored, prepared.policy
                if self.beside.carrying is not None:
                    state.prefetched_advantages = prepared.advantages
            if last is not None:
                self.host.working("reload", last.step)
                await last.served
                if self.servable_first:
                    if before_last is not None:
                        await before_last.resumable  # a continued run trains from it, or from the last one
                    state.unsettled = self.beside.unsettled(last)
                    if state.unsettled is None:
                        await last.resumable  # and every step's before it: a continued run trains from it
                    self._carry_on_lineage()
        except (StageFailed, NoLearningSignal):
            self.beside.carrying = None  # the run ends here: its last step's rest too
            if last is not None:  # the step trained before the failure is still served, as in sync mode
                await workflow.wait(self.beside.watched(last))
            raise
        finally:
            if ahead is not None:
                ahead.cancel()
        return continue_as_new

    def _taken_over(self) -> Trained | None:
        """The step the run before this one served but left unsettled (``RunState.unsettled``), if any."""
        state = self.host.state
        unsettled, state.unsettled = state.unsettled, None
        return None if unsettled is None else self.beside.take_over(unsettled)

    async def _beside(self, work: Awaitable[T], last: Trained | None) -> T:
        """``work``'s result; the failure of the newest step's publish or reload first, if it fails sooner."""
        task = asyncio.ensure_future(work)
        watched = [] if last is None else self.beside.watched(last)
        while True:
            failed = next((w for w in watched if w.done() and w.exception() is not None), None)
            if failed is not None:
                task.cancel()
                failed.result()  # raises its failure
            pending = [w for w in watched if not w.done()]
            if not pending:
                return await task
            await workflow.wait([task, *pending], return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                return task.result()

    # --- a step's data -----------------------------------------------------------------------------

    async def _prepare(self, target: int) -> Prepared:
        """Step ``target``'s rollouts (sampled by a fresh enough policy), judged, and their advantages; rolled
        out again on other scenarios when no group's rewards differ."""
        spec, state = self.host.spec, self.host.state
        started = workflow.now()
        policy = state.prefetched_policy
        scored, carried_advantages = self._carried(target) or (None, None)
        resample = 0
        while True:
            if scored is None:
                # No rollout is sampled by a policy staler than max_staleness: wait for a fresh one.
                await workflow.wait_condition(
                    lambda: (
                        state.step >= target - 1 - spec.max_staleness
                        and (not self.servable_first or self._rolled_out >= target - 1)
                    )
                )
                policy = state.step
                scored = await self.host.roll_out(target, policy, resample)
            self._rolled_out = max(self._rolled_out, target)
            rolled = workflow.now()
            advantages = carried_advantages
            carried_advantages = None
            if advantages is None:
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

    def _carried(self, target: int) -> tuple[TrajectoriesRef, AdvantagesResult | None] | None:
        """Rollouts for ``target`` carried over a continue-as-new, with their advantages when computed before it
        (taken), unless their policy is too stale (dropped); rollouts carried for another step stay."""
        spec, state = self.host.spec, self.host.state
        scored, advantages = state.prefetched, state.prefetched_advantages
        if scored is None or scored.step != target:
            return None
        state.prefetched = state.prefetched_advantages = None
        staleness = (target - 1) - state.prefetched_policy
        if staleness <= spec.max_staleness:
            return scored, advantages
        state.dropped_stale_groups += scored.n_groups
        workflow.logger.info("step %d: dropped %d groups sampled by policy %d (staleness %d > max_staleness %d)",
                             target, scored.n_groups, state.prefetched_policy, staleness, spec.max_staleness)  # fmt: skip
        return None

    # --- training ----------------------------------------------------------------------------------

    async def _train(
        self, target: int, prepared: Prepared, last: Trained | None
    ) -> tuple[TrainResult, Prepared]:
        """Train ``target`` on the trainer that holds step ``target - 1``, or from its published checkpoint; the
        training, and the rollouts it trained on (rolled out again when a lost adapter sampled them)."""
        spec, state = self.host.spec, self.host.state
        step_input = self.host.train_step_input(target, prepared.scored)
        if self.servable_first:
            prepared = await self._on_lineage(target, prepared)

        def train_input(prepared: Prepared) -> TrainInput:
            return TrainInput(
                run_id=spec.run_id,
                step=target,
                model=step_input.model,
                advantages=prepared.advantages.ref,
                train=spec.train,
                chat_template_ref=step_input.chat_template_ref,
            )

        inp = train_input(prepared)
        if last is None:  # this execution's first step: from the served checkpoint, on any trainer
            start_from = state.checkpoint
        elif not last.result.staged_id:  # a trainer that does not name its stagings
            start_from = await last.resumable
        else:
            staged = StagedRef(run_id=spec.run_id, step=last.step, worker_id=last.result.worker_id,
                               staged_id=last.result.staged_id)  # fmt: skip
            queue = worker_task_queue(spec.task_queues.trainer, staged.worker_id)
            try:
                beside = await run_stage(TRAIN_BESIDE, inp.model_copy(update={"continue_from": staged}),
                                         task_queue=queue, step=target, result_type=TrainResult, reraise=True,
                                         scheduling=step_input.scheduling,
                                         heartbeat_s=step_input.heartbeat_timeout_s)  # fmt: skip
                return beside, prepared
            except ActivityError as err:
                if not (is_lost_worker(err) or is_staged_state_lost(err)):
                    raise stage_failure(TRAIN, target, err) from err
                workflow.logger.warning("step %d: trainer %s no longer holds step %d; training from checkpoint "
                                        "%d once it is published", target, staged.worker_id, last.step, last.step)  # fmt: skip
            start_from = await last.resumable
        if self.servable_first:  # waiting for that checkpoint may have found its adapter lost
            prepared = await self._on_lineage(target, prepared)
            inp = train_input(prepared)
        trained = await run_stage(TRAIN, inp.model_copy(update={"start_from": start_from}),
                                  task_queue=spec.task_queues.trainer, step=target, result_type=TrainResult,
                                  scheduling=step_input.scheduling,
                                  heartbeat_s=step_input.heartbeat_timeout_s)  # fmt: skip
        return trained, prepared

    async def _on_lineage(self, target: int, prepared: Prepared) -> Prepared:
        """``prepared``, unless an adapter the run no longer holds sampled it (lost with its trainer, its step
        trained again): then dropped, and step ``target`` rolled out again."""
        if self.beside.holds(prepared.scored, prepared.policy):
            return prepared
        state = self.host.state
        state.dropped_lost_adapter_groups += prepared.scored.n_groups
        workflow.logger.warning("step %d: dropped %d groups sampled by policy %d's adapter, lost with its trainer; "
                                "rolling out again", target, prepared.scored.n_groups, prepared.policy)  # fmt: skip
        return await self._prepare(target)

    def _carry_on_lineage(self) -> None:
        """Rollouts carried over a continue-as-new, unless a lost adapter sampled them (dropped)."""
        state = self.host.state
        if state.prefetched is None or self.beside.holds(state.prefetched, state.prefetched_policy):
            return
        state.dropped_lost_adapter_groups += state.prefetched.n_groups
        workflow.logger.warning("step %d: dropped %d groups sampled by an adapter lost with its trainer",
                                state.prefetched.step, state.prefetched.n_groups)  # fmt: skip
        state.prefetched = state.prefetched_advantages = None
