"""Servable before resumable: a trained step's adapter reaches the servers while its optimizer state uploads.

A checkpoint has two levels of done (docs/pipelining.md#servable-before-resumable): *servable* once its adapter's
files and adapter manifest are written (``publish_adapter``), *resumable* once everything is, the checkpoint's
manifest last (``publish``, which does not upload the adapter again). The reload needs servable only; training
from a checkpoint, resume, retention and the ART client trust resumable only. So a step runs train ->
publish_adapter -> reload, and its optimizer and trainer state go up beside what follows (the next rollouts in
sync mode; workflows/pipeline.py does the same beside the next training).

If the trainer holding the step vanishes in between (served, not resumable), the step is trained again from the
newest resumable checkpoint (exactly: adapter, optimizer state and RNG) on the same advantages, and served
again. Trained again, it is another adapter (another ``adapter_sha256``) unless it comes out bit for bit the
same; rollouts carry the sha256 of the adapter that sampled them (``TrajectoriesRef.policy_adapters``), and
those sampled by an adapter the run no longer holds are dropped and rolled out again (``on_lineage``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from schemas.activities import AdvantagesResult, PublishInput, ReloadResult, TrainResult
    from schemas.refs import AdapterRef, CheckpointRef, TrajectoriesRef
    from schemas.run_state import TrainStepInput, TrainStepResult

from workflows.stages import PUBLISH_ADAPTER
from workflows.step_chain import (
    PhaseCallback,
    PhaseClock,
    engine_asleep,
    no_learning_signal,
    publish_on_its_trainer,
    reload_checkpoint,
    step_advantages,
    train_and_publish,
    trained_and_published,
)

SERVABLE_PATCH = "servable-before-resumable"
"""Runs whose history predates it publish each step whole (adapter and optimizer state, manifest last) before
its reload; runs after it reload once the adapter is up and write the rest beside what follows."""


@dataclass(frozen=True)
class StepServed:
    """What a served step's summary is made of, whichever chain served it."""

    adapter: str
    adapter_sha256: str | None
    checkpoint: CheckpointRef | None
    """None while the checkpoint is servable only."""
    loss: float | None
    n_groups_zero_variance: int
    seconds: dict[str, float]
    metrics: dict[str, float]

    @classmethod
    def of(cls, result: TrainStepResult) -> StepServed:
        return cls(result.adapter, result.adapter_sha256, result.checkpoint, result.loss,
                   result.n_groups_zero_variance, result.seconds, result.metrics)  # fmt: skip


@dataclass
class ServedStep:
    """A step trained and served from its adapter; resumable once ``resumable`` is done."""

    inp: TrainStepInput
    """How it was trained: ``start_from`` is the resumable checkpoint before it, where it is trained again from."""
    advantages: AdvantagesResult
    trained: TrainResult
    """Its training (the second one, once trained again)."""
    reloaded: ReloadResult
    resumable: asyncio.Task[CheckpointRef | None]
    """Its optimizer and trainer state written, manifest last; None when its trainer vanished first."""
    checkpoint: CheckpointRef | None = None
    """Once resumable: its checkpoint (trained again first when its trainer vanished)."""
    trained_again: bool = False
    seconds: dict[str, float] = field(default_factory=dict)
    """Wall seconds per phase until it was served."""

    @property
    def step(self) -> int:
        return self.inp.step

    def result(self) -> StepServed:
        return StepServed(self.reloaded.adapter, self.reloaded.adapter_sha256, self.checkpoint, self.trained.loss,
                          self.advantages.n_groups_zero_variance, self.seconds, self.trained.metrics)  # fmt: skip


async def serve_adapter_first(inp: TrainStepInput, on_phase: PhaseCallback | None = None) -> ServedStep:
    """advantages -> ``train_and_serve_adapter``: a ``TrainingRun``'s sync step, served when this returns;
    ``NoLearningSignal`` when no group's rewards differ."""
    clock = PhaseClock(on_phase)
    advantages = await step_advantages(inp, clock)
    if advantages.n_trajectories == 0:
        raise no_learning_signal(inp.step, advantages.n_groups)
    served = await train_and_serve_adapter(inp, advantages, clock)
    clock.stop()
    served.seconds = clock.seconds
    return served


async def train_and_serve_adapter(
    inp: TrainStepInput, advantages: AdvantagesResult, clock: PhaseClock
) -> ServedStep:
    """[sleep] -> train -> publish_adapter (on the trainer that staged it; trained again if it vanished before)
    -> [wake] -> reload; the rest of the checkpoint is written beside what follows (``ServedStep.resumable``)."""
    async with engine_asleep(inp, clock):
        trained, adapter = await trained_and_published(inp, advantages, clock, PUBLISH_ADAPTER, AdapterRef)
    reloaded = await reload_checkpoint(inp, adapter, clock)
    rest = publish_on_its_trainer(
        publish_input(inp, trained),
        trained.worker_id,
        inp.task_queues.trainer,
        inp.scheduling,
        inp.heartbeat_timeout_s,
        lost_ok=True,
    )
    return ServedStep(inp, advantages, trained, reloaded, asyncio.create_task(rest))


def publish_input(inp: TrainStepInput, trained: TrainResult) -> PublishInput:
    return PublishInput(run_id=inp.run_id, step=inp.step, staging_dir=trained.staging_dir,
                        metrics={"loss": trained.loss, "grad_norm": trained.grad_norm})  # fmt: skip


async def until_resumable(served: ServedStep, clock: PhaseClock) -> ReloadResult | None:
    """Wait until ``served``'s checkpoint is resumable (``served.checkpoint``). When its trainer vanished first,
    train the step again from the resumable checkpoint it was trained from, publish it whole and serve it: the
    reload's result (the adapter the run now holds for the step), else None."""
    checkpoint = await served.resumable
    if checkpoint is not None:
        served.checkpoint = checkpoint
        return None
    inp = served.inp
    workflow.logger.warning(
        "step %d: trainer %s vanished after its adapter was served, before its optimizer state was written; "
        "training the step again from checkpoint %s", inp.step, served.trained.worker_id,
        inp.start_from.step if inp.start_from else "none",
    )  # fmt: skip
    async with engine_asleep(inp, clock):
        trained, checkpoint = await train_and_publish(inp, served.advantages, clock)
    served.trained, served.checkpoint, served.trained_again = trained, checkpoint, True
    return await reload_checkpoint(inp, checkpoint, clock)


def on_lineage(scored: TrajectoriesRef, adapter_sha256: str | None) -> bool:
    """Whether every trajectory of ``scored`` was sampled by the adapter the run holds for its policy step
    (``adapter_sha256``), as far as either is known: rollouts of an adapter lost with its trainer are not."""
    return adapter_sha256 is None or all(sha == adapter_sha256 for sha in scored.policy_adapters)
