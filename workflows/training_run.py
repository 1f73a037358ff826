"""``TrainingRun``: a whole GRPO run as one workflow (continued-as-new every few steps).

Per step: rollouts (inference, in shards, merged on control) -> judge (control) -> advantages (control) ->
train (trainer) -> publish (trainer, same worker) -> reload (inference). The step counter advances once
the new adapter is served; the step's metrics and checkpoint retention (control) then run beside the next
step, in step order, and the run waits for them before it continues as new or ends. A fresh start (first run, or the same run id after a
terminate or a dead stack) finds the newest manifested checkpoint and continues after it; with none, it
publishes and serves step 0.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from schemas.activities import (
        JudgeInput,
        RolloutsInput,
        RunTextKind,
        RunTexts,
        StoreRunTextsInput,
        StoreScenariosInput,
    )
    from schemas.config import RunSpec, Scheduling, TaskSpec
    from schemas.errors import CONFIG_ERROR
    from schemas.history_bounds import RESAMPLES_WITHOUT_SIGNAL
    from schemas.layout import adapter_name
    from schemas.refs import ObjectRef, TrajectoriesRef
    from schemas.run_state import (
        MAX_HISTORY,
        Phase,
        RunState,
        RunStatus,
        ServeModelInput,
        StepSummary,
        TrainStepInput,
    )

from workflows.bookkeeping import Bookkeeping
from workflows.pipeline import Pipeline
from workflows.rollout_shards import roll_out_step
from workflows.servable import (
    SERVABLE_PATCH,
    ServedStep,
    StepServed,
    on_lineage,
    serve_adapter_first,
    until_resumable,
)
from workflows.serve_model import serve_newest
from workflows.stages import (
    JUDGE,
    STORE_RUN_TEXTS,
    STORE_SCENARIOS,
    NoLearningSignal,
    StageFailed,
    run_stage,
)
from workflows.step_chain import PhaseClock
from workflows.train_step import train_and_serve

BOOKKEEPING_PATCH = "bookkeeping-beside-next-step"
"""Runs whose history predates it log metrics and apply retention before the next step starts."""
HISTORY_BOUNDS_PATCH = "history-bounds-at-start"
"""A new run whose shape could outgrow Temporal's history limits fails at once (runs started before, or
continued as new, are not checked: they keep the bounds they started under)."""
PIPELINE_PATCH = "durability-beside-training"
"""Pipelined runs train step n+1 while step n publishes and reloads (workflows/pipeline.py); runs whose history
predates it train, publish and reload each step before the next one's training (until they continue as new)."""
SCENARIOS_REF_PATCH = "scenarios-by-reference"
"""A run stores its inline scenario list once and passes the rollouts activities its ref; runs whose history
predates it copy the list into every rollouts activity's input (until they continue as new)."""
RUN_TEXTS_REF_PATCH = "run-texts-by-reference"
"""A run stores its own chat template and its judge rubric once and passes the rollouts, judge and train
activities their refs; runs whose history predates it copy them into every such input (until they continue as
new)."""


