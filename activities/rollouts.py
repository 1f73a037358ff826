"""The rollouts activity (inference queue): run the user's rollout function on this step's scenarios.

``async def rollout(model, scenario) -> Trajectory`` is imported by path (``examples.arithmetic:rollout``)
and called ``group_size`` times per scenario, concurrently (``task.rollout_concurrency`` at once), each
under ``task.rollout_timeout_s``. ``model`` is a ``RolloutModel`` whose ``openai_client()`` routes
``model=model.name`` to the adapter this step pins. A rollout that raises, hangs or returns something
other than a ``Trajectory`` is recorded with its group; more than ``task.max_exceptions`` of them fail
the step. The groups go to ``layout.rollout_shard_key`` when the workflow merges them into the step's table
(one shard of several, or a single shard with ``RolloutsInput.merged``: one key per attempt, so a late attempt
never overwrites the one the workflow recorded), else to ``runs/<run>/steps/<step>/trajectories.parquet``.
Shards of one run on one worker share ``task.rollout_concurrency``: it bounds the rollouts the worker runs at
once, however many shards it took.

Task code is the inference worker's operator's: it is imported only from the packages the worker was
started with (``dgrpo worker --task-module``, ``$DGRPO_TASK_MODULES``, default ``examples.``), checked
before the import runs any of it; scenario files are read only from under the worker's working
directory, and a run's stored inline list only at its own key (``activities/scenario_store.py``). A reward
that is not finite or beyond ``MAX_ABS_REWARD``, or a sampling logprob outside ``[MIN_SAMPLING_LOGPROB, 0]``,
fails the step before anything is stored, naming the trajectory.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import importlib
import inspect
import json
import logging
import random
from array import array
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.advantages import check_numbers
from activities.fleet_metrics import fleet_metrics
from activities.object_store import ObjectStore
from activities.rollout_model import RolloutModel, discover_base_model, own_server_api_key
from activities.run_texts import RunTextCache
from activities.scenario_store import ScenarioCache
from activities.serving import ServingActivities
from activities.trajectory_store import upload_groups
from schemas.activities import ActivityName, RolloutsInput
from schemas.config import TaskSpec
from schemas.errors import ROLLOUT_FAILED, DgrpoError, RunSpecError, TaskImportError
from schemas.layout import adapter_name, rollout_shard_key
from schemas.refs import ObjectRef, TrajectoriesRef
from schemas.settings import ENV_TASK_MODULES, env_list
from schemas.trajectory import Choice, ExceptionRecord, Trajectory, TrajectoryGroup
from serving.client import openai_base_url

log = logging.getLogger(__name__)

HEARTBEAT_EVERY_S = 10.0
"""Heartbeat at least this often while rollouts run (and after each one finishes)."""

RolloutFn = Callable[[Any, dict[str, Any]], Awaitable[Any]]


DEFAULT_TASK_MODULES: tuple[str, ...] = ("examples.",)
"""Where an inference worker imports task code from unless its operator says otherwise."""


def task_modules_from_env(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """``$DGRPO_TASK_MODULES`` (comma-separated module prefixes), else ``DEFAULT_TASK_MODULES``."""
    return env_list(ENV_TASK_MODULES, env) or DEFAULT_TASK_MODULES


def module_allowed(module: str, prefixes: Sequence[str]) -> bool:
    """True when ``module`` is one of the packages ``prefixes`` names (``examples.``: ``examples`` and
    everything under it) -- a package boundary, so ``examples_evil`` is not ``examples``."""
    for prefix in prefixes:
        package = prefix.rstrip(".")
        if package and (module == package or module.startswith(package + ".")):
            return True
    return False


def _not_allowed(what: str, path: str, module: str, prefixes: Sequence[str]) -> TaskImportError:
    return TaskImportError(
        f"{what} {path!r}: module {module!r} is not one this worker imports task code from "
        f"(allowed: {', '.join(prefixes) or 'none'}); put the task in one of those packages, or ask the "
        f"worker's operator to allow it with `dgrpo worker --task-module PREFIX` or {ENV_TASK_MODULES}"
    )


def import_object(path: str, what: str, prefixes: Sequence[str]) -> Any:
    """``package.module:attr`` -> the object, imported only from a module under ``prefixes``.

    The module is checked before it is imported (importing runs its code); ``TaskImportError`` says why.
    """
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise TaskImportError(f"{what} {path!r} is not an import path; write it as 'package.module:function'")
    if not module_allowed(module_name, prefixes):
        raise _not_allowed(what, path, module_name, prefixes)
    try:
        module = importlib.import_module(module_name)
    except Exception as err:
        raise TaskImportError(
            f"{what} {path!r} does not import: module {module_name!r} failed with {type(err).__name__}: {err}; "
            "put the module on the worker's PYTHONPATH (start the worker from the project root, or "
            "`export PYTHONPATH=...`) and fix any error it raises on import"
        ) from err
    try:
        return getattr(module, attr)
    except AttributeError:
        raise TaskImportError(
            f"{what} {path!r} does not import: module {module_name!r} ({getattr(module, '__file__', '?')}) "
            f"has no attribute {attr!r}; check the function's name"
        ) from None


def _defined_in_allowed(fn: Any, prefixes: Sequence[str]) -> bool:
    """A plain function whose code lives in an allowed module (not one it merely imported, like ``os.abort``)."""
    return inspect.isfunction(fn) and module_allowed(fn.__module__, prefixes)


def load_rollout_function(path: str, prefixes: Sequence[str] = DEFAULT_TASK_MODULES) -> RolloutFn:
    """Import the rollout function and check it is ``async def rollout(model, scenario)`` of an allowed module."""
    fn = import_object(path, "task.rollout", prefixes)
    if not inspect.iscoroutinefunction(fn):
        raise TaskImportError(
            f"task.rollout {path!r} is a {type(fn).__name__}, not an async function; define it as "
            "`async def rollout(model, scenario) -> Trajectory`"
        )
    if not _defined_in_allowed(fn, prefixes):
        raise _not_allowed("task.rollout", path, str(getattr(fn, "__module__", "?")), prefixes)
    return fn  # type: ignore[no-any-return]


def _check_scenarios(items: Any, source: str) -> list[dict[str, Any]]:
    if not isinstance(items, list) or not items:
        raise RunSpecError(
            f"scenarios from {source} must be a non-empty list of dicts, got {type(items).__name__}"
        )
    bad = [i for i, s in enumerate(items) if not isinstance(s, dict)]
    if bad:
        raise RunSpecError(
            f"scenarios from {source}: item {bad[0]} is a {type(items[bad[0]]).__name__}, but each scenario is a dict"
        )
    return items


def scenario_file(name: str) -> Path:
    """The scenarios file ``name`` names, if the worker may read it: under its working directory (links
    resolved) and in no hidden directory (``.dgrpo``, ``.git``, ``.venv``), so a run cannot read the
    worker's other files."""
    cwd = Path.cwd().resolve()
    path = (cwd / name).resolve()
    if not path.is_relative_to(cwd) or any(p.startswith(".") for p in path.relative_to(cwd).parts):
        raise RunSpecError(
            f"task.scenarios file {name!r} is outside this worker's working directory {cwd} or in a hidden "
            "directory; put it under that directory and name it relative to it, or return the scenarios "
            "from a 'module:function' of your task package"
        )
    return path


