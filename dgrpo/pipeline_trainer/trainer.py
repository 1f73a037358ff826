"""``PipelineTrainer`` (ART 0.5's asynchronous trainer): a durable, pipelined ``TrainingRun`` workflow when the
workers can run its rollout, else ART's loop in this process (dgrpo/pipeline_trainer/in_process.py).

    trainer = PipelineTrainer(model, backend, make_group_rollout_fn(rollout, n=4), scenarios, None,
                              eval_fn=evaluate, min_batch_size=2, max_steps=10)
    await trainer.train()

As a ``TrainingRun``, ``train()`` starts (or, when it is already running, joins) the run of
``<project>-<name>`` in mode ``pipelined``: the inference workers roll out step n+1 while the trainer trains
step n, groups older than ``max_steps_off_policy`` policy versions are dropped, and a crash of this process,
a worker or a server costs a retry, not the run. A finished or failed run is started again and continues
after its newest checkpoint (so a higher ``max_steps`` trains further). ``eval_fn`` runs here, at the steps
ART would run it, and its trajectories are logged as ``val``. The workers import the rollout by its path, so
it must be ``make_group_rollout_fn`` of a module-level ``async def`` in a module the inference worker's
operator allows (``DGRPO_TASK_MODULES``), called ``rollout(model, scenario)`` with each scenario as a dict.

Any other rollout (a lambda, a closure, a group function, one needing this process's ``config``) runs in
this process, as ART runs it, each step trained through ``backend.train`` (a durable ``TrainStep``); a
warning says why it is not a ``TrainingRun``. ``durable=True`` refuses that instead, ``durable=False`` asks
for it.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from temporalio.client import WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy

from dgrpo.art_compat.options import train_config_fields
from dgrpo.client.training import ArtBackend
from dgrpo.errors import UnsupportedArtOption
from dgrpo.model import TrainableModel
from dgrpo.pipeline_trainer.checkpoint_retention import CheckpointRetentionStrategy, KeepRecentAndTop
from dgrpo.pipeline_trainer.in_process import EvalFn, GroupRollout, InProcessPipeline, PipelineSettings
from dgrpo.pipeline_trainer.runtime_options import ACCEPTED_AS_NONE, check_training_options, pipeline_sizes
from dgrpo.pipeline_tuner.config import PipelineAutotuneConfig, PipelineRuntimeConfig
from schemas.config import CheckpointsSpec, RunSpec, TaskSpec
from schemas.history_bounds import MAX_INLINE_SCENARIOS_BYTES
from schemas.run_state import RunStatus
from schemas.trajectory import Trajectory, TrajectoryGroup
from workers.temporal import across_restarts, result_across_restarts

log = logging.getLogger(__name__)

POLL_S = 2.0
"""How often ``train()`` asks the run for its step (to run ``eval_fn`` at the right steps)."""


@dataclass(frozen=True)
class GroupRolloutFn:
    """ART's ``make_group_rollout_fn(single_rollout_fn, n)``: ``n`` rollouts of one scenario form a group.

    Called here it is ART's group rollout; ``PipelineTrainer`` reads ``single`` and ``n`` from it instead
    (the workers run ``single`` ``n`` times per scenario).
    """

    single: Callable[..., Awaitable[Trajectory]]
    n: int

    async def __call__(self, model: TrainableModel, scenario: Any, config: Any) -> TrajectoryGroup:
        results = await asyncio.gather(
            *(self.single(model, scenario, config) for _ in range(self.n)), return_exceptions=True
        )
        return TrajectoryGroup(results)


def make_group_rollout_fn(
    single_rollout_fn: Callable[..., Awaitable[Trajectory]], n: int = 4
) -> GroupRolloutFn:
    """ART's helper: a group rollout that runs ``single_rollout_fn`` ``n`` times on one scenario."""
    if n < 2:
        raise UnsupportedArtOption(
            f"make_group_rollout_fn(n={n}): GRPO compares a group's rollouts; use n >= 2"
        )
    return GroupRolloutFn(single_rollout_fn, n)


