"""Worker processes, one per task queue: ``control``, ``inference``, ``trainer``, or ``all`` three in one.

- control: the workflows (``TrainingRun``, ``TrainStep``, ``TrainSFT``, ``ServeModel``) and the merge of
  rollout shards, store of inline scenarios, judge, advantages and metrics activities.
- inference: rollouts, reload and sleep/wake, in front of a serving engine: ``server_url`` attaches to a
  running one (vLLM or ours); otherwise ``engine`` (our CPU server, or ``vllm serve``) is started for
  ``model`` on ``serve_host:serve_port``.
- trainer: train, train_sft, publish_adapter, publish, publish_initial, republish_checkpoint and latest_checkpoint, polling the trainer queue and its own
  worker-specific queue (publish runs where the trained step is staged).

The server an inference worker starts is probed and started again when it dies or stops answering
(``keep_serving.py``); with role ``all`` the trainer runs in a child process that is started again when it dies
(``keep_trainer.py``). A process whose trainer's compute thread is stuck past its stage's bound stops polling and,
once its other activities had their grace, exits ``EXIT_TRAINER_STUCK`` (75) for its supervisor to start it
afresh (``keep_trainer.py``).

Temporal and the object store come from the environment (``DGRPO_TEMPORAL_*``, ``DGRPO_S3_*``). A worker started
before Temporal keeps trying to connect (``WorkerLifecycle.temporal_wait_s``). On SIGTERM (a spot-preemption
notice) it stops polling at once, gives its running activities ``WorkerLifecycle.grace_s`` to finish, fails
the rest so Temporal retries them on another worker right away, stops the server it started, and exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from temporalio.client import Client
from temporalio.common import WorkerDeploymentVersion
from temporalio.worker import Interceptor, Worker, WorkerDeploymentConfig

from activities.object_store import ObjectStore
from activities.serving import ServingActivities
from host.processes import HOST, free_port
from schemas.config import TaskQueues
from schemas.layout import worker_task_queue
from schemas.settings import (
    ENV_METRICS_BIND,
    ENV_SERVE_HOST,
    ENV_SERVE_PORT,
    EngineSettings,
    FleetBounds,
    GangSettings,
    WorkerDeployment,
    WorkerLifecycle,
    dgrpo_home,
)
from serving.launchers import ServerProcess, server_process
from workers.admission import Admission
from workers.error_contract import ErrorContract
from workers.heartbeat_ticker import THROTTLE as HEARTBEAT_THROTTLE
from workers.heartbeat_ticker import HeartbeatTicker
from workers.keep_serving import keep_serving
from workers.keep_trainer import EXIT_TRAINER_STUCK, keep_trainer, leave_when_stuck
from workers.telemetry import StageMetrics, flush_traces, next_port, serve_metrics
from workers.temporal import connect_client
from workflows.versioned import VERSIONED_WORKFLOWS, WORKFLOWS

if TYPE_CHECKING:
    from workers.launcher import WorkerProcess

log = logging.getLogger(__name__)

INTERCEPTORS: list[Interceptor] = [ErrorContract(), HeartbeatTicker()]
"""On every worker: the one error contract, and heartbeats that do not wait for the work but stop when it
stalls (what ``interceptors`` adds to, with the worker's own stage bounds)."""

Role = Literal["control", "inference", "trainer", "all"]
ROLES: tuple[Role, ...] = ("control", "inference", "trainer", "all")
DEFAULT_MODEL = "smollm2-135m-instruct"
CHILD_STOP_SLACK_S = 30.0
"""A trainer child gets its grace plus this to exit after SIGTERM before it is killed."""

T = TypeVar("T")


@dataclass
class WorkerOptions:
    """What a worker process runs; the CLI fills it from flags."""

    role: Role = "all"
    task_queues: TaskQueues = field(default_factory=TaskQueues)
    model: str = DEFAULT_MODEL
    """The base model the inference worker serves (a run naming another is refused by rollouts/reload)."""
    server_url: str | None = None
    """Attach to this OpenAI-compatible server instead of starting the CPU server (a control worker's
    default judge uses it too)."""
    engine: EngineSettings = field(default_factory=EngineSettings)
    """The inference engine the worker starts (or, with ``server_url``, fronts); runs are checked against it."""
    lifecycle: WorkerLifecycle = field(default_factory=WorkerLifecycle.from_env)
    """How long it waits for Temporal at start-up, and the grace its activities get on SIGTERM."""
    serve_port: int | None = None
    """Port of the CPU server this worker starts (default ``$DGRPO_SERVE_PORT``, else a free one)."""
    serve_host: str | None = None
    """Address the server this worker starts binds (default ``$DGRPO_SERVE_HOST``, else loopback); beyond
    loopback it needs ``$DGRPO_SERVE_API_KEY``, or the worker refuses to start."""
    staging_root: Path | None = None
    """Where the trainer stages trained steps (default ``$DGRPO_HOME/staging``)."""
    gang: GangSettings = field(default_factory=GangSettings)
    """The trainer's ranks and devices, and the gang it trains in over hosts (activities/gang/)."""
    worker_id: str | None = None
    ready_file: Path | None = None
    """Written once every worker polls (launchers wait for it)."""
    single_process: bool = False
    """Role ``all``: run the trainer in this process too. By default it gets a child process, so its
    GIL-holding work never starves the workflow thread (Temporal fails a workflow task after 2 s)."""
    judge_base_urls: tuple[str, ...] | None = None
    """Judge endpoints a run may name besides the worker's own server (None: ``$DGRPO_JUDGE_BASE_URLS``)."""
    judge_keys: tuple[tuple[str, str], ...] | None = None
    """(endpoint, variable) pairs a run's ``judge.api_key_env`` may name, each key sent only to its own
    endpoint (None: ``$DGRPO_JUDGE_KEY_ENVS``)."""
    task_modules: tuple[str, ...] | None = None
    """Module prefixes task code is imported from (None: ``$DGRPO_TASK_MODULES``, else ``examples.``)."""
    max_concurrent_activities: int | None = None
    """Inference: activities (rollout shards, reloads) run at once; None: Temporal's default (100). A small
    number leaves a step's other shards to the other inference workers."""
    bounds: FleetBounds = field(default_factory=FleetBounds.from_env)
    """The highest priority and largest fairness weight a run's activities may carry here."""
    deployment: WorkerDeployment | None = None
    """The Worker Deployment and build id this worker polls as (Worker Versioning); None: unversioned."""
    metrics_bind: str | None = None
    """``host:port`` of the Prometheus endpoint (None: ``$DGRPO_METRICS_BIND``, else none); role ``all``'s
    trainer child serves on the next port."""
    leave_when_stuck: bool = True
    """A process whose trainer's compute thread is stuck leaves (exit ``EXIT_TRAINER_STUCK``) for a fresh one.
    Off in a client's own process (``LocalBackend(in_process=True)``): its trainer's attempts fail instead, each
    at once, until the thread frees."""


def _add_cwd_to_path() -> None:
    # User task modules (examples.arithmetic, my_env.rollout) are found from where the worker starts.
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)