def load_scenarios(
    scenarios: str | list[dict[str, Any]], prefixes: Sequence[str] = DEFAULT_TASK_MODULES
) -> list[dict[str, Any]]:
    """The scenario list from ``module:function`` (a plain function of an allowed module), a
    ``.jsonl``/``.parquet`` file, or inline; a ``DgrpoError`` says what is wrong."""
    if isinstance(scenarios, list):
        return _check_scenarios(scenarios, "the inline list")
    if scenarios.endswith((".jsonl", ".parquet")):
        path = scenario_file(scenarios)
        if not path.is_file():
            raise RunSpecError(
                f"task.scenarios file {scenarios!r} does not exist on this worker (cwd {Path.cwd()}); "
                "name it relative to the worker's working directory"
            )
        if path.suffix == ".jsonl":
            try:
                items = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                raise RunSpecError(f"task.scenarios {scenarios!r}: not JSON Lines ({err})") from None
        else:
            try:
                items = pq.read_table(path).to_pylist()
            except pa.ArrowException as err:
                raise RunSpecError(f"task.scenarios {scenarios!r}: not a Parquet table ({err})") from None
        return _check_scenarios(items, scenarios)
    fn = import_object(scenarios, "task.scenarios", prefixes)
    if not callable(fn):
        return _check_scenarios(fn, scenarios)
    if not _defined_in_allowed(fn, prefixes):
        raise TaskImportError(
            f"task.scenarios {scenarios!r} is a {type(fn).__name__} from module "
            f"{getattr(fn, '__module__', '?')!r}; it must be a plain function (or a list) defined in a "
            f"module this worker imports task code from ({', '.join(prefixes)})"
        )
    try:
        items = fn()
    except Exception as err:
        raise TaskImportError(f"task.scenarios {scenarios!r} raised {type(err).__name__}: {err}") from err
    return _check_scenarios(list(items) if not isinstance(items, list) else items, scenarios)


