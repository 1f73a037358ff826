"""The workflows as a worker of a Worker Deployment (Temporal's Worker Versioning) registers them: each type states
whether a run in flight stays on the build it started on (PINNED) or moves to the deployment's current build
at its next workflow task (AUTO_UPGRADE).

Temporal refuses a versioning behavior from a worker that is not versioned, so the plain classes carry none and
a versioned worker registers these (``workers/worker.py``); each runs its plain class's code.

- ``TrainingRun``: AUTO_UPGRADE. A run lives for days (continuing as new every few steps); pinned, it would keep
  the build it started on alive for its whole life, and an upgrade could never drain. It moves at its next
  workflow task, where the new build replays its history: the replay tests (``tests/workflows/test_replay.py``)
  and ``workflow.patched`` guard that move, as for any change to a run in flight.
- ``TrainStep``, ``TrainSFT``, ``ServeModel``: PINNED. One call of the ART-style client, minutes to hours: it ends
  on the build it started on, so no other build's code ever replays it, and that build drains once they end.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import VersioningBehavior

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from schemas.config import RunSpec
    from schemas.run_state import (
        RunState,
        RunStatus,
        ServeModelInput,
        ServeModelResult,
        TrainSFTInput,
        TrainSFTResult,
        TrainStepInput,
        TrainStepResult,
    )

from workflows.serve_model import ServeModel
from workflows.train_sft import TrainSFT
from workflows.train_step import TrainStep
from workflows.training_run import TrainingRun


@workflow.defn(
    name="TrainingRun",
    failure_exception_types=[ValidationError],
    versioning_behavior=VersioningBehavior.AUTO_UPGRADE,
)
class VersionedTrainingRun(TrainingRun):
    @workflow.run
    async def run(self, spec: RunSpec, state: RunState | None = None) -> RunStatus:
        return await super().run(spec, state)


@workflow.defn(
    name="TrainStep", failure_exception_types=[ValidationError], versioning_behavior=VersioningBehavior.PINNED
)
class VersionedTrainStep(TrainStep):
    @workflow.run
    async def run(self, inp: TrainStepInput) -> TrainStepResult:
        return await super().run(inp)


@workflow.defn(
    name="TrainSFT", failure_exception_types=[ValidationError], versioning_behavior=VersioningBehavior.PINNED
)
class VersionedTrainSFT(TrainSFT):
    @workflow.run
    async def run(self, inp: TrainSFTInput) -> TrainSFTResult:
        return await super().run(inp)


@workflow.defn(
    name="ServeModel",
    failure_exception_types=[ValidationError],
    versioning_behavior=VersioningBehavior.PINNED,
)
class VersionedServeModel(ServeModel):
    @workflow.run
    async def run(self, inp: ServeModelInput) -> ServeModelResult:
        return await super().run(inp)


WORKFLOWS = [TrainingRun, TrainStep, TrainSFT, ServeModel]
"""What an unversioned control worker registers."""
VERSIONED_WORKFLOWS = [VersionedTrainingRun, VersionedTrainStep, VersionedTrainSFT, VersionedServeModel]
"""What a control worker of a Worker Deployment registers."""
