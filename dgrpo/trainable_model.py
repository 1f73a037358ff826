"""``TrainableModel``: ART's trainable model, with every ``model.train`` a durable ``TrainStep`` workflow.

The model's run id is ``<project>-<name>`` (a ``-`` in the project doubled, see ``Model.run_id``); its trajectories and checkpoints live under ``runs/<run_id>/``
like a ``TrainingRun``'s. ``train`` derives the workflow id from the model and the step, so a client that
crashed and calls ``train`` again for the same step attaches to the running workflow (or collects the
finished one's result) instead of training twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import FailureError

from activities.object_store import ObjectStore
from activities.retention import delete_checkpoints, select_checkpoints_to_delete
from activities.rollout_model import discover_base_model, own_server_api_key
from activities.trajectory_store import upload_groups
from dgrpo.art_config import (
    chat_template_of,
    lora_from_internal_config,
    lora_from_lora_config,
    refuse_gpu_ids,
    train_config_fields,
)
from dgrpo.attach import check_train_step, workflow_status
from dgrpo.backends import Backend
from dgrpo.errors import (
    BackendError,
    EmptyGroupsError,
    ModelConflictError,
    NoTrainableChoiceError,
    NotRegisteredError,
    UnsupportedArtOption,
)
from dgrpo.metrics import (
    group_metrics,
    train_result_metrics,
    trainable,
    zero_variance_groups,
)
from dgrpo.metrics_taxonomy import average_metric_samples
from dgrpo.model import Model, check_config
from dgrpo.sft import run_train_sft, sft_config, train_result
from dgrpo.types import TrainResult, TrainSFTConfig
from schemas import layout
from schemas.config import LoraConfig, ModelSpec, Scheduling, TrainConfig
from schemas.errors import DgrpoError
from schemas.refs import CheckpointRef, TrajectoriesRef
from schemas.run_state import (
    ServeModelInput,
    ServeModelResult,
    TrainSFTResult,
    TrainStepInput,
    TrainStepResult,
)
from schemas.trajectory import Trajectory, TrajectoryGroup
from serving.client import ServingClient, openai_base_url
from workers.temporal import result_across_restarts

log = logging.getLogger(__name__)


class TrainStepFailed(DgrpoError, RuntimeError):
    """The ``TrainStep`` workflow of a ``model.train`` call failed; the message is the stage's own."""