@functools.lru_cache(maxsize=2)
def _pass_order(n_scenarios: int, seed: int, epoch: int) -> array[int]:
    """Pass ``epoch``'s seeded shuffle of the list (kept: a step's shards on this worker shuffle it once)."""
    order = list(range(n_scenarios))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return array("q", order)


def pick_scenarios(n_scenarios: int, count: int, offset: int, seed: int) -> list[int]:
    """Indices of this step's scenarios: each pass over the list is its own seeded shuffle, cycled. Each pass
    is shuffled once (not once per group: 64 groups over a million scenarios took 55 s that way)."""
    picked = []
    for position in range(offset, offset + count):
        epoch, index = divmod(position, n_scenarios)
        picked.append(_pass_order(n_scenarios, seed, epoch)[index])
    return picked


def scenario_label(index: int, scenario: dict[str, Any]) -> str:
    """How messages name a scenario: its index, plus its ``id`` when it has one."""
    sid = scenario.get("id", scenario.get("scenario_id"))
    return f"scenario #{index}" + (f" (id {sid!r})" if sid is not None else "")


def normalize_trajectory(value: Any) -> Trajectory:
    """A rollout's return value as a validated ``Trajectory`` (openai SDK choices turned into ``Choice``)."""
    if not isinstance(value, Trajectory):
        raise TypeError(f"returned {type(value).__name__}, expected a Trajectory")
    items = [
        Choice.model_validate(item) if isinstance(item, BaseModel) and not isinstance(item, Choice) else item
        for item in value.messages_and_choices
    ]
    data = {name: getattr(value, name) for name in type(value).model_fields if name != "messages_and_choices"}
    try:
        return Trajectory.model_validate({**data, "messages_and_choices": items})
    except ValidationError as err:
        raise TypeError(f"returned an invalid Trajectory: {err}") from None


async def run_rollout(
    fn: RolloutFn, fn_path: str, model: Any, scenario: dict[str, Any], label: str, timeout_s: float
) -> Trajectory | ExceptionRecord:
    """One rollout: its trajectory, or the record of how it failed (message names function and scenario)."""
    try:
        result = await asyncio.wait_for(fn(model, copy.deepcopy(scenario)), timeout_s)
    except TimeoutError:
        return ExceptionRecord(
            type="TimeoutError", message=f"rollout {fn_path} on {label} timed out after {timeout_s:g} s"
        )
    except Exception as err:
        record = ExceptionRecord.from_exception(err)
        record.message = f"rollout {fn_path} on {label} raised {type(err).__name__}: {err}"
        return record
    try:
        return normalize_trajectory(result)
    except TypeError as err:
        return ExceptionRecord(type=type(err).__name__, message=f"rollout {fn_path} on {label} {err}")


def _heartbeat(done: int, total: int) -> None:
    if activity.in_activity():
        activity.heartbeat({"done": done, "total": total})


