"""A model's GRPO step as a durable ``TrainStep`` workflow, which its backend runs (``backend.train``, and
``model.train``, which asks its backend): the groups checked, uploaded and their numbers recorded, the
workflow started (or joined), its result awaited across Temporal restarts.

The workflow id comes from the model's run and the step (``train_workflow_id``), so a client that crashed
and trains the same step again attaches to the running workflow (or collects the finished one's result)
instead of training twice; it attaches only to a step of this very model with these settings
(dgrpo/client/attach.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle

from activities.object_store import ObjectStore
from activities.trajectory_store import upload_groups
from dgrpo.capture.exchange_training import PolicyNames, trainable_groups
from dgrpo.client.attach import check_train_step, workflow_status
from dgrpo.client.durable_calls import start_step_workflow, workflow_result
from dgrpo.errors import EmptyGroupsError, NoTrainableChoiceError
from dgrpo.model_log.run_metrics import group_metrics, train_result_metrics, zero_variance_groups
from schemas import layout
from schemas.config import ModelSpec, Scheduling, TaskQueues, TrainConfig
from schemas.errors import DgrpoError
from schemas.refs import TrajectoriesRef
from schemas.run_state import TrainStepInput, TrainStepResult
from schemas.trajectory import TrajectoryGroup

log = logging.getLogger(__name__)


class TrainStepFailed(DgrpoError, RuntimeError):
    """The ``TrainStep`` workflow of a ``model.train`` call failed; the message is the stage's own."""


class StepRecorder(Protocol):
    """Where a step's numbers go (``TrainableModel.record_step``): the run's metrics Parquet, and the reward
    curve redrawn when asked."""

    def __call__(self, step: int, metrics: dict[str, float], *, redraw_curve: bool = False) -> None: ...


def train_workflow_id(run_id: str, step: int) -> str:
    """The ``TrainStep`` workflow id of run ``run_id``'s ``step``: one workflow per (model, step), ever."""
    return f"train-{run_id}-{layout.step_name(step)}"


async def run_train_step(
    client: Client,
    store: ObjectStore,
    queues: TaskQueues,
    model: ModelSpec,
    run_id: str,
    step: int,
    groups: list[TrajectoryGroup],
    config: TrainConfig,
    record: StepRecorder,
) -> TrainStepResult:
    """Train ``step`` on the (checked) groups, or join the step's workflow already running or finished;
    returns once its adapter is served. A new step's group numbers are recorded before it trains (so a
    client that dies meanwhile still leaves them), its result's after."""
    handle = client.get_workflow_handle(train_workflow_id(run_id, step), result_type=TrainStepResult)
    if await workflow_status(handle) in (
        WorkflowExecutionStatus.RUNNING,
        WorkflowExecutionStatus.COMPLETED,
    ):
        # Its input is already uploaded: attach (when it is this model's), never overwrite what it reads.
        await check_train_step(handle, run_id, model, config)
        log.info("step %d: attaching to %s", step, handle.id)
        return await train_step_result(handle)
    ref = await asyncio.to_thread(upload_groups, store, groups, run_id, step)
    await asyncio.to_thread(record, step, group_metrics(groups, "train"), redraw_curve=True)
    result = await _start_train_step(client, queues, model, run_id, ref, config, step)
    await asyncio.to_thread(record, step, train_result_metrics(result))
    return result


async def _start_train_step(
    client: Client,
    queues: TaskQueues,
    model: ModelSpec,
    run_id: str,
    trajectories: TrajectoriesRef,
    config: TrainConfig,
    step: int,
) -> TrainStepResult:
    inp = TrainStepInput(
        run_id=run_id,
        model=model,
        trajectories=trajectories,
        train=config,
        step=step,
        task_queues=queues,
        advance_without_signal=True,
        scheduling=Scheduling.of_owner(model.project),
    )
    handle = await start_step_workflow(
        client,
        "TrainStep",
        inp,
        workflow_id=train_workflow_id(run_id, step),
        task_queue=queues.control,
        result_type=TrainStepResult,
    )
    return await train_step_result(handle)


async def train_step_result(handle: WorkflowHandle[Any, TrainStepResult]) -> TrainStepResult:
    """The ``TrainStep``'s result, waited for across Temporal restarts; ``TrainStepFailed`` if it failed."""
    return await workflow_result(handle, TrainStepResult, TrainStepFailed)


def check_trainable(groups: list[TrajectoryGroup], policy: PolicyNames) -> list[TrajectoryGroup]:
    """The groups as dgrpo trains them (trajectories of captured exchanges as the ``policy``'s conversation,
    dgrpo/capture/exchange_training.py); refuse input that cannot train, saying what to fix (where ART would
    silently train on nothing).

    No groups, or groups whose rollouts all failed, pass: ``train`` skips them, as ART does.
    """
    for i, group in enumerate(groups):
        if not isinstance(group, TrajectoryGroup):
            raise EmptyGroupsError(f"group {i} is a {type(group).__name__}, not a TrajectoryGroup")
        if group.pending:
            raise EmptyGroupsError(
                f"group {i} still has {group.pending} rollout(s) to run: await it, or use "
                "`await dgrpo.gather_trajectory_groups(...)`, before model.train"
            )
    groups = trainable_groups(groups, policy)
    if any(h.choices() for g in groups for t in g.trajectories for h in t.additional_histories):
        raise NoTrainableChoiceError(
            "a trajectory's additional_histories hold sampled choices, which dgrpo does not train yet "
            "(only messages_and_choices is); give each history its own trajectory in the group instead"
        )
    choices = [c for g in groups for t in g.trajectories for c in t.choices()]
    # A choice with logprobs but no token ids trains too (its tokens recovered as ART recovers them,
    # activities/tokenize.py): NeMo Agent Toolkit builds such choices from its own LLM calls.
    if any(g.trajectories for g in groups) and not any(c.token_ids or c.sampled_logprobs() for c in choices):
        what = "no Choice objects" if not choices else "choices without token ids or logprobs"
        raise NoTrainableChoiceError(
            f"the trajectories hold {what}, so there is nothing to train on. Call the model through "
            "`model.openai_client()` (it asks the server for token ids and logprobs) and append "
            "`completion.choices[0]` itself, not a plain {'role': 'assistant', ...} message, to "
            "trajectory.messages_and_choices"
        )
    return groups


def log_skipped(step: int, groups: list[TrajectoryGroup]) -> None:
    """Say why ``step`` trains nothing (it still advances, as in ART >= 0.4.4)."""
    zero_variance = zero_variance_groups(groups)
    log.warning(
        "step %d: skipping training: no group of the %d has rewards that differ (%d with equal rewards, "
        "%d without two finished rollouts); the step advances with the adapter unchanged",
        step,
        len(groups),
        zero_variance,
        len(groups) - zero_variance,
    )
