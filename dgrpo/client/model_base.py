"""``ModelBase``: what every model has, the base of ART's ``Model`` and ``TrainableModel`` (dgrpo/model.py):
its name and run id, its backend once registered, ``log`` (ART's local files under ``base_path``,
dgrpo/model_log/; the run's metrics Parquet under ``runs/<project>-<name>/`` in the object store once
registered; W&B), its metrics builders and cost calculator. ``Model.openai_client`` is in dgrpo/model.py, where
ART's tests replace ``art.model.AsyncOpenAI``.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import re
import time
from collections.abc import Iterable
from contextvars import Token
from pathlib import Path
from typing import Any, Generic, Self

from openai import AsyncOpenAI
from pydantic import BaseModel, ConfigDict, GetCoreSchemaHandler, PrivateAttr, ValidatorFunctionWrapHandler
from pydantic_core import CoreSchema, core_schema
from typing_extensions import TypeVar

from activities.metrics import WandbSink
from activities.object_store import ObjectStore
from dgrpo.client.backends import ArtBackend, Backend
from dgrpo.costs import CostCalculator, CostRecorder, sampled_tokens
from dgrpo.errors import NotRegisteredError
from dgrpo.metrics import MetricsBuilder
from dgrpo.model_log.dialect import log_dialect
from dgrpo.model_log.local_files import LocalModelLog
from dgrpo.model_log.run_metrics import group_metrics, qualified, record_metrics
from schemas import layout
from schemas.config import NAME_PATTERN
from schemas.errors import RunSpecError
from schemas.trajectory import Trajectory, TrajectoryGroup
from serving.client import openai_base_url

log = logging.getLogger(__name__)


def _no_costs(
    prompt_tokens: int | None, completion_tokens: int | None, cost_context: str
) -> dict[str, float]:
    return {}


def run_id_of(project: str, name: str) -> str:
    """The run id of model ``name`` in ``project``: ``<project>-<name>`` with each ``-`` of the project
    doubled, so no two (project, name) pairs share one."""
    return f"{project.replace('-', '--')}-{name}"


ModelConfig = TypeVar("ModelConfig", default=Any)
"""The type of a model's ``config`` (``art.TrainableModel[MyConfig]``); any object when not given."""
StateType = TypeVar("StateType", bound=dict[str, Any], default=dict[str, Any])
"""ART's second type parameter (``Model[Config, State]``): accepted for annotations, unused."""

COPIED_PRIVATE = frozenset({"_cost_calculator", "_wandb_config", "_internal_config"})
"""Private attributes a copy takes along (the model's settings); every other one is runtime state (the backend,
clients, step, W&B run, metrics builders), which a copy starts afresh: a copy is a new, unregistered model."""