async def run_groups(
    fn: RolloutFn,
    task: TaskSpec,
    models: Sequence[Any],
    picked: Sequence[tuple[int, dict[str, Any]]],
    group_size: int,
    policy_step: int | None = None,
    semaphore: asyncio.Semaphore | None = None,
) -> list[TrajectoryGroup]:
    """Run ``group_size`` rollouts per picked scenario; fail fast past ``task.max_exceptions`` failures.
    ``semaphore``: the slots shared with other shards (default: ``task.rollout_concurrency`` of its own)."""
    semaphore = semaphore or asyncio.Semaphore(task.rollout_concurrency)
    total = len(picked) * group_size
    metrics = fleet_metrics()

    async def one(g: int, i: int) -> tuple[int, int, Trajectory | ExceptionRecord]:
        index, scenario = picked[g]
        model = models[(g * group_size + i) % len(models)]
        async with semaphore:
            metrics.rollout_started()
            outcome: Trajectory | ExceptionRecord | None = None
            try:
                outcome = await run_rollout(
                    fn, task.rollout, model, scenario, scenario_label(index, scenario), task.rollout_timeout_s
                )
            finally:
                metrics.rollout_ended(outcome if isinstance(outcome, Trajectory) else None)
        return g, i, outcome

    tasks = [asyncio.create_task(one(g, i)) for g in range(len(picked)) for i in range(group_size)]
    outcomes: dict[tuple[int, int], Trajectory | ExceptionRecord] = {}
    failures: list[ExceptionRecord] = []

    async def keep_alive() -> None:  # a single long rollout must not look like a dead worker
        while True:
            await asyncio.sleep(HEARTBEAT_EVERY_S)
            _heartbeat(len(outcomes), total)

    beat = asyncio.create_task(keep_alive())
    try:
        for next_done in asyncio.as_completed(tasks):
            g, i, outcome = await next_done
            outcomes[(g, i)] = outcome
            if isinstance(outcome, ExceptionRecord):
                failures.append(outcome)
                log.warning("%s", outcome.message)
                if len(failures) > task.max_exceptions:
                    raise ApplicationError(
                        f"{len(failures)} rollouts failed, more than task.max_exceptions={task.max_exceptions}; "
                        f"first: {failures[0].message}",
                        type=ROLLOUT_FAILED,
                    )
            _heartbeat(len(outcomes), total)
    finally:
        for t in [*tasks, beat]:
            t.cancel()
        await asyncio.gather(*tasks, beat, return_exceptions=True)
    groups = []
    for g, (index, scenario) in enumerate(picked):
        group = TrajectoryGroup(
            metadata={
                "scenario_index": index,
                "scenario_id": None if scenario.get("id") is None else str(scenario["id"]),
                "scenario": json.dumps(scenario, sort_keys=True, default=str),
            }
        )
        for i in range(group_size):
            outcome = outcomes[(g, i)]
            if isinstance(outcome, Trajectory):
                if policy_step is not None:
                    outcome.policy_step = policy_step
                group.trajectories.append(outcome)
            else:
                group.exceptions.append(outcome)
        groups.append(group)
    return groups