@workflow.defn(name="TrainingRun", failure_exception_types=[ValidationError])
class TrainingRun:
    """Query ``status``; updates ``pause``, ``resume``, ``stop`` (both act at a step boundary)."""

    def __init__(self) -> None:
        self._spec: RunSpec | None = None
        self._state = RunState()
        self._phase: Phase = "starting"
        self._working_on: int | None = None
        self._phase_seconds: dict[str, float] = {}
        self._error: str | None = None
        self._policy_by_step: dict[int, int] = {}
        self._bookkeeping: Bookkeeping | None = None
        """The served steps' metrics and retention (workflows/bookkeeping.py)."""
        self._servable_first = False
        """``servable-before-resumable``: a step is served from its adapter; the rest is written beside."""
        self._pending: ServedStep | None = None
        """Sync mode: the served step whose checkpoint is not known to be resumable yet."""

    # --- control ---------------------------------------------------------------------------------

    @workflow.query
    def status(self) -> RunStatus:
        spec, s = self._spec, self._state
        return RunStatus(
            run_id=spec.run_id if spec else workflow.info().workflow_id,
            mode=spec.mode if spec else "sync",
            steps=spec.steps if spec else 0,
            step=s.step,
            phase=self._phase,
            working_on=self._working_on,
            paused=s.paused,
            stopping=s.stopping,
            last_checkpoint=s.checkpoint,
            adapter=s.adapter,
            history=s.history,
            dropped_stale_groups=s.dropped_stale_groups,
            dropped_lost_adapter_groups=s.dropped_lost_adapter_groups,
            phase_seconds=dict(self._phase_seconds),
            error=self._error,
            scheduling=spec.scheduling() if spec else Scheduling(),
        )

    @workflow.update
    def pause(self) -> RunStatus:
        """Pause at the next step boundary (the step in progress finishes)."""
        self._state.paused = True
        return self.status()

    @workflow.update
    def resume(self) -> RunStatus:
        self._state.paused = False
        return self.status()

    @workflow.update
    def stop(self) -> RunStatus:
        """Stop gracefully at the next step boundary; the run completes with the steps done so far."""
        self._state.stopping = True
        return self.status()

    def _enter(self, phase: str) -> None:
        self._phase = phase  # type: ignore[assignment]
        self._phase_seconds = {}

    # --- the run ---------------------------------------------------------------------------------

    @workflow.run
    async def run(self, spec: RunSpec, state: RunState | None = None) -> RunStatus:
        if isinstance(spec, dict):
            # Started with the spec alone (the CLI, `temporal workflow start`): the SDK only applies type
            # hints when every parameter has a payload, so validate here (a bad spec fails the run).
            spec = RunSpec.model_validate(spec)
        self._spec = spec
        for line in spec.deprecations():
            workflow.logger.warning("run %s: %s", spec.run_id, line)
        if spec.mode == "pipelined" and spec.shared_device:
            raise ApplicationError(
                "mode 'pipelined' needs dedicated inference and trainer devices, but shared_device is true; "
                "use mode 'shared' or 'sync'",
                type=CONFIG_ERROR,
                non_retryable=True,
            )
        if state is None and workflow.patched(HISTORY_BOUNDS_PATCH):
            too_big = spec.history_bounds_error()  # a new run only: one in flight keeps its bounds
            if too_big:
                raise ApplicationError(f"run {spec.run_id}: {too_big}", type=CONFIG_ERROR, non_retryable=True)
        try:
            if state is None:
                await self._start_or_recover()
            else:
                self._state = state
            await self._store_scenarios()
            await self._store_texts()
            await self._loop()
        except (StageFailed, NoLearningSignal) as err:
            self._error = err.message
            if self._pending is not None:  # the served step's optimizer state is written all the same
                await workflow.wait([self._pending.resumable])
            await self._settle_bookkeeping()  # the served steps' metrics are logged all the same
            self._phase = "failed"
            raise
        await self._settle_bookkeeping()
        await workflow.wait_condition(workflow.all_handlers_finished)
        self._phase = "stopped" if self._state.step < spec.steps else "done"
        self._working_on = None
        return self.status()

    async def _start_or_recover(self) -> None:
        spec = self._require_spec()
        self._enter("starting")
        served = await serve_newest(
            ServeModelInput(
                run_id=spec.run_id,
                model=spec.model,
                serving=spec.serving,
                task_queues=spec.task_queues,
                seed=spec.train.seed,
                shared=spec.mode == "shared",
                bucket=spec.storage.bucket,
                scheduling=spec.scheduling(),
                heartbeat_timeout_s=spec.heartbeat_timeout_s,
            ),
            self._enter,
        )
        self._state.step, self._state.checkpoint, self._state.adapter = (
            served.step,
            served.checkpoint,
            served.adapter,
        )
        self._state.adapter_sha256 = served.adapter_sha256

    async def _store_scenarios(self) -> None:
        """Store an inline scenario list once (a run continued as new carries its ref in its state)."""
        spec, state = self._require_spec(), self._state
        scenarios = spec.task.scenarios
        if not isinstance(scenarios, list) or state.scenarios is not None:
            return
        if workflow.patched(SCENARIOS_REF_PATCH):
            state.scenarios = await run_stage(
                STORE_SCENARIOS,
                StoreScenariosInput(run_id=spec.run_id, scenarios=scenarios),
                task_queue=spec.task_queues.control,
                step=state.step,
                scheduling=spec.scheduling(),
                heartbeat_s=spec.heartbeat_timeout_s,
                result_type=ObjectRef,
                summary="store the inline scenarios",
            )

    async def _store_texts(self) -> None:
        """Store the run's chat template and judge rubric once (a run continued as new carries their refs)."""
        spec, state = self._require_spec(), self._state
        texts: dict[RunTextKind, str] = {}
        if spec.model.chat_template is not None:
            texts["chat_template"] = spec.model.chat_template
        if spec.judge.rubric is not None and spec.judge.kind != "rollout":
            texts["rubric"] = spec.judge.rubric
        if not texts or state.texts is not None:
            return
        if workflow.patched(RUN_TEXTS_REF_PATCH):
            state.texts = await run_stage(
                STORE_RUN_TEXTS,
                StoreRunTextsInput(run_id=spec.run_id, texts=texts),
                task_queue=spec.task_queues.control,
                step=state.step,
                scheduling=spec.scheduling(),
                heartbeat_s=spec.heartbeat_timeout_s,
                result_type=RunTexts,
                summary="store the chat template and rubric",
            )

    def _texts(self) -> RunTexts:
        return self._state.texts or RunTexts()

    def _rollout_task(self) -> TaskSpec:
        """The task as the rollouts activities get it: an inline list as its stored copy's ref."""
        spec, stored = self._require_spec(), self._state.scenarios
        return spec.task if stored is None else spec.task.model_copy(update={"scenarios": stored})

    def _require_spec(self) -> RunSpec:
        assert self._spec is not None
        return self._spec

    # --- what the pipeline (workflows/pipeline.py) asks of the run --------------------------------------

    @property
    def spec(self) -> RunSpec:
        return self._require_spec()

    @property
    def state(self) -> RunState:
        return self._state

    async def roll_out(self, target: int, policy_step: int, resample: int) -> TrajectoriesRef:
        return await self._rollouts_and_judge(target, policy_step, track=False, resample=resample)

    def step_served(self, summary: StepSummary, scored: TrajectoriesRef) -> None:
        self._books().beside(summary, scored)

    def working(self, phase: str, step: int | None) -> None:
        self._phase, self._working_on = phase, step  # type: ignore[assignment]

    def train_step_input(self, target: int, scored: TrajectoriesRef) -> TrainStepInput:
        return self._train_step_input(target, scored)

    async def _loop(self) -> None:
        spec, state = self._require_spec(), self._state
        if spec.mode == "pipelined" and workflow.patched(PIPELINE_PATCH):
            self._servable_first = self._books().keep_when_deleting = workflow.patched(SERVABLE_PATCH)
            if await Pipeline(self, self._servable_first).run():
                await self._settle_bookkeeping()
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(args=[spec, state])
            return
        self._servable_first = spec.mode != "pipelined" and workflow.patched(SERVABLE_PATCH)
        self._books().keep_when_deleting = self._servable_first
        steps_this_run = 0
        prefetch: asyncio.Task[TrajectoriesRef] | None = None
        while state.step < spec.steps:
            if state.stopping:
                break
            if prefetch is not None:
                state.prefetched = await prefetch
                prefetch = None
            if state.paused:
                self._enter("paused")
                self._working_on = None
                await workflow.wait_condition(lambda: not state.paused or state.stopping)
                if state.stopping:
                    break
            if steps_this_run >= spec.continue_as_new_every:
                if (
                    self._servable_first and state.prefetched is None
                ):  # beside the served step's optimizer state
                    target = state.step + 1
                    scored = await self._rollouts_and_judge(target, policy_step=state.step, track=True)
                    state.prefetched = await self._from_resumable(target, scored)
                    state.prefetched_policy = state.step
                await self._settle_resumable()
                await self._settle_bookkeeping()
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(args=[spec, state])
            prefetch = await self._step(state.step + 1)
            steps_this_run += 1
        if prefetch is not None:
            prefetch.cancel()
        await self._settle_resumable()

    async def _step(self, target: int) -> asyncio.Task[TrajectoriesRef] | None:
        """Produce and serve step ``target``; in pipelined mode returns the next step's rollouts, running."""
        spec, state = self._require_spec(), self._state
        self._working_on = target
        self._phase_seconds = {}
        started = workflow.now()
        scored = self._take_prefetched(target)
        if scored is None:
            scored = await self._rollouts_and_judge(target, policy_step=state.step, track=True)
        if self._servable_first:  # the served step's optimizer state went up beside these rollouts
            scored = await self._from_resumable(target, scored)
        prefetch: asyncio.Task[TrajectoriesRef] | None = None
        if spec.mode == "pipelined" and target < spec.steps and not state.stopping:
            prefetch = asyncio.create_task(self._rollouts_and_judge(target + 1, state.step, track=False))
        resampled = 0
        while True:
            try:
                inp = self._train_step_input(target, scored)
                if self._servable_first:
                    served = await serve_adapter_first(inp, self._on_chain_phase)
                    result = served.result()
                else:
                    result = StepServed.of(await train_and_serve(inp, self._on_chain_phase))
                break
            except NoLearningSignal as err:
                if resampled >= RESAMPLES_WITHOUT_SIGNAL:
                    self._error = err.message
                    raise
                resampled += 1
                workflow.logger.info("%s; rolling out other scenarios (%d)", err.message, resampled)
                scored = await self._rollouts_and_judge(target, state.step, track=True, resample=resampled)
        self._phase_seconds.update(result.seconds)
        summary = StepSummary(
            step=target,
            reward_mean=scored.reward_mean,
            reward_std=scored.reward_std,
            n_trajectories=scored.n_trajectories,
            n_exceptions=scored.n_exceptions,
            n_groups_zero_variance=result.n_groups_zero_variance,
            policy_step=self._policy_of(scored),
            loss=result.loss,
            checkpoint=result.checkpoint,
            resampled=resampled,
            seconds={**self._phase_seconds, "step": (workflow.now() - started).total_seconds()},
            train_metrics=result.metrics,
            adapter_sha256=result.adapter_sha256,
        )
        # The step advances only now: its adapter is served (its checkpoint resumable later, servable first).
        state.step, state.adapter, state.adapter_sha256 = target, result.adapter, result.adapter_sha256
        if self._servable_first:
            self._pending = served
        else:
            state.checkpoint = result.checkpoint
        state.history = [*state.history, summary][-MAX_HISTORY:]
        await self._after_step(summary, scored)
        return prefetch

    async def _from_resumable(self, target: int, scored: TrajectoriesRef) -> TrajectoriesRef:
        """Wait until the served step's checkpoint is resumable (trained again and served again when its trainer
        vanished first); rollouts for ``target`` that its lost adapter sampled are dropped and rolled out again."""
        state = self._state
        await self._settle_resumable()
        if on_lineage(scored, state.adapter_sha256):
            return scored
        state.dropped_lost_adapter_groups += scored.n_groups
        workflow.logger.warning("step %d: dropped %d groups sampled by an adapter lost with its trainer; rolling "
                                "out again with policy %d", target, scored.n_groups, state.step)  # fmt: skip
        return await self._rollouts_and_judge(target, policy_step=state.step, track=True)

    async def _settle_resumable(self) -> None:
        """The served step's checkpoint resumable: the run's ``checkpoint``, and its summary's."""
        served, state = self._pending, self._state
        if served is None:
            return
        again = await until_resumable(served, PhaseClock(self._on_chain_phase))
        self._pending = None
        assert served.checkpoint is not None
        state.checkpoint = served.checkpoint
        update: dict[str, Any] = {"checkpoint": served.checkpoint}
        if again is not None:  # trained again: another adapter, served now
            state.adapter_sha256 = again.adapter_sha256
            update.update(trained_again=True, adapter_sha256=again.adapter_sha256, loss=served.trained.loss)
        state.history = [h.model_copy(update=update) if h.step == served.step else h for h in state.history]

    async def _after_step(self, summary: StepSummary, scored: TrajectoriesRef) -> None:
        """Log the served step's metrics, then apply retention: beside the next step, after the previous
        step's (retention may pick the best checkpoint by the metrics)."""
        if workflow.patched(BOOKKEEPING_PATCH):
            self._books().beside(summary, scored)
        else:
            self._phase = "metrics"
            await self._books().after(summary, scored)

    def _books(self) -> Bookkeeping:
        if self._bookkeeping is None:
            self._bookkeeping = Bookkeeping(self._require_spec(), lambda: self._state, self._policy_by_step)
        return self._bookkeeping

    async def _settle_bookkeeping(self) -> None:
        """Wait for the served steps' metrics and retention."""
        books = self._books()
        if books.pending is not None and not books.pending.done():
            self._phase = "metrics"
        await books.settle()

    def _on_chain_phase(self, phase: str) -> None:
        self._phase = phase  # type: ignore[assignment]

    def _policy_of(self, scored: TrajectoriesRef) -> int:
        return self._policy_by_step.get(scored.step, max(scored.step - 1, 0))

    def _take_prefetched(self, target: int) -> TrajectoriesRef | None:
        """The pipelined rollouts made for ``target``, unless their policy is too stale (then dropped)."""
        spec, state = self._require_spec(), self._state
        scored, policy = state.prefetched, state.prefetched_policy
        state.prefetched = None
        if scored is None or scored.step != target:
            return None
        staleness = (target - 1) - policy
        if staleness > spec.max_staleness:
            state.dropped_stale_groups += scored.n_groups
            workflow.logger.info(
                "step %d: dropped %d groups sampled by policy %d (staleness %d > max_staleness %d)",
                target,
                scored.n_groups,
                policy,
                staleness,
                spec.max_staleness,
            )
            return None
        self._policy_by_step[target] = policy
        return scored

    def _train_step_input(self, target: int, scored: TrajectoriesRef) -> TrainStepInput:
        spec, template = self._require_spec(), self._texts().chat_template
        return TrainStepInput(
            run_id=spec.run_id,
            model=spec.model if template is None else spec.model.model_copy(update={"chat_template": None}),
            chat_template_ref=template,
            trajectories=scored,
            train=spec.train,
            step=target,
            start_from=self._state.checkpoint,
            serving=spec.serving,
            task_queues=spec.task_queues,
            shared_device=spec.mode == "shared",
            scheduling=spec.scheduling(),
            heartbeat_timeout_s=spec.heartbeat_timeout_s,
        )

    async def _rollouts_and_judge(
        self, target: int, policy_step: int, track: bool, resample: int = 0
    ) -> TrajectoriesRef:
        spec, state = self._require_spec(), self._state
        self._policy_by_step[target] = policy_step
        if track:
            self._phase = "rollouts"
        started = workflow.now()
        scored = await roll_out_step(
            RolloutsInput(
                run_id=spec.run_id,
                step=target,
                model_name=spec.model.name,
                chat_template=spec.model.chat_template if self._texts().chat_template is None else None,
                chat_template_ref=self._texts().chat_template,
                adapter=adapter_name(spec.run_id, policy_step) if state.adapter else None,
                policy_step=policy_step,
                task=self._rollout_task(),
                groups_per_step=spec.groups_per_step,
                group_size=spec.group_size,
                scenario_offset=(target - 1) * spec.groups_per_step,
                # A resample draws other scenarios (the scenario order is seeded).
                seed=spec.seed + 7919 * resample,
            ),
            spec.groups_per_shard,
            spec.task_queues,
            spec.scheduling(),
            spec.heartbeat_timeout_s,
        )
        if spec.judge.kind != "rollout":
            if track:
                self._phase = "judge"
            scored = await run_stage(
                JUDGE,
                JudgeInput(
                    run_id=spec.run_id,
                    step=target,
                    trajectories=scored,
                    judge=spec.judge
                    if self._texts().rubric is None
                    else spec.judge.model_copy(update={"rubric": None}),
                    base_model_name=spec.model.base_model,
                    rubric_ref=self._texts().rubric,
                ),
                task_queue=spec.task_queues.control,
                step=target,
                scheduling=spec.scheduling(),
                heartbeat_s=spec.heartbeat_timeout_s,
                result_type=TrajectoriesRef,
            )
        if track:
            self._phase_seconds["rollouts"] = (workflow.now() - started).total_seconds()
        else:
            state.prefetched_policy = policy_step
        return scored