class PipelineTrainer(InProcessPipeline):
    """ART's ``PipelineTrainer(model, backend, rollout_fn, scenarios, config, eval_fn=...)``; ``train()`` runs
    it as a durable pipelined ``TrainingRun`` when the workers can run the rollout, else in this process.

    ``durable``: True requires the ``TrainingRun`` (refused, saying why, when the rollout cannot cross to a
    worker); False runs the loop here; None (default) picks the ``TrainingRun`` when it can and says why not
    when it cannot.
    """

    def __init__(
        self,
        model: TrainableModel,
        backend: ArtBackend,
        rollout_fn: GroupRollout,
        scenarios: Iterable[Any] | AsyncIterator[Any] | str,
        config: Any,
        eval_fn: EvalFn | None = None,
        *,
        num_rollout_workers: int | None = None,
        min_batch_size: int | None = None,
        max_batch_size: int | None = None,
        max_steps_off_policy: int | None = 4,
        queue_maxsize: int | None = None,
        pipeline: PipelineRuntimeConfig | None = None,
        autotune: PipelineAutotuneConfig | None = None,
        limit_mean_steps_off_policy: float | None = None,
        kl_penalty_coef: float = 0.0,
        kl_penalty_step_lag: int | None = None,
        optimizer_save_interval: int = 5,
        learning_rate: float = 1e-5,
        loss_fn: str | None = None,
        normalize_advantages: bool = True,
        max_steps: int | None = None,
        discard_queue_multiplier: int = 100,
        eval_every_n_steps: int = 20,
        eval_at_start: bool = True,
        save_checkpoint: bool = True,
        resume: bool = True,
        checkpoint_retention_strategy: CheckpointRetentionStrategy | None = None,
        checkpoint_retention_interval: int = 1,
        durable: bool | None = None,
        **art_options: Any,
    ) -> None:
        sizes = pipeline_sizes(
            pipeline,
            autotune,
            {
                "num_rollout_workers": num_rollout_workers,
                "min_batch_size": min_batch_size,
                "max_batch_size": max_batch_size,
                "queue_maxsize": queue_maxsize,
            },
        )
        check_training_options(
            kl_penalty_coef=kl_penalty_coef,
            kl_penalty_step_lag=kl_penalty_step_lag,
            optimizer_save_interval=optimizer_save_interval,
            limit_mean_steps_off_policy=limit_mean_steps_off_policy,
            **{k: art_options.pop(k) for k in ACCEPTED_AS_NONE if k in art_options},
        )
        refuse_unsupported(save_checkpoint=save_checkpoint, resume=resume, **art_options)
        settings = PipelineSettings(
            num_rollout_workers=sizes.num_rollout_workers,
            min_batch_size=sizes.min_batch_size,
            max_batch_size=sizes.max_batch_size,
            max_steps_off_policy=max_steps_off_policy,
            limit_mean_steps_off_policy=limit_mean_steps_off_policy,
            queue_maxsize=sizes.queue_maxsize,
            max_steps=max_steps,
            eval_every_n_steps=eval_every_n_steps,
            eval_at_start=eval_at_start,
            discard_queue_multiplier=discard_queue_multiplier,
        )
        self.checkpoints = retention_spec(checkpoint_retention_strategy, checkpoint_retention_interval)
        self.durable = durable is not False
        if self.durable:
            try:
                refuse_in_a_run(limit_mean_steps_off_policy)
                self.rollout_path, scenarios = durable_task(rollout_fn, scenarios, config)
            except UnsupportedArtOption as why:
                if durable:
                    raise
                self.durable = False
                log.warning(
                    "PipelineTrainer runs in this process (rollouts here, each step a durable TrainStep through "
                    "backend.train), not as a durable TrainingRun, because %s",
                    why,
                )
        if not self.durable:
            scenarios = in_process_scenarios(scenarios, self.checkpoints)
        train_options = {"learning_rate": learning_rate, "loss_fn": loss_fn}
        if not normalize_advantages:
            train_options["normalize_advantages"] = False
        super().__init__(model, backend, rollout_fn, scenarios, config, eval_fn, settings, train_options)
        self.scenarios = scenarios
        self.groups_per_step = sizes.max_batch_size or sizes.min_batch_size
        self.max_staleness = max_steps_off_policy if max_steps_off_policy is not None else 1_000_000
        self.train_config = model.step_config(None, train_config_fields("PipelineTrainer", train_options))

    def run_spec(self) -> RunSpec:
        """The ``TrainingRun`` this trainer starts: the model's run id, mode ``pipelined``."""
        if not isinstance(self.rollout_fn, GroupRolloutFn) or not self.durable:
            raise UnsupportedArtOption(
                "this PipelineTrainer runs in this process (durable=False): no TrainingRun"
            )
        if self.settings.max_steps is not None:
            steps = self.settings.max_steps
        elif isinstance(self.scenarios, list):
            steps = math.ceil(
                len(self.scenarios) / self.groups_per_step
            )  # one pass, as ART stops when they end
        else:
            raise UnsupportedArtOption(
                "scenarios given as a path or 'module:function' have no length here: pass max_steps=..."
            )
        run_id, model = self.model.check_identity()
        return RunSpec(
            run_id=run_id,
            model=model,
            task=TaskSpec(
                rollout=self.rollout_path,
                scenarios=self.scenarios,
                rollout_concurrency=self.settings.num_rollout_workers * self.rollout_fn.n,
            ),
            steps=steps,
            groups_per_step=self.groups_per_step,
            group_size=self.rollout_fn.n,
            train=self.train_config,
            mode="pipelined",
            max_staleness=self.max_staleness,
            task_queues=self.backend.task_queues,
            checkpoints=self.checkpoints,
        )

    async def train(self, *, handle_signals: bool = True) -> RunStatus | None:
        """Start (or join) the run and wait for it, running ``eval_fn`` at its steps; returns its status.
        In this process (``durable`` False): run the loop, as ART's ``train`` (None)."""
        if not self.durable:
            await self.train_in_process(handle_signals)
            return None
        spec = self.run_spec()
        await self.backend.start()
        client = await self.backend.temporal_client()
        handle: WorkflowHandle[Any, RunStatus] = await client.start_workflow(
            "TrainingRun",
            spec,
            id=spec.run_id,
            task_queue=spec.task_queues.control,
            result_type=RunStatus,
            # One run per model: a running one is joined; a finished one continues after its newest checkpoint.
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )
        log.info(
            "PipelineTrainer: TrainingRun %s (run %s), %d steps", handle.id, handle.result_run_id, spec.steps
        )
        finished = asyncio.ensure_future(result_across_restarts(handle))
        evaluated: set[int] = set()
        try:
            while not finished.done():
                await asyncio.wait({finished}, timeout=POLL_S)
                if self.eval_fn is not None and not finished.done():
                    status = await across_restarts(
                        lambda: handle.query("status", result_type=RunStatus),
                        f"asking {handle.id} its status",
                    )
                    await self._maybe_eval(status, evaluated, final=False)
        finally:
            if not finished.done():
                finished.cancel()  # this process stops waiting; the run goes on without it
        status = finished.result()
        if self.eval_fn is not None:
            await self._maybe_eval(status, evaluated, final=True)
        return status

    async def _maybe_eval(self, status: RunStatus, evaluated: set[int], final: bool) -> None:
        step = status.step
        every = self.settings.eval_every_n_steps
        due = (
            (self.settings.eval_at_start and not evaluated)
            or final
            or (every > 0 and step > 0 and step % every == 0)
        )
        if not due or step in evaluated or status.adapter is None:
            return
        evaluated.add(step)
        self.model.use_served(step, status.adapter)
        await self.evaluate(step)