class RolloutActivities:
    """The inference worker's rollouts activity, bound to its server(s), the object store and the task
    modules its operator allows (``task_modules``, default ``task_modules_from_env()``). ``serving``: the
    worker's serving activities, which load the pinned adapter where a server lacks it (its reload ran on
    another inference worker, or this server was restarted)."""

    def __init__(
        self,
        inference_urls: str | Sequence[str],
        store: ObjectStore,
        *,
        base_served_name: str | None = None,
        api_key: str | None = None,
        task_modules: Sequence[str] | None = None,
        serving: ServingActivities | None = None,
    ) -> None:
        urls = [inference_urls] if isinstance(inference_urls, str) else list(inference_urls)
        if not urls:
            raise ValueError("RolloutActivities needs at least one inference server URL")
        self.inference_urls = [openai_base_url(u) for u in urls]
        self.store = store
        self.base_served_name = base_served_name
        self.api_key = api_key or own_server_api_key()
        self.task_modules = tuple(task_modules) if task_modules is not None else task_modules_from_env()
        self.serving = serving
        self.stored_scenarios = ScenarioCache(store)
        self.stored_texts = RunTextCache(store)
        self._slots: dict[tuple[str, int], asyncio.Semaphore] = {}

    def slots(self, run_id: str, concurrency: int) -> asyncio.Semaphore:
        """The rollout slots a run's shards share on this worker (``task.rollout_concurrency`` of them)."""
        return self._slots.setdefault((run_id, concurrency), asyncio.Semaphore(concurrency))

    async def served_base_name(self) -> str:
        """The base model's served name (asked of the first server once, unless given)."""
        if self.base_served_name is None:
            self.base_served_name = await discover_base_model(self.inference_urls[0], api_key=self.api_key)
        return self.base_served_name

    @activity.defn(name=ActivityName.ROLLOUTS)
    async def rollouts(self, input: RolloutsInput) -> TrajectoriesRef:
        """Roll out ``input``'s share of the step; failed as retryable when the worker's server is restarted
        (it stopped answering, or died) while the rollouts use it."""
        if self.serving is None:
            return await self._rollouts(input)
        return await self.serving.liveness.guard(self._rollouts(input))

    def scenarios(self, input: RolloutsInput) -> list[dict[str, Any]]:
        """The run's scenario list: its stored copy (kept by this worker), or loaded as ``task.scenarios`` says."""
        source = input.task.scenarios
        if isinstance(source, ObjectRef):
            return self.stored_scenarios.get(input.run_id, source)
        return load_scenarios(source, self.task_modules)

    def chat_template(self, input: RolloutsInput) -> str | None:
        """The run's own chat template: its stored copy (kept by this worker), or as the input carries it."""
        if input.chat_template_ref is None:
            return input.chat_template
        return self.stored_texts.get(input.run_id, "chat_template", input.chat_template_ref)

    async def _rollouts(self, input: RolloutsInput) -> TrajectoriesRef:
        try:
            fn = load_rollout_function(input.task.rollout, self.task_modules)
            scenarios = await asyncio.to_thread(self.scenarios, input)
            chat_template = await asyncio.to_thread(self.chat_template, input)
        except DgrpoError as err:  # a store that did not answer is retried; the rest is the run's to fix
            raise ApplicationError(str(err), type=err.failure_type, non_retryable=not err.retryable) from err
        # CPU work (a million-scenario shuffle takes a second): off the event loop that sends heartbeats
        indices = await asyncio.to_thread(
            pick_scenarios, len(scenarios), input.groups_per_step, input.scenario_offset, input.seed
        )
        picked = [(i, scenarios[i]) for i in indices]
        base_name = await self.served_base_name()
        lease = (
            self.serving.leases.hold(input.adapter)
            if self.serving is not None and input.adapter
            else contextlib.nullcontext()
        )
        with lease:  # no load on this worker unloads the adapter while these rollouts use it (--max-loras)
            if self.serving is not None and input.adapter == adapter_name(input.run_id, input.policy_step):
                await self.serving.ensure_adapter(input.run_id, input.policy_step)
            # What samples, by content: a step trained again (its trainer lost) is another adapter of that step.
            sampler = self.serving.contents.get(input.adapter) if self.serving and input.adapter else None
            models = [
                RolloutModel(
                    name=input.model_name,
                    inference_base_url=url,
                    served_model=input.adapter or base_name,
                    step=input.policy_step,
                    base_model=base_name,
                    api_key=self.api_key,
                    chat_template=chat_template,
                )
                for url in self.inference_urls
            ]
            log.info(
                "rollouts for %s step %d (shard %d of %d): %d scenarios x %d via %s on %s",
                input.run_id,
                input.step,
                input.shard + 1,
                input.shards,
                len(picked),
                input.group_size,
                models[0].served_model,
                self.inference_urls,
            )
            try:
                slots = self.slots(input.run_id, input.task.rollout_concurrency)
                groups = await run_groups(
                    fn, input.task, models, picked, input.group_size, input.policy_step, slots
                )
            finally:
                for model in models:
                    await model.aclose()
        for trajectory in (t for g in groups for t in g.trajectories):
            trajectory.policy_sha256 = sampler
        try:
            check_numbers(groups, f"rollout {input.task.rollout}")
        except DgrpoError as err:  # nothing is written: a bad reward or logprob never reaches the store
            raise ApplicationError(str(err), type=err.failure_type, non_retryable=True) from err
        attempt = activity.info().attempt if activity.in_activity() else 1
        merged = input.shards > 1 or input.merged
        key = rollout_shard_key(input.run_id, input.step, input.shard, attempt) if merged else None
        return await asyncio.to_thread(upload_groups, self.store, groups, input.run_id, input.step, key=key)
