"""ART's ``PipelineTrainer`` loop run in this process: rollouts here, each step a durable ``TrainStep``.

Three asyncio stages share one queue of groups. ``num_rollout_workers`` rollout workers each take the next
scenario, wait until the served policy is at most ``max_steps_off_policy`` steps behind the step being
trained, and put the group their ``rollout_fn`` returns on the queue. The training stage takes a batch
(``min_batch_size`` groups, then as many more as are ready up to ``max_batch_size``), drops groups older
than the off-policy limit and groups with nothing to learn (equal rewards, logged as split ``discarded``),
trains it with ``backend.train`` (a durable ``TrainStep`` workflow) and logs it with ``model.log``. The eval
stage runs ``eval_fn`` at the steps it is due, beside training.

This is the mode for a rollout the workers cannot import (a lambda, a closure, one that needs this process's
``config``); dgrpo/pipeline_trainer/trainer.py picks it. A crash of this process ends the loop (each step
already trained stays trained); a durable ``TrainingRun`` is the mode that survives it.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from dgrpo.client.training import ArtBackend
from dgrpo.metrics_taxonomy import trainable
from dgrpo.model import TrainableModel
from dgrpo.pipeline_trainer.groups import (
    as_groups,
    label_group,
    policy_version_of,
    refuse_all_failed,
    steps_off_policy,
)
from schemas.trajectory import Trajectory, TrajectoryGroup

log = logging.getLogger(__name__)

EvalResult = Sequence[Trajectory | TrajectoryGroup] | Mapping[str, Sequence[Trajectory | TrajectoryGroup]]
EvalFn = Callable[[TrainableModel, int, Any], Awaitable[EvalResult]]
GroupRollout = Callable[[TrainableModel, Any, Any], Awaitable[TrajectoryGroup]]

DISCARDED_LOGGED = 50
"""At most this many zero-variance groups are logged (split ``discarded``) per step, as in ART."""


@dataclass(frozen=True)
class PipelineSettings:
    """ART's ``PipelineTrainer`` numbers, checked as ART checks them."""

    num_rollout_workers: int = 16
    min_batch_size: int = 4
    max_batch_size: int | None = None
    """None: ten times ``min_batch_size`` in this process (ART's); ``min_batch_size`` in a ``TrainingRun``."""
    max_steps_off_policy: int | None = 4
    """How many steps a group's policy may lag the step it trains; None: no limit."""
    limit_mean_steps_off_policy: float | None = None
    """ART 0.5.23's: how many steps its trajectories' policies may lag on average (each trajectory counted
    once; ART weighs them by their tokens); None: no limit."""
    queue_maxsize: int | None = None
    max_steps: int | None = None
    eval_every_n_steps: int = 20
    eval_at_start: bool = True
    discard_queue_multiplier: int = 100
    """Training stops when this many times ``min_batch_size`` groups in a row had nothing to learn."""

    def __post_init__(self) -> None:
        for name in ("num_rollout_workers", "min_batch_size", "discard_queue_multiplier"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        for name in ("max_batch_size", "queue_maxsize"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0")
        for name in ("max_steps_off_policy", "max_steps", "eval_every_n_steps"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.max_batch_size is not None and self.max_batch_size < self.min_batch_size:
            raise ValueError("max_batch_size must be >= min_batch_size")

    @property
    def batch_limit(self) -> int:
        return self.max_batch_size or 10 * self.min_batch_size

    @property
    def queue_size(self) -> int:
        """Groups the rollouts may have ready ahead of training."""
        ahead = (self.max_steps_off_policy or 1) * self.batch_limit
        return self.queue_maxsize or max(1, ahead)


@dataclass
class PipelineState:
    """What the stages share."""

    policy_version: int = 0
    """The newest trained step, which the rollouts sample."""
    next_training_step: int = 0
    """The step being trained (the policy version once it is done)."""
    last_eval_step: int = 0
    discarded_stale_groups: int = 0
    """Groups dropped for being too far off-policy, since the start."""
    done: bool = False
    policy_updated: asyncio.Condition = field(default_factory=asyncio.Condition)


class InProcessPipeline:
    """The stages; ``PipelineTrainer`` is one (dgrpo/pipeline_trainer/trainer.py)."""

    def __init__(
        self,
        model: TrainableModel,
        backend: ArtBackend,
        rollout_fn: GroupRollout,
        scenarios: Iterable[Any] | AsyncIterator[Any],
        config: Any,
        eval_fn: EvalFn | None,
        settings: PipelineSettings,
        train_options: dict[str, Any],
    ) -> None:
        self.model = model
        self.backend = backend
        self.rollout_fn = rollout_fn
        self.config = config
        self.eval_fn = eval_fn
        self.settings = settings
        self.train_options = train_options
        """``backend.train``'s keywords for every step."""
        self.state = PipelineState()
        self._scenarios = scenarios
        self._scenario_iter: AsyncIterator[Any] | None = None
        self._output_queue: asyncio.Queue[TrajectoryGroup | None] | None = None
        self._eval_queue: asyncio.Queue[int | None] | None = None
        self._zero_variance: list[TrajectoryGroup] = []
        self._rollout_seconds: dict[int, float] = {}
        """Each queued group's rollout time, by ``id``, until its batch is logged."""
        self._stopping: asyncio.Future[None] | None = None

    async def train_in_process(self, handle_signals: bool = True) -> None:
        """Run the stages until the scenarios or ``max_steps`` run out, a stop is requested, or a stage fails."""
        await self.run_stages(await self.model.get_step(), handle_signals)

    async def run_stages(self, start: int, handle_signals: bool = False) -> None:
        """The stages from step ``start`` (the model's newest step) until they end."""
        self.state = PipelineState(policy_version=start, next_training_step=start, last_eval_step=start)
        self._output_queue = asyncio.Queue(maxsize=self.settings.queue_size)
        self._eval_queue = asyncio.Queue()
        if self.eval_fn is not None and self.settings.eval_at_start:
            self._eval_queue.put_nowait(start)
        with stop_on_signals(self.request_stop, handle_signals):
            async with asyncio.TaskGroup() as tasks:
                rollouts = tasks.create_task(self._rollout_stage())
                tasks.create_task(self._eval_stage())
                training = tasks.create_task(self._training_stage())
                # Training ended (its steps, or no more groups): rollouts still running would train nothing.
                training.add_done_callback(lambda _: rollouts.cancel())

    def request_stop(self) -> None:
        """Finish the step in training, then stop (SIGINT and SIGTERM ask this when ``handle_signals``)."""
        if self.state.done:
            return
        self.state.done = True
        if self._output_queue is not None:  # the end mark wakes a training stage waiting for groups
            try:
                self._output_queue.put_nowait(None)
            except asyncio.QueueFull:
                self._stopping = asyncio.ensure_future(self._output_queue.put(None))

    # ---- rollouts ---------------------------------------------------------------------------------
    async def _rollout_stage(self) -> None:
        async with asyncio.TaskGroup() as workers:
            for worker in range(self.settings.num_rollout_workers):
                workers.create_task(self._rollout_worker(worker))
        assert self._output_queue is not None
        await self._output_queue.put(None)  # the scenarios ran out: train what is queued, then stop

    async def _next_scenario(self) -> tuple[bool, Any]:
        if self._scenario_iter is None:
            self._scenario_iter = as_async_iterator(self._scenarios)
        try:
            return True, await anext(self._scenario_iter)
        except StopAsyncIteration:
            return False, None

    async def _rollout_worker(self, worker_id: int) -> None:
        assert self._output_queue is not None
        while not self.state.done:
            more, scenario = await self._next_scenario()
            if not more:
                return
            await self._wait_for_policy()
            if self.state.done:
                return
            version = self.state.policy_version
            began = time.monotonic()
            token = self.model.activate_metrics_context("train")
            try:
                group = await self.rollout_fn(self.model, scenario, self.config)
            except Exception as err:  # as in ART: one scenario's failure costs that scenario only
                log.warning(
                    "rollout worker %d: scenario %r failed: %s: %s",
                    worker_id,
                    scenario,
                    type(err).__name__,
                    err,
                )
                continue
            finally:
                token.var.reset(token)
            if not isinstance(group, TrajectoryGroup):
                log.warning("rollout_fn returned %s, not a TrajectoryGroup; dropped", type(group).__name__)
                continue
            label_group(group, scenario, version, self.state.policy_version)
            self._rollout_seconds[id(group)] = time.monotonic() - began
            await self._output_queue.put(group)

    async def _wait_for_policy(self) -> None:
        """Until the served policy is within ``max_steps_off_policy`` of the step being trained."""
        lag = self.settings.max_steps_off_policy
        if lag is None:
            return
        async with self.state.policy_updated:
            await self.state.policy_updated.wait_for(
                lambda: self.state.done or self.state.policy_version >= self.state.next_training_step - lag
            )

    # ---- training ---------------------------------------------------------------------------------
    async def _collect_batch(self, current_step: int) -> tuple[list[TrajectoryGroup], int, bool]:
        """The next batch, the number of stale groups dropped, and whether the queue's end was reached."""
        assert self._output_queue is not None
        batch: list[TrajectoryGroup] = []
        stale = 0
        while len(batch) < self.settings.batch_limit:
            if len(batch) < self.settings.min_batch_size:
                group = await self._output_queue.get()
            else:
                try:
                    group = self._output_queue.get_nowait()
                except asyncio.QueueEmpty:
                    break
            if group is None:
                return batch, stale, True
            refuse_all_failed(group)
            if self._is_stale(group, current_step):
                stale += 1
                self._rollout_seconds.pop(id(group), None)
            elif not trainable(group):
                self._zero_variance.append(group)
                self._rollout_seconds.pop(id(group), None)
                if (
                    len(self._zero_variance)
                    >= self.settings.discard_queue_multiplier * self.settings.min_batch_size
                ):
                    self._stop_for_collapse()
                    return [], stale, False
            else:
                batch.append(group)
        return batch, stale, False

    def _is_stale(self, group: TrajectoryGroup, current_step: int) -> bool:
        lag = self.settings.max_steps_off_policy
        version = policy_version_of(group)
        if lag is not None and version is not None and version < current_step - lag:
            return True
        mean_limit = self.settings.limit_mean_steps_off_policy
        ages = [current_step - v for t in group.trajectories if (v := t.initial_policy_version) is not None]
        return mean_limit is not None and bool(ages) and sum(ages) / len(ages) > mean_limit

    def _stop_for_collapse(self) -> None:
        log.error(
            "PipelineTrainer stopped: %d groups in a row had equal rewards (nothing to learn), so the policy "
            "may have collapsed. Lower the learning rate, check that the reward separates rollouts and that the "
            "scenarios vary, or raise discard_queue_multiplier (now %d) to go on",
            len(self._zero_variance),
            self.settings.discard_queue_multiplier,
        )
        self.state.done = True

    async def _training_stage(self) -> None:
        assert self._output_queue is not None
        step = self.state.next_training_step
        last = None if self.settings.max_steps is None else step + self.settings.max_steps
        try:
            while not self.state.done and (last is None or step < last):
                began = time.monotonic()
                batch, stale, ended = await self._collect_batch(step)
                waited = time.monotonic() - began
                self.state.discarded_stale_groups += stale
                if not batch:
                    break
                await self._set_policy(self.state.policy_version, step + 1)
                training_began = time.monotonic()
                result = await self.backend.train(self.model, batch, **self.train_options)
                trained_s = time.monotonic() - training_began
                step = result.step
                await self._set_policy(step, step)
                metrics = {
                    "discarded_stale_groups": float(self.state.discarded_stale_groups),
                    "steps_off_policy": steps_off_policy(batch, step),
                    "time/step_wall_s": time.monotonic() - began,
                    "time/step_trainer_s": trained_s,
                    "throughput/step_trainer_idle_s": waited,
                }
                rollout_s = sum(self._rollout_seconds.pop(id(g), 0.0) for g in batch)
                if rollout_s > 0:
                    metrics["time/step_actor_s"] = rollout_s
                metrics.update(result.metrics)
                await self.model.log(batch, split="train", step=step, metrics=metrics)
                await self._log_zero_variance(step)
                if self._eval_due(step):
                    self.state.last_eval_step = step
                    assert self._eval_queue is not None
                    self._eval_queue.put_nowait(step)
                if ended:
                    break
        finally:
            self.state.done = True
            await self._set_policy(self.state.policy_version, self.state.next_training_step)
            if self._eval_queue is not None:
                self._eval_queue.put_nowait(None)  # the eval stage finishes what is queued, then ends

    async def _set_policy(self, version: int, next_step: int) -> None:
        async with self.state.policy_updated:
            self.state.policy_version, self.state.next_training_step = version, next_step
            self.state.policy_updated.notify_all()

    async def _log_zero_variance(self, step: int) -> None:
        if self._zero_variance:
            await self.model.log(self._zero_variance[:DISCARDED_LOGGED], split="discarded", step=step)
            self._zero_variance.clear()

    def _eval_due(self, step: int) -> bool:
        every = self.settings.eval_every_n_steps
        return self.eval_fn is not None and every > 0 and step - self.state.last_eval_step >= every

    # ---- evals ------------------------------------------------------------------------------------
    async def _eval_stage(self) -> None:
        if self.eval_fn is None or self._eval_queue is None:
            return
        while (step := await self._eval_queue.get()) is not None:
            await self._run_eval(step)

    async def _run_eval(self, step: int) -> None:
        try:
            await self.evaluate(step)
        except Exception as err:  # as in ART: a failed eval is reported, training goes on
            log.warning("eval at step %d failed: %s: %s", step, type(err).__name__, err)

    async def evaluate(self, step: int) -> None:
        """Run ``eval_fn`` at ``step`` and log each split it returns (a list: ``val``)."""
        assert self.eval_fn is not None
        token = self.model.activate_metrics_context("eval")
        began = time.monotonic()
        try:
            results = await self.eval_fn(self.model, step, self.config)
        finally:
            token.var.reset(token)
        timing: dict[str, float] | None = {"time/step_eval_s": time.monotonic() - began}
        splits = results if isinstance(results, Mapping) else {"val": results}
        for split, items in splits.items():
            groups = as_groups(items)
            if groups:
                await self.model.log(groups, split=split, step=step, metrics=timing)
                timing = None  # the eval's time is logged once


def as_async_iterator(items: Iterable[Any] | AsyncIterator[Any]) -> AsyncIterator[Any]:
    if isinstance(items, AsyncIterator):
        return items

    async def each() -> AsyncIterator[Any]:
        for item in items:
            yield item

    return each()


@contextmanager
def stop_on_signals(stop: Callable[[], None], enabled: bool) -> Iterator[None]:
    """While inside, SIGINT and SIGTERM call ``stop`` (where this loop may handle signals)."""
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM) if enabled else ():
        try:
            loop.add_signal_handler(sig, stop)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no such signals
            pass
    try:
        yield
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