class ModelBase(BaseModel, Generic[ModelConfig, StateType]):
    """What every model has (``dgrpo.model.Model`` adds its OpenAI client): its name and run id, its
    backend once registered, its ``log`` (ART's local files, the run's metrics Parquet, W&B), its metrics
    builders and cost calculator.

    A pydantic model, as ART's: ``Model[Config]`` subscripts, ``model_copy(deep=True)`` copies, and a model is
    a field of the program's own pydantic models. Fields are plain attributes (set them freely, as in ART);
    what follows from them (the run id, the local log's directory, the OpenAI client) is derived when used,
    so nothing goes stale after an assignment."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    name: str
    project: str = "default"
    entity: str | None = None
    id: str | None = None
    config: ModelConfig | None = None
    """The program's own settings object (ART's ``model.config``), kept as given."""
    trainable: bool = False
    """ART's discriminator: True for a ``TrainableModel``."""
    inference_api_key: str | None = None
    inference_base_url: str | None = None
    inference_model_name: str | None = None
    """The endpoint's name for the model, when not ``name`` (read when used: it follows ``name`` until set)."""
    base_path: str = layout.ART_BASE_PATH
    report_metrics: list[str] | None = None

    _cost_calculator: CostCalculator | None = PrivateAttr(default=None)
    _wandb_config: dict[str, Any] = PrivateAttr(default_factory=dict)
    _client: AsyncOpenAI | None = PrivateAttr(default=None)
    _client_made_for: tuple[Any, ...] | None = PrivateAttr(default=None)
    """What ``_client`` was made for (URL, key, names, request defaults): another value makes a new one."""
    _backend: ArtBackend | None = PrivateAttr(default=None)
    _store: ObjectStore | None = PrivateAttr(default=None)
    """The object store of the dgrpo backend ``register`` bound, where ``log`` also records the run's metrics
    Parquet; None for a backend of ART's own, or one set otherwise (ART's tests set ``model._backend``)."""
    _step: int = PrivateAttr(default=0)
    _wandb: WandbSink | None = PrivateAttr(default=None)
    _metrics: MetricsBuilder = PrivateAttr(default_factory=lambda: MetricsBuilder("train"))
    _local_log: LocalModelLog | None = PrivateAttr(default=None)
    _last_train_log_at: float = PrivateAttr(default_factory=lambda: time.monotonic())  # looked up when made
    _last_train_log_step: int | None = PrivateAttr(default=None)

    def __init__(
        self,
        name: str,
        project: str = "default",
        *,
        entity: str | None = None,
        id: str | None = None,
        config: ModelConfig | None = None,
        inference_base_url: str | None = None,
        inference_model_name: str | None = None,
        inference_api_key: str | None = None,
        base_path: str = layout.ART_BASE_PATH,
        report_metrics: list[str] | None = None,
    ) -> None:
        super().__init__(
            name=name,
            project=project,
            entity=entity,
            id=id,
            config=config,
            inference_base_url=inference_base_url,
            inference_model_name=inference_model_name,
            inference_api_key=inference_api_key,
            base_path=base_path,
            report_metrics=report_metrics,
        )

    # ---- copies: the settings go along, the runtime state starts afresh --------------------------------
    def __copy__(self) -> Self:
        copied = super().__copy__()
        copied._start_fresh()
        return copied

    def __deepcopy__(self, memo: dict[int, Any] | None = None) -> Self:
        memo = {} if memo is None else memo
        copied = self.__copy__()  # fresh runtime state, so no backend, client or W&B run is deep-copied
        memo[id(self)] = copied
        object.__setattr__(copied, "__dict__", copy.deepcopy(self.__dict__, memo))
        private = copied.__pydantic_private__ or {}
        for key in COPIED_PRIVATE & private.keys():
            private[key] = copy.deepcopy(private[key], memo)
        return copied

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        """A model given to a field of a model type (``teacher: art.Model[Config]``) is that object, as a model
        given to ``art.Model`` is: a live model (its backend, client, step) is never rebuilt from its fields."""
        origin = cls.__pydantic_generic_metadata__["origin"] or cls

        def same_model(value: Any, validate: ValidatorFunctionWrapHandler) -> Any:
            return value if isinstance(value, origin) else validate(value)

        return core_schema.no_info_wrap_validator_function(same_model, handler(source))

    def _start_fresh(self) -> None:
        """Every private attribute outside ``COPIED_PRIVATE`` back to its default (a copy's runtime state)."""
        fresh = {
            key: attr.get_default(call_default_factory=True, validated_data=None)
            for key, attr in self.__private_attributes__.items()
            if key not in COPIED_PRIVATE
        }
        kept = {k: v for k, v in (self.__pydantic_private__ or {}).items() if k in COPIED_PRIVATE}
        object.__setattr__(self, "__pydantic_private__", {**fresh, **kept})

    def names_its_run(self) -> bool:
        """The program gave the run a name of its own (ART 0.5.23's ``TrainableModel(run_name=...)``): its
        ``log`` then writes 0.5.23's files (dgrpo/model_log/dialect.py)."""
        return False

    def storage_name(self) -> str:
        """The name the model's records are kept under (ART 0.5.23's ``_storage_name()``): its ``name``; a
        ``TrainableModel``'s ``run_name`` when given."""
        return self.name

    @property
    def run_id(self) -> str:
        """Where the model's records live in the object store: ``runs/<project>-<name>/``, each ``-`` of the
        project doubled, so no two (project, name) pairs share one: ``rl``/``math-agent`` is ``rl-math-agent``,
        ``rl-math``/``agent`` is ``rl--math-agent`` (the first lone ``-`` ends the project; a name starts with
        a letter or digit)."""
        run_id = run_id_of(self.project, self.storage_name())
        if not re.fullmatch(NAME_PATTERN, run_id) or not re.fullmatch(NAME_PATTERN, self.storage_name()):
            raise RunSpecError(
                f"model name {self.name!r} in project {self.project!r} cannot name a run ({run_id!r} must match "
                f"{NAME_PATTERN}); give the endpoint's model id as inference_model_name= and a plain name="
            )
        return run_id

    async def register(self, backend: ArtBackend) -> None:
        """Bind the model to ``backend`` by ART's hook, ``backend.register(model)``: on dgrpo's backends
        (``join``) ``log`` then records its trajectories next to the trained ones."""
        check_config(self.config)
        await self._registered_by(backend)

    async def _registered_by(self, backend: ArtBackend) -> None:
        """ART's order: the model names its backend, then the backend registers it; a registration that
        fails leaves the model as it was."""
        before = self._backend, self._store
        self._backend = backend
        try:
            await backend.register(self)
        except BaseException:
            self._backend, self._store = before
            raise

    async def join(self, backend: Backend) -> None:
        """What dgrpo's backends do to register a model (their ``register`` hook): start, and bind their
        object store, where ``log`` also records the run's metrics Parquet."""
        await backend.start()
        store = backend.object_store()
        await asyncio.to_thread(store.ensure_bucket)
        self._backend, self._store = backend, store

    def backend(self) -> ArtBackend:
        """The backend the model is registered with (ART's ``model.backend()``)."""
        return self._require_backend()

    def get_inference_name(self, step: int | None = None) -> str:
        """The name the endpoint answers this model under: ``inference_model_name``, else ``name``
        (``<that>@<step>`` for a given step)."""
        served = self.inference_model_name or self.name
        return served if step is None else f"{served}@{step}"

    async def get_step(self) -> int:
        """0: a model that is not trained has no steps (as in ART)."""
        return self._step

    @property
    def cost_calculator(self) -> CostCalculator:
        """What a chat completion of ``openai_client()`` costs (ART's): none unless ``set_cost_calculator``."""
        return self._cost_calculator or _no_costs

    def set_cost_calculator(self, calculator: CostCalculator | None) -> None:
        """Price this model's own chat completions, e.g. ``build_cost_calculator(MODEL_PRICING[name])``; None
        stops. dgrpo's backends set none (its inference runs on the operator's hardware)."""
        self._cost_calculator = calculator

    def _record_openai_completion_costs(self, response: Any) -> None:
        """ART's: ``response``'s cost into the active metrics builder's ``costs/<context>/...``, if one is."""
        try:
            builder = MetricsBuilder.get_active()
        except LookupError:
            return
        prompt_tokens, completion_tokens = sampled_tokens(response)
        costs = self.cost_calculator(prompt_tokens, completion_tokens, builder.cost_context)
        for key, usd in costs.items():
            if key.startswith("costs/"):
                builder.add_cost(key.removeprefix("costs/"), float(usd))

    def _default_chat_completion_extra_body(self) -> dict[str, Any] | None:
        """The ``extra_body`` every chat completion of ``openai_client()`` sends (ART's); none for a ``Model``."""
        return None

    def litellm_completion_params(self, step: int | None = None) -> dict[str, Any]:
        """``litellm.acompletion(**params, messages=...)`` keyword arguments for this model (ART's); before
        ``register`` (no server yet) ``base_url`` is None, as in ART."""
        name = self.get_inference_name(step)
        url = self.inference_base_url
        params: dict[str, Any] = {
            # litellm's provider prefix for an OpenAI-compatible vLLM server.
            "model": f"hosted_vllm/{name}" if self.trainable else name,
            "base_url": None if url is None else openai_base_url(url),
            "api_key": self.inference_api_key,
            "temperature": 1,  # sampling at the policy's own distribution, as GRPO assumes
        }
        if extra_body := self._default_chat_completion_extra_body():
            params["extra_body"] = extra_body
        return params

    async def log(
        self,
        trajectories: Iterable[TrajectoryGroup] | Iterable[Trajectory | BaseException] | None = None,
        split: str = "val",
        *,
        metrics: dict[str, float] | None = None,
        step: int | None = None,
    ) -> dict[str, float]:
        """Record ``<split>/...`` numbers at ``step`` (default: the current step); returns them.

        ``trajectories`` may be groups, or trajectories (one group); ``metrics`` are added as given
        (prefixed with the split unless they start with one of ART's sections, as ``loss/train`` does),
        e.g. ``backend.train``'s result metrics. As in ART, every model (registered or not) writes its local
        files under ``base_path`` (dgrpo/model_log/local_files.py); a registered one also records the numbers in its run's
        metrics Parquet (and W&B when asked).
        """
        groups = None if trajectories is None else _as_groups(trajectories)
        at = await self.get_step() if step is None else step
        if groups is not None or metrics is not None:  # ART's rule: a call with neither adds nothing
            metrics = {**self._automatic_train_metrics(split, at, set(metrics or {})), **(metrics or {})}
        row: dict[str, float] = {}
        if groups is not None:
            row.update(group_metrics(groups, split))
        for name, value in (metrics or {}).items():
            row[qualified(name, split)] = float(value)
        builder = self._metrics_for_split(split)
        builder_numbers = builder.pending()  # the split's API costs, ... (the local log sums them too)
        row.update(await builder.flush())
        if not row:
            raise ValueError("model.log got neither trajectories nor metrics; nothing to record")
        history_row = await self.local_log().log(groups, split, at, dict(metrics or {}), builder_numbers)
        if history_row:
            self._log_metrics(history_row, split, at)  # a line of a local file, and W&B's own queue (ART's)
        if self._store is not None:
            await asyncio.to_thread(self._record, at, row)
        return row

    def _automatic_train_metrics(self, split: str, step: int, given: set[str]) -> dict[str, float]:
        """ART's numbers of a ``train`` row at a new step, for a backend that keeps them
        (``supports_automatic_train_step_metrics``, as dgrpo's ``LocalBackend``): ``time/step_wall_s``, the
        seconds since the previous step's row (or since the model was made), and ``costs/gpu`` at the
        backend's ``automatic_gpu_cost_per_hour_usd`` for those seconds (none when it has no price). A number
        the caller gives wins."""
        supported = getattr(self._backend, "supports_automatic_train_step_metrics", None)
        if (
            split != "train"
            or step == self._last_train_log_step
            or not callable(supported)
            or not supported()
        ):
            return {}
        now = time.monotonic()
        wall_s = max(0.0, now - self._last_train_log_at)
        self._last_train_log_at, self._last_train_log_step = now, step
        numbers = {} if "time/step_wall_s" in given else {"time/step_wall_s": wall_s}
        price = getattr(self._backend, "automatic_gpu_cost_per_hour_usd", None)
        per_hour = price(self) if callable(price) and "costs/gpu" not in given else None
        if isinstance(per_hour, int | float):
            numbers["costs/gpu"] = wall_s * float(per_hour) / 3600.0
        return numbers

    def _record(self, step: int, metrics: dict[str, float], curve_title: str | None = None) -> None:
        """Into the run's metrics Parquet (dgrpo's names and totals); redraw the reward curve if titled."""
        if self._store is None:
            raise NotRegisteredError(
                f"model {self.name!r} is not registered: call `await model.register(backend)` first"
            )
        record_metrics(self._store, self.run_id, self.name, step, metrics, curve_title)

    def _log_metrics(self, metrics: dict[str, float], split: str, step: int) -> None:
        """ART's one row of a log call: appended to ``history.jsonl`` under ART's keys (dgrpo/model_log/local_files.py), and
        the same row sent to the model's W&B run when ``report_metrics`` asks for it (ART's rule)."""
        row = self.local_log().append(metrics, split, step)
        try:
            run = self._get_wandb_run()
            if run is not None and self._wandb is not None:
                self._wandb.log_row(self._wandb_id, run, row)
        except Exception as err:  # W&B is a convenience: the history row is already written
            log.warning(
                "W&B logging for %s step %d failed: %s: %s", self._wandb_id, step, type(err).__name__, err
            )

    def local_log(self) -> LocalModelLog:
        """ART's local files of the model's ``log`` calls, under ``<base_path>/<project>/models/<storage name>``
        as they are now (a new directory after ``project`` or ``name`` changed: its own files and totals)."""
        directory = layout.art_model_dir(self.base_path, self.project, self.storage_name())
        dialect = log_dialect(run_name_given=self.names_its_run())
        if self._local_log is None or (self._local_log.dir, self._local_log.dialect) != (directory, dialect):
            self._local_log = LocalModelLog(self.base_path, self.project, self.storage_name(), dialect)
        return self._local_log

    def reload_local_log(self) -> None:
        """Read the local files again at the next ``log`` (a pull from a backup replaced them)."""
        self._local_log = None

    @property
    def _wandb_id(self) -> str:
        """The W&B run's id: the model's run id, the one a ``TrainingRun`` of this model logs to as well."""
        return run_id_of(self.project, self.storage_name())

    def _get_wandb_run(self) -> Any:
        """The model's W&B run, opened on first use (and again once finished) with ART's ``wandb.init``
        arguments, ``define_metric`` calls and config (activities/metrics.py, ``WandbSink``); None when
        ``report_metrics`` does not ask for W&B."""
        if not self.reports_to_wandb():
            return None
        if self._wandb is None:
            dialect = self.local_log().dialect
            self._wandb = WandbSink(
                Path(self.base_path) / "wandb", sections=dialect.wandb_sections, clock=dialect.wall_clock
            )
            self._wandb.update_config(self._wandb_id, self._wandb_config)
        return self._wandb.run(self._wandb_id, self.project, self.storage_name())

    def reports_to_wandb(self) -> bool:
        """As in ART: ``report_metrics`` names ``"wandb"``, or is None and ``WANDB_API_KEY`` is set (without a
        key the run is written offline, under ``<base_path>/wandb/<run id>/``)."""
        if self.report_metrics is None:
            return "WANDB_API_KEY" in os.environ
        return "wandb" in self.report_metrics

    def metrics_builder(self, cost_context: str | None = None) -> MetricsBuilder:
        """The model's ``MetricsBuilder`` (``cost_context`` picks ``costs/<context>/...``); ``log`` flushes it:
        split ``train`` the ``train`` context's numbers, ``val`` and ``test`` the ``eval`` context's."""
        return self._metrics if cost_context is None else self._metrics.for_cost_context(cost_context)

    def activate_metrics_context(self, cost_context: str) -> Token[CostRecorder]:
        """Record ``track_api_cost`` calls (in this task and those it starts) as ``costs/<cost_context>/...``."""
        return self.metrics_builder(cost_context).activate()

    def _metrics_for_split(self, split: str) -> MetricsBuilder:
        context = "eval" if split in ("val", "test") else split
        return self._metrics.for_cost_context(context, buffer_scope=context)

    def update_wandb_config(self, config: dict[str, Any]) -> None:
        """Merge ``config`` into the model's W&B run config (ART's): before the run exists it is given to
        ``wandb.init``, after it updates the run. A key already set to another value is refused (W&B's
        config is immutable once set); nested dicts merge."""
        if not isinstance(config, dict):
            raise TypeError(f"config must be a dict[str, Any], not {type(config).__name__}")
        self._wandb_config = merged_wandb_config(self._wandb_config, config)
        if self._wandb is not None:
            self._wandb.update_config(self._wandb_id, self._wandb_config)

    def finish_wandb(self) -> None:
        """Finish the model's W&B run (dgrpo only; ART leaves it to the process's exit)."""
        if self._wandb is not None:
            self._wandb.close()

    def _require_backend(self) -> ArtBackend:
        if self._backend is None:
            raise NotRegisteredError(
                f"model {self.name!r} is not registered: call `await model.register(backend)` first"
            )
        return self._backend