class TrainableModel(Model):
    """The policy being trained: ``name`` within ``project``, a LoRA on ``base_model``.

    ``base_model`` is an HF model (directory or hub id), ``smollm2-135m-instruct``, or a LoRA adapter
    directory to warm-start from (the workers must be able to read it). ART's ``_internal_config`` is
    mapped where dgrpo has the setting (``peft_args`` -> ``lora``, ``init_args.max_seq_length``) and
    refused otherwise; ``config`` is the program's own settings object, kept as ``model.config``.
    """

    trainable = True

    def __init__(
        self,
        name: str,
        project: str = "default",
        base_model: str = "smollm2-135m-instruct",
        *,
        lora: LoraConfig | None = None,
        lora_config: Mapping[str, Any] | None = None,
        entity: str | None = None,
        id: str | None = None,
        run_id: str | None = None,
        config: Any = None,
        base_path: str = layout.ART_BASE_PATH,
        report_metrics: list[str] | None = None,
        _internal_config: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(
            name,
            project,
            entity=entity,
            id=id,
            config=config,
            base_path=base_path,
            report_metrics=report_metrics,
        )
        if run_id is not None and run_id != self.run_id:
            raise UnsupportedArtOption(
                f"run_id={run_id!r}: a dgrpo model's run id is always <project>-<name> ({self.run_id!r}), "
                "the prefix its checkpoints and metrics live under; leave run_id out"
            )
        internal_lora, self.max_seq_len = lora_from_internal_config(_internal_config or {})
        self._internal_config = None if _internal_config is None else dict(_internal_config)
        """ART's ``_internal_config`` as given (its keys that map are mapped above)."""
        given = [c for c in (lora, internal_lora) if c is not None]
        if lora_config is not None:
            given.append(lora_from_lora_config(lora_config))
        if any(c != given[0] for c in given):
            raise UnsupportedArtOption(
                "give the LoRA shape once: lora=, lora_config= or _internal_config['peft_args']"
            )
        self.base_model = base_model
        self.spec = ModelSpec(
            name=name,
            project=project,
            base_model=base_model,
            lora=given[0] if given else LoraConfig(),
            chat_template=chat_template_of(_internal_config or {}),
        )
        self._served: str | None = None
        self.trained_checkpoint: CheckpointRef | None = None  # the newest TrainStep's (backend.train's path)
        self._base_served: str | None = None
        template_kwargs = (_internal_config or {}).get("chat_template_kwargs")
        self.chat_template_kwargs = None if template_kwargs is None else dict(template_kwargs)
        """ART's ``_internal_config["chat_template_kwargs"]`` (``enable_thinking``, ...): the server renders
        each chat completion of ``openai_client()`` with them."""

    # ---- registration and serving ----------------------------------------------------------------
    async def register(self, backend: Backend) -> None:
        """Bind the model to ``backend``: record it (or check the record), and serve its newest step."""
        check_config(self.config)
        refuse_gpu_ids(self._internal_config or {})
        await backend.start()
        store = backend.object_store()
        await asyncio.to_thread(store.ensure_bucket)
        await asyncio.to_thread(self._check_record, store)
        self._backend, self._store = backend, store
        self.inference_base_url = backend.inference_url()
        self.inference_api_key = own_server_api_key()  # the server's key (DGRPO_SERVE_API_KEY), if it has one
        self._client = None
        client = await backend.temporal_client()
        newest = await self._newest_step(store)
        # A train call of a client that died may still be finishing: wait for it, never race it.
        for step in (newest, newest + 1):
            handle = client.get_workflow_handle(self.train_workflow_id(step), result_type=TrainStepResult)
            if await workflow_status(handle) == WorkflowExecutionStatus.RUNNING:
                log.info("waiting for the running %s of an earlier client", handle.id)
                await self._result(handle)
        await self._serve_newest(client, store)

    def _check_record(self, store: ObjectStore) -> None:
        key = layout.model_key(self.run_id)
        if not store.exists(key):
            store.put_bytes(key, self.spec.model_dump_json(indent=2).encode())
            return
        recorded = ModelSpec.model_validate_json(store.get_bytes(key))
        for field in ("base_model", "lora"):
            if getattr(recorded, field) != getattr(self.spec, field):
                raise ModelConflictError(
                    f"model {self.name!r} of project {self.project!r} is already registered with "
                    f"{field}={_show(getattr(recorded, field))}, not {_show(getattr(self.spec, field))}; "
                    f"its checkpoints belong to that {field}. Use another name (or project) for this one, "
                    f"or pass {field}={_show(getattr(recorded, field))}"
                )

    async def _newest_step(self, store: ObjectStore) -> int:
        newest = await asyncio.to_thread(store.latest_checkpoint, self.run_id)
        return 0 if newest is None else newest.step

    async def _serve_newest(self, client: Client, store: ObjectStore) -> None:
        """Route to the newest checkpoint, loading it into the server if it is not there (a new server)."""
        url = self._require_url()
        self._base_served = await discover_base_model(url)
        checkpoint = await asyncio.to_thread(store.latest_checkpoint, self.run_id)
        if checkpoint is None and not self.warm_start:
            # Step 0 of a fresh LoRA is the base model itself (its B matrices are zero).
            self._step, self._served = 0, self._base_served
            return
        if checkpoint is not None:
            adapter = layout.adapter_name(self.run_id, checkpoint.step)
            if adapter in await _served_models(url):
                self._step, self._served = checkpoint.step, adapter
                return
        # A new server, or a warm-start adapter at step 0: ServeModel publishes checkpoint 0 if there is
        # none, and loads the newest checkpoint. Clients registering at once share one run of it.
        queues = self._require_backend().task_queues
        handle = await client.start_workflow(
            "ServeModel",
            ServeModelInput(
                run_id=self.run_id,
                model=self.spec,
                task_queues=queues,
                scheduling=Scheduling.of_owner(self.spec.project),
            ),
            id=f"serve-{self.run_id}",
            task_queue=queues.control,
            result_type=ServeModelResult,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )
        try:
            served = await result_across_restarts(handle)
        except WorkflowFailureError as err:
            raise BackendError(f"{handle.id} could not serve {self.run_id}: {_innermost(err)}") from err
        self._step, self._served = served.step, served.adapter

    def use_served(self, step: int, adapter: str) -> None:
        """Route the model to ``adapter``, the newest step a ``TrainingRun`` of this model served (what
        ``PipelineTrainer`` evaluates)."""
        self._require_backend()
        self._step, self._served = step, adapter

    @property
    def warm_start(self) -> bool:
        """``base_model`` is a LoRA adapter directory (seen from this machine): step 0 is that adapter."""
        return (Path(self.base_model) / "adapter_config.json").is_file()

    def get_inference_name(self, step: int | None = None) -> str:
        """The served name of the newest step (``<name>@<step>``, or the base model at step 0), or of
        checkpoint ``step``: ``<name>@<step>`` (served while the newest step or a lease holds it), and
        for step 0 of a fresh LoRA the base model itself (a baseline to compare with). Before
        ``register`` it is ART's unregistered name: ``name``, or ``name@<step>``."""
        if self._served is None or self._base_served is None:
            return super().get_inference_name(step)
        if step is None or step == self._step:
            return self._served
        if step == 0 and not self.warm_start:
            return self._base_served
        return layout.adapter_name(self.run_id, step)

    async def get_step(self) -> int:
        """The model's step, as its backend says (ART's ``backend()._get_step(model)``): with dgrpo's backends
        ``served_step``; 0 before the first ``train``."""
        return await self.backend()._get_step(self)

    @property
    def served_step(self) -> int:
        """The newest step this model's workflows trained and served: set by ``register`` (the newest
        checkpoint) and by each ``TrainStep``/``TrainSFT`` result; what dgrpo's backends' ``_get_step`` say."""
        return self._step

    # ---- training ---------------------------------------------------------------------------------
    def train_workflow_id(self, step: int) -> str:
        """The ``TrainStep`` workflow id of ``step``: one workflow per (model, step), ever."""
        return f"train-{self.run_id}-{layout.step_name(step)}"

    async def train(
        self,
        trajectory_groups: Iterable[TrajectoryGroup],
        config: TrainConfig | None = None,
        _config: Mapping[str, Any] | None = None,
        verbose: bool = False,
    ) -> TrainStepResult:
        """Train one GRPO step on the groups; returns once the new adapter is served.

        As in ART >= 0.4.4, a batch with nothing to learn from (no groups, every rollout failed, or every
        group's rewards equal) trains nothing but still advances the step: the current checkpoint is
        published again as the next one and served (``result.trained`` is False, the step's metrics say
        ``data/step_skipped``). ``_config`` takes ART's ``dev.TrainConfig`` keys that dgrpo has (``epsilon``,
        ``epsilon_high``, ``scale_rewards``) and refuses the others; ``verbose`` is accepted (the workers
        log each stage).
        """
        config = self.step_config(config, train_config_fields("model.train(_config=...)", _config or {}))
        return await self.train_step(trajectory_groups, config, history=True)

    async def train_step(
        self, trajectory_groups: Iterable[TrajectoryGroup], config: TrainConfig, *, history: bool
    ) -> TrainStepResult:
        """``train`` with its ``TrainConfig`` made. The step's numbers always go to the run's metrics Parquet;
        ``history`` also writes them as rows of ``history.jsonl`` and W&B, as ART 0.3's ``model.train`` logged
        them. ``backend.train`` leaves those rows to the program's ``model.log``, as ART 0.5's does."""
        record = self._record_train if history else self._record
        groups = check_trainable(list(trajectory_groups))
        backend = self._require_backend()
        store = backend.object_store()
        step = self._step + 1
        if not any(trainable(g) for g in groups):
            log_skipped(step, groups)
        client = await backend.temporal_client()
        handle = client.get_workflow_handle(self.train_workflow_id(step), result_type=TrainStepResult)
        if await workflow_status(handle) in (
            WorkflowExecutionStatus.RUNNING,
            WorkflowExecutionStatus.COMPLETED,
        ):
            # Its input is already uploaded: attach (when it is this model's), never overwrite what it reads.
            await check_train_step(handle, self.run_id, self.spec, config)
            log.info("step %d: attaching to %s", step, handle.id)
            result = await self._result(handle)
        else:
            ref = await asyncio.to_thread(upload_groups, store, groups, self.run_id, step)
            # Recorded before training, so a client that dies in train() still leaves the step's numbers.
            await asyncio.to_thread(record, step, group_metrics(groups, "train"), self._title())
            result = await self._run_train_step(client, ref, config, step)
            await asyncio.to_thread(record, step, train_result_metrics(result))
        self._step, self._served = result.step, result.adapter
        self.trained_checkpoint = result.checkpoint
        return result

    async def train_sft(
        self,
        trajectories: Iterable[Trajectory],
        config: TrainSFTConfig | None = None,
        _config: Mapping[str, Any] | None = None,
        verbose: bool = False,
    ) -> TrainResult | None:
        """ART's supervised fine-tuning, through the backend's ``_train_sft`` (dgrpo's: a durable ``TrainSFT``
        that trains on the trajectories' assistant turns, then publishes and serves the next step). As in
        ART, the batches' numbers are averaged into one ``train`` row at the step the backend then reports;
        returns that step and row (ART returns None), or None when the backend trained no batch."""
        started = time.monotonic()
        samples = [
            metrics
            async for metrics in self.backend()._train_sft(
                self, trajectories, config or TrainSFTConfig(), dict(_config or {}), verbose
            )
        ]
        if not samples:
            return None
        metrics = average_metric_samples(samples)
        # dgrpo's backends give the trainer's own time (the workflow's); for others, ART's: this call's.
        metrics.setdefault("time/step_trainer_s", time.monotonic() - started)
        step = await self.get_step()
        await self.log(metrics=metrics, split="train", step=step)
        return TrainResult(step=step, metrics=metrics)

    async def fine_tune(
        self,
        trajectories: Iterable[Trajectory],
        config: TrainSFTConfig | None = None,
        _config: Mapping[str, Any] | None = None,
    ) -> TrainResult:
        """``train_sft`` without logging (``backend.train_sft``): the new step and its metrics."""
        return train_result(await self.run_sft(trajectories, config, _config))

    async def run_sft(
        self,
        trajectories: Iterable[Trajectory],
        config: TrainSFTConfig | None = None,
        _config: Mapping[str, Any] | None = None,
    ) -> TrainSFTResult:
        """Run (or join) the next step's durable ``TrainSFT`` and route to the adapter it served."""
        examples = list(trajectories)
        sft = sft_config(config, len(examples), self.max_seq_len, _config or {})
        backend = self._require_backend()
        client = await backend.temporal_client()
        store, queues = backend.object_store(), backend.task_queues
        result = await run_train_sft(
            client, store, queues, self.spec, self.run_id, self._step + 1, examples, sft
        )
        self._step, self._served = result.step, result.adapter
        return result

    def step_config(self, config: TrainConfig | None, overrides: Mapping[str, Any]) -> TrainConfig:
        """The step's ``TrainConfig``: ``config`` (or the defaults) with ART's options and the model's
        ``max_seq_length`` (from ``_internal_config``) where the config leaves it unset."""
        fields = dict(config.model_dump(exclude_unset=True)) if config is not None else {}
        fields.update(overrides)
        if self.max_seq_len is not None:
            fields.setdefault("max_seq_len", self.max_seq_len)
        # A plain TrainConfig (not a subclass such as dgrpo.types.TrainConfig) goes into the workflow input.
        return TrainConfig.model_validate(fields)

    async def _run_train_step(
        self,
        client: Client,
        trajectories: TrajectoriesRef,
        config: TrainConfig,
        step: int,
    ) -> TrainStepResult:
        backend = self._require_backend()
        inp = TrainStepInput(
            run_id=self.run_id,
            model=self.spec,
            trajectories=trajectories,
            train=config,
            step=step,
            task_queues=backend.task_queues,
            advance_without_signal=True,
            scheduling=Scheduling.of_owner(self.spec.project),
        )
        handle = await client.start_workflow(
            "TrainStep",
            inp,
            id=self.train_workflow_id(step),
            task_queue=backend.task_queues.control,
            result_type=TrainStepResult,
            # A failed step may be tried again; a finished one never runs twice; a running one is joined.
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )
        return await self._result(handle)

    async def _result(self, handle: WorkflowHandle[Any, TrainStepResult]) -> TrainStepResult:
        try:
            result = await result_across_restarts(handle)
        except WorkflowFailureError as err:
            raise TrainStepFailed(f"{handle.id} failed: {_innermost(err)}") from err
        assert isinstance(result, TrainStepResult)
        return result

    # ---- checkpoints ------------------------------------------------------------------------------
    async def delete_checkpoints(
        self, best_checkpoint_metric: str = "val/reward", keep_last: int = 1
    ) -> list[int]:
        """Delete checkpoints except the newest ``keep_last`` and the best by ``best_checkpoint_metric``."""
        store = self._require_backend().object_store()
        doomed = await asyncio.to_thread(
            select_checkpoints_to_delete, store, self.run_id, best_checkpoint_metric, keep_last
        )
        await asyncio.to_thread(delete_checkpoints, store, self.run_id, doomed)
        return doomed

    # ---- helpers ----------------------------------------------------------------------------------
    def _default_chat_completion_extra_body(self) -> dict[str, Any] | None:
        """ART's ``chat_template_kwargs``, and the model's own chat template (vLLM's request field, which ART
        sets as its server's ``--chat-template`` instead: dgrpo's server is shared by every run on it)."""
        body: dict[str, Any] = {}
        if self.chat_template_kwargs is not None:
            body["chat_template_kwargs"] = dict(self.chat_template_kwargs)
        if self.spec.chat_template is not None:
            body["chat_template"] = self.spec.chat_template
        return body or None

    def _record_train(self, step: int, metrics: dict[str, float], curve_title: str | None = None) -> None:
        """A ``train`` row of ``model.train``: the run's metrics Parquet, ``history.jsonl`` and W&B."""
        self._record(step, metrics, curve_title)
        self._log_metrics(metrics, "train", step)

    def _title(self) -> str:
        return f"{self.project}/{self.name}"

    def _require_url(self) -> str:
        if self.inference_base_url is None:
            raise NotRegisteredError(f"model {self.name!r} is not registered")
        return openai_base_url(self.inference_base_url)


def check_trainable(groups: list[TrajectoryGroup]) -> list[TrajectoryGroup]:
    """Refuse input that cannot train, saying what to fix (where ART would silently train on nothing).

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
    if any(h.choices() for g in groups for t in g.trajectories for h in t.additional_histories):
        raise NoTrainableChoiceError(
            "a trajectory's additional_histories hold sampled choices, which dgrpo does not train yet "
            "(only messages_and_choices is); give each history its own trajectory in the group instead"
        )
    choices = [c for g in groups for t in g.trajectories for c in t.choices()]
    if any(g.trajectories for g in groups) and not any(c.token_ids for c in choices):
        what = "no Choice objects" if not choices else "choices without token ids"
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


async def _served_models(url: str) -> set[str]:
    return {str(m.get("id")) for m in await ServingClient(url, timeout_s=10.0).models()}


def _innermost(err: BaseException) -> str:
    while isinstance(err.__cause__, FailureError):
        err = err.__cause__
    return str(err)


def _show(value: Any) -> str:
    return repr(value.model_dump()) if isinstance(value, BaseModel) else repr(value)
