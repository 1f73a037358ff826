"""ART's ``art.model``: ``Model``, a model the client runs but does not train (a baseline, a judge), and
``TrainableModel``, the policy being trained, each ``model.train`` a durable ``TrainStep`` workflow.

Both are pydantic models, as ART's are (``TrainableModel[Config]``, ``model_copy``, a field of the program's
own models), whose derived values (``spec``, ``run_id``, the client) follow their fields when read.
A model's records live under ``runs/<project>-<name>/`` in the object store (``Model.run_id``), like a
``TrainingRun``'s, once it is registered; ART's local files of its ``log`` calls under ``base_path``
(dgrpo/model_log/) in any case. As in ART, a model asks its backend to train it (``backend.train_step``,
``backend._train_sft``, ``backend._get_step``; dgrpo/client/training.py), which runs the durable step
(dgrpo/client/train_step.py), records its numbers (``record_step``) and routes the model to the step served
(``use_served``); this module imports only the ``Backend`` protocol. ``register``'s work on the cluster is
dgrpo/client/registration.py's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Generic, cast

from openai import AsyncOpenAI
from pydantic import BaseModel, PrivateAttr

from activities.retention import select_checkpoints_to_keep
from activities.rollout_model import (
    DEFAULT_API_KEY,
    routed_http_client,
)
from dgrpo.art_compat.options import (
    chat_template_of,
    internal_settings,
    lora_of,
    refuse_gpu_ids,
    train_config_fields,
)
from dgrpo.art_compat.settings_rule import warn_ignored
from dgrpo.capture.exchange_training import PolicyNames
from dgrpo.client.art_hooks import delete_by_hooks, train_by_hooks
from dgrpo.client.backends import ArtBackend, Backend
from dgrpo.client.model_base import ModelBase, ModelConfig, StateType, check_config, run_id_of
from dgrpo.client.openai_client import CostRecordingClient, CostRecordingCompletions
from dgrpo.client.registration import changed_since_register, join_run
from dgrpo.client.train_step import (
    check_trainable,
    train_workflow_id,
)
from dgrpo.errors import NotRegisteredError, UnsupportedArtOption
from dgrpo.metrics_taxonomy import average_metric_samples
from dgrpo.types import TrainConfig as ArtTrainConfig
from dgrpo.types import TrainResult, TrainSFTConfig
from schemas import layout
from schemas.config import LoraConfig, ModelSpec, TrainConfig
from schemas.refs import CheckpointRef
from schemas.run_state import TrainStepResult
from schemas.trajectory import Trajectory, TrajectoryGroup
from serving.client import openai_base_url

log = logging.getLogger(__name__)

__all__ = ["Model", "TrainableModel", "run_id_of"]

_OpenAIChatCompletionsProxy = CostRecordingCompletions
"""ART's name for ``client.chat.completions`` of ``openai_client()``."""