def control_activities(
    store: ObjectStore, judge_url: str | None, opts: WorkerOptions
) -> list[Callable[..., Any]]:
    from activities.advantages import AdvantagesActivities
    from activities.judge import JudgeActivities, JudgeEndpoints
    from activities.metrics import MetricsActivities
    from activities.retention import RetentionActivities
    from activities.rollout_shards import ShardActivities
    from activities.run_texts import RunTextActivities
    from activities.scenario_store import ScenarioActivities

    env = JudgeEndpoints.from_env()  # a flag replaces its variable
    endpoints = JudgeEndpoints(
        base_urls=env.base_urls if opts.judge_base_urls is None else opts.judge_base_urls,
        keys=env.keys if opts.judge_keys is None else opts.judge_keys,
    )
    return [
        AdvantagesActivities(store).compute_advantages,
        JudgeActivities(store, judge_url, endpoints).judge,
        ShardActivities(store).merge_rollouts,
        ScenarioActivities(store).store_scenarios,
        RunTextActivities(store).store_run_texts,
        *MetricsActivities(store).all(),
        *RetentionActivities(store).all(),
    ]


def inference_activities(
    store: ObjectStore, server_urls: Sequence[str], opts: WorkerOptions, serving: ServingActivities
) -> list[Callable[..., Any]]:
    from activities.rollouts import RolloutActivities

    urls = list(server_urls)
    rollouts = RolloutActivities(urls, store, task_modules=opts.task_modules, serving=serving)
    return [rollouts.rollouts, *serving.all()]


def interceptors(opts: WorkerOptions, ticker: HeartbeatTicker | None = None) -> list[Interceptor]:
    """On every worker: the one error contract, the operator's bounds on priority and fairness, the stage
    metrics, and heartbeats that do not wait for the work (``ticker``: the inference worker's own)."""
    return [
        ErrorContract(),
        Admission(opts.bounds),
        StageMetrics(),
        ticker or HeartbeatTicker(None, opts.lifecycle.stage_bounds_s),
    ]