def refuse_in_a_run(limit_mean_steps_off_policy: float | None) -> None:
    """What a ``TrainingRun`` cannot do of ART 0.5.23's keywords (the loop in this process can)."""
    if limit_mean_steps_off_policy is not None:
        raise UnsupportedArtOption(
            f"limit_mean_steps_off_policy={limit_mean_steps_off_policy}: a TrainingRun drops a group by its oldest "
            "rollout's policy (max_steps_off_policy); the mean rule runs only in this process"
        )


def durable_task(
    rollout_fn: GroupRollout, scenarios: Any, config: Any
) -> tuple[str, list[dict[str, Any]] | str]:
    """The rollout's ``module:function`` and the scenarios as a ``TrainingRun`` carries them; raises
    ``UnsupportedArtOption`` saying why the workers could not run them."""
    if not isinstance(rollout_fn, GroupRolloutFn):
        raise UnsupportedArtOption(
            "a TrainingRun's rollouts run on the inference workers one trajectory at a time: it needs "
            "rollout_fn=make_group_rollout_fn(single_rollout_fn, n=...) (from dgrpo.pipeline_trainer), "
            f"not the group function {getattr(rollout_fn, '__name__', rollout_fn)!r}"
        )
    return rollout_path(rollout_fn.single, config), scenario_list(scenarios)


def in_process_scenarios(scenarios: Any, checkpoints: CheckpointsSpec) -> Iterable[Any] | AsyncIterator[Any]:
    """The scenarios of a loop in this process; what only a ``TrainingRun`` does is refused, saying why."""
    if isinstance(scenarios, str):
        raise UnsupportedArtOption(
            f"scenarios={scenarios!r}: a path or 'module:function' is read by a TrainingRun's workers; in this "
            "process pass the scenarios themselves"
        )
    if checkpoints != CheckpointsSpec():
        raise UnsupportedArtOption(
            "checkpoint_retention_strategy is applied by a TrainingRun's workers after each step; in this process "
            "call model.delete_checkpoints(...) between steps, or give a module-level rollout (a TrainingRun)"
        )
    return scenarios