class Model(ModelBase[ModelConfig, StateType], Generic[ModelConfig, StateType]):
    """A model the client only runs (no training): ART's ``art.Model``, e.g. a baseline or a judge
    behind any OpenAI-compatible endpoint (``inference_base_url``, ``inference_api_key``,
    ``inference_model_name``). ``register`` adds its run's metrics Parquet to what ``log`` writes.
    """

    def openai_client(self) -> AsyncOpenAI:
        """An ``AsyncOpenAI`` whose ``model=self.name`` goes to ``get_inference_name()``, wrapped as ART wraps
        it (dgrpo/client/openai_client.py): its chat completions send the model's default ``extra_body`` and
        record their cost under the active metrics context (``set_cost_calculator``). One per model, made again
        when the URL, key, name or those defaults changed since."""
        if self.inference_base_url is None:
            raise NotRegisteredError(
                f"model {self.name!r} has no inference server yet: call `await model.register(backend)` "
                "first (or give inference_base_url=...)"
            )
        extra_body = self._default_chat_completion_extra_body()
        made_for = (self.inference_base_url, self.inference_api_key, self.name, repr(extra_body))
        if self._client is None or self._client_made_for != made_for:
            client = AsyncOpenAI(
                base_url=openai_base_url(self.inference_base_url),
                api_key=self.inference_api_key or DEFAULT_API_KEY,
                http_client=routed_http_client(self.name, self.get_inference_name),
                max_retries=2,
            )
            wrapped = CostRecordingClient(client, self._record_openai_completion_costs, extra_body)
            self._client = cast(AsyncOpenAI, wrapped)  # an AsyncOpenAI to every caller, as ART's
            self._client_made_for = made_for
        return self._client

    def safe_model_dump(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """``model_dump`` without ``config`` (ART's: the program's config need not serialize)."""
        return {**self.model_dump(*args, **kwargs), "config": None}


IDENTITY = frozenset({"name", "project", "base_model", "lora", "lora_config", "run_name", "_internal_config"})
"""What a ``TrainableModel``'s run id and ``ModelSpec`` follow: checked when set, frozen by ``register``."""


class TrainableModel(Model[ModelConfig, StateType], Generic[ModelConfig, StateType]):
    """The policy being trained: ``name`` within ``project``, a LoRA on ``base_model``.

    ``base_model`` is an HF model (directory or hub id), ``smollm2-135m-instruct``, or a LoRA adapter
    directory to warm-start from (the workers must be able to read it). ART's ``_internal_config`` is
    mapped where dgrpo has the setting (``peft_args`` -> ``lora``, ``init_args.max_seq_length`` and
    ``trainer_args.max_grad_norm`` -> the steps' default ``TrainConfig``), accepted with one warning where it
    only tunes ART's engine or hardware (``gpu_memory_utilization``, ``engine_args``: the workers' operator sets
    those), and refused otherwise (dgrpo/art_compat/settings_rule.py); ``config`` is the program's own settings
    object, kept as ``model.config``.
    ``run_name`` (ART 0.5.23) names the run when a ``name`` is trained more than once: records, checkpoints
    and local files go under ``<project>-<run_name>``, and ``model=<name>`` still reaches the served step.

    What follows from the fields (``spec``, ``run_id``, ``max_seq_len``) is derived when read, so setting
    ``name``, ``base_model``, ``_internal_config``, ... after construction (on a ``model_copy()``, as ART's
    programs do) is what trains. Each such assignment is checked as the constructor checks it; after
    ``register`` one that changes the run id or the spec is refused (``ModelConflictError``): the run's
    checkpoints belong to them.
    """

    base_model: str = "smollm2-135m-instruct"
    lora: LoraConfig | None = None
    """dgrpo's LoRA shape (else ``lora_config``, ``_internal_config['peft_args']``, or ART's default, rank 8)."""
    lora_config: dict[str, Any] | None = None
    """ART 0.5's ``art.LoRAConfig`` (``rank``, ``alpha``, ``dropout``, ``target_modules``)."""
    run_name: str | None = None
    """ART 0.5.23's run name; None: ``name``."""
    trainable: bool = True

    _internal_config: dict[str, Any] | None = PrivateAttr(default=None)
    """ART's ``_internal_config`` as given (its keys that map are mapped when read)."""
    _served: str | None = PrivateAttr(default=None)
    _base_served: str | None = PrivateAttr(default=None)
    _trained_checkpoint: CheckpointRef | None = PrivateAttr(default=None)
    _registered: tuple[str, ModelSpec] | None = PrivateAttr(default=None)
    """The run id and spec ``register`` recorded, which the model keeps from then on."""

    def __init__(
        self,
        name: str,
        project: str = "default",
        base_model: str = "smollm2-135m-instruct",
        *,
        lora: LoraConfig | None = None,
        lora_config: Mapping[str, Any] | None = None,
        run_name: str | None = None,
        entity: str | None = None,
        id: str | None = None,
        run_id: str | None = None,
        config: ModelConfig | None = None,
        base_path: str = layout.ART_BASE_PATH,
        report_metrics: list[str] | None = None,
        _internal_config: Mapping[str, Any] | None = None,
    ) -> None:
        BaseModel.__init__(
            self,
            name=name,
            project=project,
            base_model=base_model,
            lora=lora,
            lora_config=None if lora_config is None else dict(lora_config),
            run_name=run_name,
            entity=entity,
            id=id,
            config=config,
            base_path=base_path,
            report_metrics=report_metrics,
        )
        # Checked as it is set (__setattr__), as every later assignment is.
        self._internal_config = None if _internal_config is None else dict(_internal_config)
        if run_id is not None and run_id != self.run_id:
            raise UnsupportedArtOption(
                f"run_id={run_id!r}: a dgrpo model's run id is always <project>-<run_name or name> "
                f"({self.run_id!r}), the prefix its checkpoints and metrics live under; leave run_id out"
            )

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in IDENTITY:
            super().__setattr__(name, value)
            return
        if name == "_internal_config" and value is not None:
            value = dict(value)
        before = getattr(self, name)
        super().__setattr__(name, value)
        try:
            self.check_identity()
        except Exception:
            super().__setattr__(name, before)  # the model stays as it was
            raise
        if name == "_internal_config":
            warn_ignored(self.name, internal_settings(value or {}).ignored)

    def storage_name(self) -> str:
        return self.run_name or self.name

    def names_its_run(self) -> bool:
        return self.run_name is not None

    @property
    def spec(self) -> ModelSpec:
        """The ``ModelSpec`` the workers train and serve, from the model's fields as they are now."""
        internal = self._internal_config or {}
        return ModelSpec(
            name=self.name,
            project=self.project,
            base_model=self.base_model,
            lora=lora_of(self.lora, self.lora_config, internal),
            chat_template=chat_template_of(internal),
        )

    def check_identity(self) -> tuple[str, ModelSpec]:
        """The model's run id and spec, checked: after ``register`` they must be the ones it registered with
        (``ModelConflictError`` naming what changed otherwise)."""
        run_id, spec = self.run_id, self.spec
        if self._registered is None or self._registered == (run_id, spec):
            return run_id, spec
        raise changed_since_register(*self._registered, run_id, spec)

    @property
    def max_seq_len(self) -> int | None:
        """``_internal_config['init_args']['max_seq_length']``: the default ``TrainConfig.max_seq_len``."""
        return self.train_defaults.get("max_seq_len")

    @property
    def train_defaults(self) -> dict[str, Any]:
        """The ``TrainConfig`` fields the model's ``_internal_config`` sets for every step that leaves them unset
        (``init_args.max_seq_length``, ``trainer_args.max_grad_norm``, ...)."""
        return internal_settings(self._internal_config or {}).train_defaults

    @property
    def chat_template_kwargs(self) -> dict[str, Any] | None:
        """ART's ``_internal_config["chat_template_kwargs"]`` (``enable_thinking``, ...): the server renders
        each chat completion of ``openai_client()`` with them."""
        kwargs = (self._internal_config or {}).get("chat_template_kwargs")
        return None if kwargs is None else dict(kwargs)

    @property
    def trained_checkpoint(self) -> CheckpointRef | None:
        """The checkpoint of the newest ``TrainStep`` (``backend.train``'s ``checkpoint_path``)."""
        return self._trained_checkpoint

    @trained_checkpoint.setter
    def trained_checkpoint(self, checkpoint: CheckpointRef | None) -> None:
        self._trained_checkpoint = checkpoint

    def model_dump(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The fields, and ``_internal_config`` (ART's)."""
        return {**super().model_dump(*args, **kwargs), "_internal_config": self._internal_config}

    # ---- registration and serving ----------------------------------------------------------------
    async def register(
        self, backend: ArtBackend, _openai_client_config: Mapping[str, Any] | None = None
    ) -> None:
        """Bind the model to ``backend`` as ART's model does, by ART's hooks: ``backend.register(model)``
        (dgrpo's backends: ``join``, which records the model's run, or checks the record, and serves its newest
        step), then ``backend._prepare_backend_for_training(model, _openai_client_config)`` for the inference
        server's URL and key, and ``backend._model_inference_name(model)`` for the name it answers under. So
        any ``art.Backend`` works: NeMo Agent Toolkit's ``RemoteBackend`` (a client of ART's server) too.
        ``_openai_client_config`` is ART's ``dev.OpenAIServerConfig``; dgrpo's backends take what maps to their
        server and warn about the settings of ART's own server (dgrpo/art_compat/settings_rule.py)."""
        check_config(self.config)
        refuse_gpu_ids(self._internal_config or {})
        self._registered = None  # registering again (with another backend) records what the model is now
        self._served = self._base_served = None
        self.check_identity()
        await self._registered_by(backend)
        if self._registered is None:  # a backend of ART's own: the model is what it registered as, from now
            self._registered = self.check_identity()
        url, key = await backend._prepare_backend_for_training(self, _openai_client_config)
        self.inference_base_url, self.inference_api_key = url, key
        self._client = None
        self.inference_model_name = backend._model_inference_name(self)

    async def join(self, backend: Backend) -> None:
        """What dgrpo's backends do to register the model (their ``register`` hook): record it under its run
        (or check the record) and serve its newest step (dgrpo/client/registration.py's ``join_run``)."""
        run_id, spec = self.check_identity()
        joined = await join_run(backend, run_id, spec, self.warm_start)
        self._backend, self._store, self._registered = backend, joined.store, (run_id, spec)
        self._base_served, self._step, self._served = joined.base_served, joined.step, joined.served

    def use_served(self, step: int, adapter: str) -> None:
        """Route the model to ``adapter``, the newest step its backend's ``TrainStep`` or ``TrainSFT``, or a
        ``TrainingRun`` of this model, served (what ``PipelineTrainer`` evaluates)."""
        self._require_backend()
        self._step, self._served = step, adapter

    @property
    def warm_start(self) -> bool:
        """``base_model`` is a LoRA adapter directory (seen from this machine): step 0 is that adapter."""
        return (Path(self.base_model) / "adapter_config.json").is_file()

    def get_inference_name(self, step: int | None = None) -> str:
        """The name the inference server answers the model's newest step (or ``step``) under. On dgrpo's
        backends ``served_name``; on a backend of ART's own, its ``_model_inference_name`` (ART's); before
        ``register``, ART's unregistered name: ``name``, or ``name@<step>``."""
        if self._served is not None and self._base_served is not None:
            return self.served_name(step)
        if self._backend is not None and not isinstance(self._backend, Backend):
            return self._backend._model_inference_name(self, step=step)
        return super().get_inference_name(step)

    def served_name(self, step: int | None = None) -> str:
        """dgrpo's served name of the newest step (``<run id>@<step>``, or the base model at step 0), or of
        checkpoint ``step``: ``<run id>@<step>`` (served while the newest step or a lease holds it), and for
        step 0 of a fresh LoRA the base model itself (a baseline to compare with)."""
        if self._served is None or self._base_served is None:
            raise NotRegisteredError(
                f"model {self.name!r} is not served by a dgrpo backend: register it first"
            )
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
        return train_workflow_id(self.run_id, step)

    async def train(
        self,
        trajectory_groups: Iterable[TrajectoryGroup],
        config: TrainConfig | None = None,
        _config: Mapping[str, Any] | None = None,
        verbose: bool = False,
    ) -> TrainStepResult | TrainResult:
        """Train one GRPO step on the groups; returns once the new adapter is served.

        On dgrpo's backends the step is a durable ``TrainStep`` and its ``TrainStepResult`` is returned. As in
        ART >= 0.4.4, a batch with nothing to learn from (no groups, every rollout failed, or every group's
        rewards equal) trains nothing but still advances the step: the current checkpoint is published again
        as the next one and served (``result.trained`` is False, the step's metrics say ``data/step_skipped``).
        On a backend of ART's own, as ART 0.5.17's model: its ``_train_model`` rows averaged, logged with
        ``model.log`` at the step ``_get_step`` then says, and returned as a ``TrainResult`` (ART: None).

        ``config`` is ``art.TrainConfig``; what it leaves unset is ART's default (dgrpo/art_compat/defaults.py).
        ``_config`` takes ART's ``dev.TrainConfig`` keys that dgrpo has (``epsilon``, ``epsilon_high``,
        ``scale_rewards``) and refuses the others; ``verbose`` is accepted (the workers log each stage).
        """
        step_config = self.step_config(config, train_config_fields("model.train(_config=...)", _config or {}))
        # Refused as given, registered or not.
        groups = check_trainable(list(trajectory_groups), PolicyNames.of(self))
        backend = self.backend()
        if isinstance(backend, Backend):
            # The step's numbers also as history.jsonl rows and W&B, as ART 0.3's model.train logged them.
            return await backend.train_step(self, groups, step_config, history=True)
        return await train_by_hooks(self, backend, groups, step_config, dict(_config or {}), verbose)

    async def train_sft(
        self,
        trajectories: Iterable[Trajectory],
        config: TrainSFTConfig | None = None,
        _config: Mapping[str, Any] | None = None,
        verbose: bool = False,
        log_metrics: bool = True,
    ) -> TrainResult | None:
        """ART's supervised fine-tuning, through the backend's ``_train_sft`` (dgrpo's: a durable ``TrainSFT``
        that trains on the trajectories' assistant turns, then publishes and serves the next step). As in
        ART, the batches' numbers are averaged into one ``train`` row at the step the backend then reports
        (not logged with ``log_metrics=False``, ART 0.5.23's); returns that step and row (ART returns None),
        or None when the backend trained no batch."""
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
        if log_metrics:
            await self.log(metrics=metrics, split="train", step=step)
        return TrainResult(step=step, metrics=metrics)

    def step_config(self, config: TrainConfig | None, overrides: Mapping[str, Any]) -> TrainConfig:
        """The step's ``TrainConfig``: what ``config`` sets and ART's options (``overrides``), then the model's
        ``train_defaults`` (its ``_internal_config``), then ART's defaults (``art.TrainConfig``'s)."""
        given = dict(config.model_dump(exclude_unset=True)) if config is not None else {}
        return ArtTrainConfig.model_validate({**self.train_defaults, **given, **overrides}).for_step()

    # ---- checkpoints ------------------------------------------------------------------------------
    async def delete_checkpoints(
        self, best_checkpoint_metric: str = "val/reward", keep_last: int = 1
    ) -> list[int]:
        """Delete checkpoints except the newest ``keep_last`` and the best by ``best_checkpoint_metric``, through
        the backend's ``_delete_checkpoint_files`` (ART's hook); returns the steps deleted. dgrpo's backends
        rank the steps by the run's metrics in the object store; on a backend of ART's own, as ART's model
        does, the newest step and the best by ``history.jsonl`` are kept (``keep_last`` is dgrpo's)."""
        backend = self.backend()
        if isinstance(backend, Backend):
            run_id, _ = self.check_identity()
            kept = await asyncio.to_thread(
                select_checkpoints_to_keep, backend.object_store(), run_id, best_checkpoint_metric, keep_last
            )
            return list(await backend._delete_checkpoint_files(self, kept))
        await delete_by_hooks(self, backend, best_checkpoint_metric)
        return []

    # ---- helpers ----------------------------------------------------------------------------------
    def _default_chat_completion_extra_body(self) -> dict[str, Any] | None:
        """ART's ``chat_template_kwargs``, and the model's own chat template (vLLM's request field, which ART
        sets as its server's ``--chat-template`` instead: dgrpo's server is shared by every run on it)."""
        body: dict[str, Any] = {}
        if self.chat_template_kwargs is not None:
            body["chat_template_kwargs"] = dict(self.chat_template_kwargs)
        chat_template = chat_template_of(self._internal_config or {})
        if chat_template is not None:
            body["chat_template"] = chat_template
        return body or None

    def record_step(
        self, step: int, metrics: dict[str, float], *, history: bool, redraw_curve: bool = False
    ) -> None:
        """A training step's numbers into the run's metrics Parquet (its reward curve redrawn when asked);
        with ``history`` (``model.train``'s) also a ``train`` row of ``history.jsonl`` and W&B, as ART 0.3's
        ``model.train`` logged them. ``backend.train`` leaves those rows to the program's ``model.log``, as
        ART 0.5's does."""
        self._record(step, metrics, f"{self.project}/{self.name}" if redraw_curve else None)
        if history:
            self._log_metrics(metrics, "train", step)