def deployment_config(deployment: WorkerDeployment | None) -> WorkerDeploymentConfig | None:
    """Temporal's Worker Versioning options of a worker of ``deployment`` (None: unversioned). Each workflow
    type states whether its runs stay on their build (``workflows/versioned.py``)."""
    if deployment is None:
        return None
    version = WorkerDeploymentVersion(deployment_name=deployment.name, build_id=deployment.build_id)
    return WorkerDeploymentConfig(version=version, use_worker_versioning=True)


async def build_workers(
    client: Client,
    roles: set[str],
    opts: WorkerOptions,
    store: ObjectStore,
    server_urls: Sequence[str],
    serving: ServingActivities | None = None,
) -> tuple[list[Worker], Callable[[], str | None] | None]:
    """The ``Worker`` objects of ``roles`` (not yet running), and the trainer's ``stuck`` when a trainer is among
    them; ``serving``: the inference worker's serving activities, when the caller keeps them (to restore adapters
    on a restarted server)."""
    queues = opts.task_queues
    grace = timedelta(seconds=opts.lifecycle.grace_s)

    def worker(
        queue: str,
        activities: Sequence[Callable[..., Any]],
        workflows: Sequence[type] = (),
        max_concurrent_activities: int | None = None,
        ticker: HeartbeatTicker | None = None,
        versioned: bool = True,
    ) -> Worker:
        return Worker(
            client,
            task_queue=queue,
            workflows=workflows,
            activities=activities,
            interceptors=interceptors(opts, ticker),
            # A trainer's own queue is polled by that one process: nothing to version.
            deployment_config=deployment_config(opts.deployment if versioned else None),
            graceful_shutdown_timeout=grace,  # then running activities are cancelled: failed, retried elsewhere
            # The SDK otherwise holds heartbeats back for up to 0.8 x the timeout; sent within 5 s, the last
            # beat before a kill is recent, so the server's timeout fires soon after the worker died.
            max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
            max_concurrent_activities=max_concurrent_activities,
        )

    workers: list[Worker] = []
    stuck: Callable[[], str | None] | None = None
    if "control" in roles:
        judge_url = server_urls[0] if server_urls else opts.server_url
        workflows = WORKFLOWS if opts.deployment is None else VERSIONED_WORKFLOWS
        workers.append(worker(queues.control, control_activities(store, judge_url, opts), workflows))
    if "inference" in roles:
        serving = serving or ServingActivities(list(server_urls), store, engine=opts.engine)
        workers.append(
            worker(
                queues.inference,
                inference_activities(store, server_urls, opts, serving),
                max_concurrent_activities=opts.max_concurrent_activities,
                # no heartbeat vouches for work whose engine leaves its probes unanswered
                ticker=HeartbeatTicker(serving.liveness.vouches, opts.lifecycle.stage_bounds_s),
            )
        )
    if "trainer" in roles:
        from activities.training import TrainerActivities

        staging = opts.staging_root or Path(dgrpo_home()) / "staging"
        trust = opts.engine.trust_request_chat_template
        if opts.gang.enabled:
            from activities.gang.activities import GangTrainerActivities

            logs = opts.ready_file.parent if opts.ready_file else Path(dgrpo_home()) / "logs"
            trainer: TrainerActivities = GangTrainerActivities(
                store, staging, opts.gang, worker_id=opts.worker_id, trust_chat_template=trust, log_dir=logs
            )
        else:
            trainer = TrainerActivities(store, staging, worker_id=opts.worker_id, trust_chat_template=trust)
        own_queue = worker_task_queue(queues.trainer, trainer.worker_id)
        log.info("trainer %s polls %s and %s", trainer.worker_id, queues.trainer, own_queue)
        workers += [worker(queues.trainer, trainer.all()), worker(own_queue, trainer.all(), versioned=False)]
        stuck = trainer.stuck
    return workers, stuck


def _own_server(opts: WorkerOptions) -> ServerProcess | None:
    """The inference server this worker starts (not yet started), or None: no inference role, or
    ``--server-url`` names a running one."""
    if opts.role not in ("inference", "all") or opts.server_url:
        return None
    port = opts.serve_port or int(os.environ.get(ENV_SERVE_PORT, "0")) or free_port()
    host = opts.serve_host or os.environ.get(ENV_SERVE_HOST) or HOST
    log_path = Path(dgrpo_home()) / "logs" / f"serve-{port}.log"
    return server_process(opts.model, opts.engine, host=host, port=port, log_path=log_path)


