"""ART 0.5's supervised fine-tuning, ``model.train_sft(trajectories, TrainSFTConfig(...))``, as a durable
``TrainSFT`` workflow (workflows/train_sft.py).

The trajectories' chats (``messages()`` and ``tools``) are uploaded as the step's ``sft_examples.jsonl``;
the trainer trains the adapter on their assistant turns, one optimizer step per ``batch_size`` examples, and
publishes and serves the result as the next step, as ART's ``train_sft`` advances the step.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus

from activities.object_store import ObjectStore
from dgrpo.client.attach import workflow_status
from dgrpo.client.durable_calls import start_step_workflow, workflow_result
from dgrpo.errors import UnsupportedArtOption
from dgrpo.metrics_taxonomy import average_metric_samples
from dgrpo.types import TrainResult, TrainSFTConfig
from dgrpo.utils.sft import example_line, resolve_sft_batch_size
from schemas import layout
from schemas.activities import SftConfig
from schemas.config import ModelSpec, Scheduling, TaskQueues
from schemas.refs import ObjectRef
from schemas.run_state import TrainSFTInput, TrainSFTResult
from schemas.trajectory import Trajectory

AUTO_BATCH_SIZE = 2
"""ART's local backend's ``batch_size="auto"``."""


class TrainSFTFailed(RuntimeError):
    """The ``TrainSFT`` workflow of a ``train_sft`` call failed; the message is the stage's own."""


def sft_workflow_id(run_id: str, step: int) -> str:
    """One ``TrainSFT`` workflow per (model, step), ever."""
    return f"sft-{run_id}-{layout.step_name(step)}"


def examples_jsonl(trajectories: Sequence[Trajectory]) -> bytes:
    """The chats as ART's SFT JSONL: ``{"messages": [...], "tools": [...]}`` per line."""
    return "".join(example_line(t) + "\n" for t in trajectories).encode()


def sft_config(
    config: TrainSFTConfig | None,
    examples: Sequence[Trajectory],
    max_seq_len: int | None,
    dev_config: Mapping[str, Any],
) -> SftConfig:
    """The workflow's ``SftConfig`` for ``examples``: ART's learning rate(s), batch size and target turns,
    checked (with ``assistant_turns="last"`` every chat must end with the assistant's turn, as in ART)."""
    config = config or TrainSFTConfig()
    n_examples = len(examples)
    if config.assistant_turns == "last" and any(
        not t.messages() or t.messages()[-1].get("role") != "assistant" for t in examples
    ):
        raise ValueError(
            "assistant_turns='last' requires the final message of every chat to be an assistant's"
        )
    if n_examples == 0:
        raise ValueError("train_sft got no trajectories: give it chats whose assistant turns are the targets")
    if config.megatron_topology is not None:
        raise UnsupportedArtOption("TrainSFTConfig(megatron_topology=...): dgrpo trains with torch + peft")
    if dev_config:
        raise UnsupportedArtOption(f"train_sft(_config={dict(dev_config)!r}): dgrpo has no such SFT settings")
    batch_size = resolve_sft_batch_size(batch_size=config.batch_size, default_batch_size=AUTO_BATCH_SIZE)
    n_batches = math.ceil(n_examples / batch_size)
    if isinstance(config.learning_rate, list):
        if len(config.learning_rate) < n_batches:
            raise ValueError(
                f"TrainSFTConfig has {len(config.learning_rate)} learning rates for {n_batches} batches "
                f"({n_examples} trajectories, batch_size={batch_size}); give one per batch"
            )
        rates = list(config.learning_rate[:n_batches])
    else:
        rates = [config.learning_rate] * n_batches
    fields: dict[str, Any] = {
        "learning_rates": rates,
        "batch_size": batch_size,
        "assistant_turns": config.assistant_turns,
    }
    if max_seq_len is not None:
        fields["max_seq_len"] = max_seq_len
    return SftConfig.model_validate(fields)


def batch_metrics(result: TrainSFTResult) -> list[dict[str, float]]:
    """ART's ``_train_sft`` numbers, one dict per batch: its loss, learning rate and gradient norm, and the
    step's counts; the step's times (the workflow's, measured once) come with the last batch, so a mean over
    the dicts that hold a key (``average_metric_samples``) gives each number as measured."""
    trained = result.trained
    if trained is None:
        return []
    n = len(trained.losses)
    step = {
        "data/step_num_trajectories": float(trained.n_examples),
        "data/step_trainer_tokens": float(trained.n_trainable_tokens),
        "data/step_num_dropped_trajectories": float(trained.n_dropped_overlength),
        "data/step_num_gradient_steps": float(n),
    }
    rows = [
        {"loss/train": loss, "loss/learning_rate": rate, "loss/grad_norm": norm, **step}
        for loss, rate, norm in zip(trained.losses, trained.learning_rates, trained.grad_norms, strict=True)
    ]
    if rows:
        rows[-1]["time/step_trainer_s"] = trained.seconds
        rows[-1].update(
            {f"time/step_{phase}_s": s for phase, s in result.seconds.items() if phase != "train"}
        )
    return rows


def result_metrics(result: TrainSFTResult) -> dict[str, float]:
    """ART's ``train_sft`` numbers: the batches' mean loss, learning rate and gradient norm, and the counts."""
    return average_metric_samples(batch_metrics(result))


async def run_train_sft(
    client: Client,
    store: ObjectStore,
    queues: TaskQueues,
    model: ModelSpec,
    run_id: str,
    step: int,
    trajectories: Sequence[Trajectory],
    config: SftConfig,
) -> TrainSFTResult:
    """Upload the examples and run (or join) the step's ``TrainSFT``; returns once its adapter is served."""
    workflow_id = sft_workflow_id(run_id, step)
    handle = client.get_workflow_handle(workflow_id, result_type=TrainSFTResult)
    if await workflow_status(handle) not in (
        WorkflowExecutionStatus.RUNNING,
        WorkflowExecutionStatus.COMPLETED,
    ):
        examples: ObjectRef = await asyncio.to_thread(
            store.put_bytes, layout.sft_examples_key(run_id, step), examples_jsonl(trajectories)
        )
        inp = TrainSFTInput(
            run_id=run_id,
            model=model,
            examples=examples,
            sft=config,
            step=step,
            task_queues=queues,
            scheduling=Scheduling.of_owner(model.project),
        )
        handle = await start_step_workflow(
            client,
            "TrainSFT",
            inp,
            workflow_id=workflow_id,
            task_queue=queues.control,
            result_type=TrainSFTResult,
        )
    return await workflow_result(handle, TrainSFTResult, TrainSFTFailed)


def train_result(result: TrainSFTResult) -> TrainResult:
    return TrainResult(step=result.step, metrics=result_metrics(result))