def rollout_path(fn: Callable[..., Any], config: Any) -> str:
    """``module:function`` of a rollout the workers can import and call as ``fn(model, scenario)``."""
    name = getattr(fn, "__qualname__", "")
    if not inspect.iscoroutinefunction(fn) or "<" in name or "." in name:
        raise UnsupportedArtOption(
            f"the rollout {name or fn!r} must be a module-level `async def` (the inference workers import it "
            "by its path), not a lambda, a nested function or a method"
        )
    params = inspect.signature(fn).parameters
    try:
        inspect.signature(fn).bind(None, None)
    except TypeError:
        raise UnsupportedArtOption(
            f"the inference workers call {name}(model, scenario): they cannot pass this process's config. "
            "Give its third parameter a default, or move those settings into the scenarios"
        ) from None
    if config is not None and len(params) > 2:
        raise UnsupportedArtOption(
            f"{name} takes a config, but the inference workers call {name}(model, scenario) and cannot pass "
            "this process's config to it: pass config=None (put those settings in the scenarios), or drop "
            "the parameter (eval_fn still gets config)"
        )
    return f"{fn.__module__}:{name}"


def scenario_list(scenarios: Iterable[dict[str, Any]] | str) -> list[dict[str, Any]] | str:
    """The scenarios as the run spec carries them: a list of JSON objects, or a path the workers read."""
    if isinstance(scenarios, str):
        return scenarios
    if isinstance(scenarios, AsyncIterator | Iterator):
        raise UnsupportedArtOption(
            "a durable run needs its scenarios up front (a retried step must see the same ones): pass a list, "
            "or a .jsonl path / 'module:function' the inference workers read"
        )
    items = list(scenarios)
    bad = next((i for i, s in enumerate(items) if not isinstance(s, dict)), None)
    if bad is not None:
        raise UnsupportedArtOption(
            f"scenario {bad} is a {type(items[bad]).__name__}: the inference workers receive scenarios as JSON "
            "objects, so give dicts (e.g. `scenario.model_dump(mode='json')`) and read them as dicts"
        )
    size = len(json.dumps(items))
    if size > MAX_INLINE_SCENARIOS_BYTES:
        raise UnsupportedArtOption(
            f"the scenarios are {size:,} bytes of JSON, more than the run's own input may carry "
            f"({MAX_INLINE_SCENARIOS_BYTES:,}): write them to a .jsonl file under the inference worker's "
            "directory and pass its path as scenarios"
        )
    return items


def retention_spec(strategy: CheckpointRetentionStrategy | None, interval: int) -> CheckpointsSpec:
    """ART's retention strategy as the run's ``checkpoints`` setting (None keeps every checkpoint, as in ART)."""
    if interval <= 0:
        raise ValueError("checkpoint_retention_interval must be > 0")
    if strategy is None:
        return CheckpointsSpec()
    if not isinstance(strategy, KeepRecentAndTop):
        raise UnsupportedArtOption(
            "checkpoint_retention_strategy: the run's workers apply retention after each step and cannot call "
            "a function of this process; pass keep_recent_and_top(...) from dgrpo.pipeline_trainer"
        )
    if interval != 1:
        raise UnsupportedArtOption(
            f"checkpoint_retention_interval={interval}: a durable run applies retention after every step"
        )
    try:
        return strategy.as_checkpoints_spec()
    except ValueError as err:
        raise UnsupportedArtOption(str(err)) from None


def refuse_unsupported(*, save_checkpoint: bool, resume: bool, **art_options: Any) -> None:
    """ART's other keywords: accepted where they change nothing here, refused (saying why) otherwise."""
    if not save_checkpoint:
        raise UnsupportedArtOption(
            "save_checkpoint=False: every step of a durable run publishes its checkpoint (resume needs it)"
        )
    if not resume:
        raise UnsupportedArtOption(
            "resume=False: a run always continues after its newest checkpoint; start fresh under another "
            "model name, or delete the old run's checkpoints"
        )
    harmless = {
        "log_interval_seconds",
        "status_ewa_alpha",
        "total_scenarios",
        "score_reference_groups_per_step",
        "score_reference_rollouts_per_group",
    }
    unknown = sorted(set(art_options) - harmless)
    if unknown:
        raise UnsupportedArtOption(
            f"PipelineTrainer({', '.join(unknown)}=...) has no equivalent in the durable TrainingRun; "
            "leave it out (docs/art-compat.md)"
        )