async def run_workers(
    opts: WorkerOptions, client: Client | None = None, stop: asyncio.Event | None = None
) -> int:
    """Run the workers of ``opts.role`` until ``stop`` is set (or the task is cancelled), then shut down:
    no more polling, ``opts.lifecycle.grace_s`` for running activities, then the rest are cancelled. Returns the
    process's exit code: 0, or ``EXIT_TRAINER_STUCK`` when it stopped because its trainer was stuck."""
    _add_cwd_to_path()
    stop = stop or asyncio.Event()
    server = _own_server(opts)
    if opts.role in ("inference", "all"):
        opts.engine.refuse_unservable_parallelism(starts_server=server is not None)
    if server is not None:
        await asyncio.to_thread(
            server.preflight
        )  # an engine that cannot start here is refused before anything
    if client is None:
        client = await _unless_stopped(connect_client(wait_s=opts.lifecycle.temporal_wait_s), stop)
        if client is None:
            log.info("%s worker stopped before Temporal answered", opts.role)
            return 0
    store = ObjectStore.from_env(opts.lifecycle.store_outage_s)
    await asyncio.to_thread(store.ensure_bucket)
    async with contextlib.AsyncExitStack() as exits:
        server_urls: list[str] = []
        serving: ServingActivities | None = None
        if opts.role in ("inference", "all"):
            if server is None:
                server_urls = [str(opts.server_url)]
            else:
                exits.callback(server.stop)
                server.spawn()  # here, in the main thread: the server dies with this process
                await asyncio.to_thread(server.wait_healthy)
                server_urls = [server.client.openai_base_url]
                serving = ServingActivities(server_urls, store, engine=opts.engine)
                supervisor = asyncio.create_task(keep_serving(server, serving), name="keep-serving")
                exits.callback(supervisor.cancel)  # before server.stop: a stopped server is not restarted
        roles: set[str] = {"control", "inference", "trainer"} if opts.role == "all" else {str(opts.role)}
        trainer_child: WorkerProcess | None = None
        if opts.role == "all" and not opts.single_process:
            trainer_child = _trainer_child(opts)
            exits.callback(trainer_child.stop)
            trainer_child.spawn()
            await asyncio.to_thread(trainer_child.wait_ready)
            roles.discard("trainer")
        workers, stuck = await build_workers(client, roles, opts, store, server_urls, serving)
        return await _serve(workers, opts, stop, server_urls, trainer_child, stuck)