def merged_wandb_config(existing: dict[str, Any], updates: dict[str, Any], path: str = "") -> dict[str, Any]:
    """``existing`` with ``updates`` merged in (nested dicts key by key); a different value for a key already
    set raises ValueError naming the key's dotted path."""
    merged = dict(existing)
    for key, value in updates.items():
        where = f"{path}.{key}" if path else key
        if key not in merged:
            merged[key] = value
        elif isinstance(merged[key], dict) and isinstance(value, dict):
            merged[key] = merged_wandb_config(merged[key], value, where)
        elif merged[key] != value:
            raise ValueError(
                f"W&B config is immutable once set. Conflicting value for {where!r}: {merged[key]!r} set, {value!r} given"
            )
    return merged


def check_config(config: Any) -> None:
    """ART refuses a ``config`` it cannot store as JSON; so does dgrpo, at ``register``."""
    if isinstance(config, BaseModel):
        try:
            config.model_dump_json()
        except ValueError as err:
            raise RunSpecError(
                f"the model's config ({type(config).__name__}) cannot be serialized to JSON: {err}"
            ) from err


def _as_groups(items: Iterable[Any]) -> list[TrajectoryGroup]:
    """Groups as given, or trajectories (and exceptions) as one group, as ART's ``model.log`` takes them."""
    listed = list(items)
    if all(isinstance(i, TrajectoryGroup) for i in listed):
        return listed
    if all(isinstance(i, Trajectory | BaseException) for i in listed):
        return [TrajectoryGroup(listed)]
    raise TypeError("model.log takes TrajectoryGroups, or Trajectories (and exceptions), not a mix")