async def _serve(
    workers: list[Worker],
    opts: WorkerOptions,
    stop: asyncio.Event,
    server_urls: list[str],
    trainer_child: WorkerProcess | None,
    stuck: Callable[[], str | None] | None = None,
) -> int:
    """Poll until ``stop`` (or a worker fails), then shut every worker (and the trainer child) down at once; the
    exit code (``EXIT_TRAINER_STUCK`` when ``stuck``, this process's trainer, made it stop)."""
    tasks = [asyncio.create_task(w.run(), name=f"worker:{w.task_queue}") for w in workers]
    watch = None if trainer_child is None else asyncio.create_task(keep_trainer(trainer_child, stop))
    leaving = (
        asyncio.create_task(leave_when_stuck(stuck, stop))
        if stuck is not None and opts.leave_when_stuck
        else None
    )
    log.info("%s worker polling %s", opts.role, ", ".join(w.task_queue for w in workers))
    if opts.ready_file is not None:
        opts.ready_file.write_text(" ".join(server_urls) + "\n")
    stopped = asyncio.create_task(stop.wait())
    try:
        done, _ = await asyncio.wait([*tasks, stopped], return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not stopped and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
    finally:
        if watch is not None:
            watch.cancel()  # before the child is stopped: a stopped child is not restarted
        if leaving is not None and not leaving.done():
            leaving.cancel()
        grace = opts.lifecycle.grace_s
        log.info(
            "shutting down %s worker: no more polling; running activities get %.0fs to finish, then are "
            "cancelled and retried elsewhere",
            opts.role,
            grace,
        )
        stopping: list[Awaitable[object]] = [w.shutdown() for w in workers]
        if trainer_child is not None:  # its own grace runs alongside ours, not after it
            stopping.append(asyncio.to_thread(trainer_child.stop, grace + CHILD_STOP_SLACK_S))
        await asyncio.gather(*stopping, return_exceptions=True)
        stopped.cancel()
        log.info("%s worker shut down", opts.role)
    stuck_then = leaving is not None and leaving.done() and not leaving.cancelled() and leaving.result()
    return EXIT_TRAINER_STUCK if stuck_then else 0


async def _unless_stopped(work: Awaitable[T], stop: asyncio.Event) -> T | None:
    """``work``'s result, or None when ``stop`` is set first (``work`` is then cancelled)."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
        return task.result() if task.done() else None
    finally:
        task.cancel()
        stopped.cancel()


def _trainer_child(opts: WorkerOptions) -> WorkerProcess:
    from workers.launcher import WorkerProcess

    log_dir = opts.ready_file.parent if opts.ready_file else Path(dgrpo_home()) / "logs"
    extra = ["--staging", str(opts.staging_root)] if opts.staging_root else []
    extra += ["--worker-id", opts.worker_id] if opts.worker_id else []
    extra += [
        "--grace-s",
        str(opts.lifecycle.grace_s),
        "--temporal-wait-s",
        str(opts.lifecycle.temporal_wait_s),
        "--highest-priority",
        str(opts.bounds.highest_priority),
        "--max-fairness-weight",
        str(opts.bounds.max_fairness_weight),
    ]
    if opts.deployment is not None:
        extra += ["--deployment-name", opts.deployment.name, "--build-id", opts.deployment.build_id]
    bind = metrics_bind(opts)
    if bind is not None:  # explicit: a bind from the environment would be the parent's own port
        extra += ["--metrics-bind", next_port(bind)]
    extra += ["--trust-request-chat-template"] if opts.engine.trust_request_chat_template else []
    extra += gang_flags(opts.gang)
    return WorkerProcess(
        "trainer",
        log_dir / f"trainer-{os.getpid()}.log",
        task_queues=opts.task_queues,
        die_with_parent=True,
        extra_args=extra,
    )


def gang_flags(gang: GangSettings) -> list[str]:
    """``dgrpo worker``'s flags that give a trainer ``gang`` (role ``all``'s trainer child gets its parent's)."""
    if not gang.enabled:
        return []
    flags = [
        "--ranks",
        str(gang.ranks),
        "--shard",
        gang.shard,
        "--collective-timeout-s",
        str(gang.collective_timeout_s),
    ]
    flags += ["--devices", ",".join(gang.devices)] if gang.devices else []
    flags += ["--gang", gang.gang] if gang.gang else []
    flags += ["--gang-address", gang.address] if gang.address else []
    return flags


async def run_all_workers(client: Client, task_queues: TaskQueues, serve_port: int | None = None) -> None:
    """All three workers in this event loop (``LocalBackend(in_process=True)``); cancel the task to stop."""
    opts = WorkerOptions(
        role="all",
        task_queues=task_queues,
        serve_port=serve_port,
        lifecycle=WorkerLifecycle(grace_s=0),  # the client is closing: nothing waits for a retry elsewhere
        engine=EngineSettings(trust_request_chat_template=True),  # as LocalBackend's subprocess workers
        leave_when_stuck=False,  # the client's own process
    )
    await run_workers(opts, client)


def metrics_bind(opts: WorkerOptions) -> str | None:
    """Where the worker serves its Prometheus metrics: ``--metrics-bind``, else ``$DGRPO_METRICS_BIND``."""
    return opts.metrics_bind or os.environ.get(ENV_METRICS_BIND) or None


def main(opts: WorkerOptions) -> int:
    """Run until SIGTERM/SIGINT, then shut the workers down gracefully; 0 once they have. A process whose trainer
    was stuck exits ``EXIT_TRAINER_STUCK`` at once, without waiting for its stuck thread (which never ends)."""
    bind = metrics_bind(opts)
    if bind is not None:
        serve_metrics(bind)  # first: the runtime every client of this process connects with

    async def _main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, _on_signal, sig, stop)
        try:
            return await run_workers(opts, stop=stop)
        finally:
            leftovers = asyncio.all_tasks() - {asyncio.current_task()}
            for task in leftovers:
                task.cancel()
            await asyncio.gather(*leftovers, return_exceptions=True)

    # Not asyncio.run: it would wait for threads of cancelled activities (a model load, an upload) that no
    # longer matter; they end with the process.
    loop = asyncio.new_event_loop()
    try:
        code = loop.run_until_complete(_main())
    finally:
        loop.close()
        flush_traces()
    if code == EXIT_TRAINER_STUCK:
        logging.shutdown()
        os._exit(code)  # a normal exit would join the stuck compute thread, for ever
    return code


def _on_signal(sig: signal.Signals, stop: asyncio.Event) -> None:
    log.warning("%s received: stopping", sig.name)
    stop.set()
