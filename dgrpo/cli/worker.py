"""``dgrpo worker control|inference|trainer|all``: a worker process, from its flags (workers/worker.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from dgrpo.cli import fleet
from dgrpo.cli.arg_types import at_least_one, port_number
from schemas.config import TaskQueues
from schemas.errors import EngineSetupError
from schemas.settings import (
    ENGINES,
    ENV_TEMPORAL_WAIT_S,
    ENV_WORKER_GRACE_S,
    EngineSettings,
    GangSettings,
    WorkerLifecycle,
    default_engine,
    judge_key_pair,
)

if TYPE_CHECKING:
    from workers.worker import WorkerOptions


def cmd_worker(args: argparse.Namespace) -> int:
    from workers.worker import main

    try:
        return main(worker_options(args))
    except EngineSetupError as err:
        print(f"dgrpo worker: {err}", file=sys.stderr)
        return 2


def worker_options(args: argparse.Namespace) -> WorkerOptions:
    """What ``dgrpo worker ...`` runs, from its flags."""
    from workers.worker import WorkerOptions

    return WorkerOptions(
        role=args.role,
        task_queues=TaskQueues(
            control=args.control_queue, inference=args.inference_queue, trainer=args.trainer_queue
        ),
        model=args.model,
        server_url=args.server_url,
        serve_port=args.serve_port,
        serve_host=args.serve_host,
        engine=EngineSettings(
            engine=args.engine or default_engine(),
            max_lora_rank=args.max_lora_rank,
            max_loras=args.max_loras,
            sleep_mode=args.sleep_mode,
            dtype=args.dtype,
            gpu_memory_utilization=args.gpu_memory_utilization,
            prefix_cache_mb=args.prefix_cache_mb,
            tool_call_parser=args.tool_call_parser or None,
            trust_request_chat_template=args.trust_request_chat_template,
            probe_timeout_s=args.probe_timeout_s,
            unanswered_probes=args.unanswered_probes,
            vllm_python=args.vllm_python,
            tensor_parallel_size=args.tensor_parallel_size,
            data_parallel_size=args.data_parallel_size,
            distributed_executor_backend=args.distributed_executor_backend,
        ),
        lifecycle=worker_lifecycle(args),
        staging_root=Path(args.staging) if args.staging else None,
        gang=gang_settings(args),
        worker_id=args.worker_id,
        ready_file=Path(args.ready_file) if args.ready_file else None,
        single_process=args.single_process,
        judge_base_urls=None if args.judge_base_url is None else tuple(args.judge_base_url),
        judge_keys=None if args.judge_key_env is None else tuple(args.judge_key_env),
        task_modules=None if args.task_module is None else tuple(args.task_module),
        max_concurrent_activities=args.max_concurrent_activities,
        **fleet.worker_options(args),
    )


def gang_settings(args: argparse.Namespace) -> GangSettings:
    """``--ranks``, ``--devices``, ``--shard``, ``--gang``, ``--gang-address``, ``--collective-timeout-s``."""
    try:
        return GangSettings(
            ranks=args.ranks,
            devices=tuple(d.strip() for d in args.devices.split(",") if d.strip()) if args.devices else (),
            shard=args.shard,
            gang=args.gang,
            address=args.gang_address,
            collective_timeout_s=args.collective_timeout_s,
        )
    except ValidationError as err:
        said = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in err.errors())
        raise EngineSetupError(f"the trainer's gang (--ranks, --devices, --gang ...): {said}") from None


def judge_key_arg(entry: str) -> tuple[str, str]:
    try:
        return judge_key_pair(entry)
    except ValueError as err:  # argparse would replace the message with "invalid value"
        raise argparse.ArgumentTypeError(str(err)) from err


def worker_lifecycle(args: argparse.Namespace) -> WorkerLifecycle:
    """``--grace-s`` and ``--temporal-wait-s``; a flag left out keeps its variable's value, else the default."""
    env = WorkerLifecycle.from_env()
    flags = {"grace_s": args.grace_s, "temporal_wait_s": args.temporal_wait_s}
    given = {name: value for name, value in flags.items() if value is not None}
    return WorkerLifecycle.model_validate({**env.model_dump(), **given})


def add_gang_flags(worker: argparse.ArgumentParser) -> None:
    """The trainer's ranks, devices and gang (docs/scaling-out.md)."""
    gang = GangSettings()
    worker.add_argument(
        "--ranks",
        type=at_least_one,
        default=gang.ranks,
        metavar="N",
        help="trainer: rank processes, one per device, that train each step together (torch.distributed; "
        "default 1: the trainer in the worker itself)",
    )
    worker.add_argument(
        "--devices",
        metavar="DEV,...",
        help="trainer: each rank's device (cuda:0,cuda:1; default cuda:<i>, else cpu)",
    )
    worker.add_argument(
        "--shard",
        choices=("fsdp", "replicate"),
        default=gang.shard,
        help="trainer ranks: fsdp shards the base and the adapter over them (FSDP2); replicate keeps the whole "
        "model on each and sums gradients",
    )
    worker.add_argument(
        "--gang",
        metavar="NAME",
        help="trainer: train each step with the other trainer workers of gang NAME, on any host (rendezvous "
        "through the object store)",
    )
    worker.add_argument(
        "--gang-address",
        metavar="ADDR",
        help="trainer --gang: where the other hosts reach this worker's ranks (default: this host's address "
        "towards the object store)",
    )
    worker.add_argument(
        "--collective-timeout-s",
        type=float,
        default=gang.collective_timeout_s,
        help="trainer ranks: a collective (and the rendezvous) fails after this long without its peers",
    )


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``dgrpo worker``; it sets ``func`` to a callable taking the parsed args."""
    from workers.worker import DEFAULT_MODEL, ROLES

    defaults = TaskQueues()
    worker = sub.add_parser("worker", help="run a worker: control, inference, trainer, or all three")
    worker.add_argument("role", choices=ROLES)
    worker.add_argument("--control-queue", default=defaults.control)
    worker.add_argument("--inference-queue", default=defaults.inference)
    worker.add_argument("--trainer-queue", default=defaults.trainer)
    worker.add_argument("--model", default=DEFAULT_MODEL, help="base model the inference worker serves")
    worker.add_argument(
        "--server-url", help="attach to this OpenAI-compatible server instead of starting one"
    )
    engine = EngineSettings()
    worker.add_argument(
        "--engine",
        choices=ENGINES,
        default=None,
        help="inference engine the worker starts (or, with --server-url, fronts); default $DGRPO_ENGINE, else cpu",
    )
    worker.add_argument(
        "--max-lora-rank", type=int, default=engine.max_lora_rank, help="largest LoRA rank a run may train"
    )
    worker.add_argument(
        "--max-loras", type=int, default=engine.max_loras, help="adapters the engine holds at once"
    )
    worker.add_argument(
        "--sleep-mode", action="store_true", help="vLLM: enable sleep mode (runs in mode 'shared' need it)"
    )
    worker.add_argument("--dtype", choices=("auto", "fp32", "bf16"), default=engine.dtype)
    worker.add_argument("--gpu-memory-utilization", type=float, default=None, help="vLLM's share of the GPU")
    worker.add_argument(
        "--prefix-cache-mb",
        type=int,
        default=engine.prefix_cache_mb,
        help="CPU server's prefix cache; 0: off",
    )
    worker.add_argument(
        "--tool-call-parser",
        default=engine.tool_call_parser,
        help="vLLM: how the model writes tool calls (hermes, llama3_json, ...); '' for none",
    )
    worker.add_argument(
        "--trust-request-chat-template",
        action="store_true",
        help="render a run's own chat template (model.chat_template): the inference engine with its requests, "
        "the trainer with its SFT examples; without it such runs are refused",
    )
    worker.add_argument(
        "--probe-timeout-s",
        type=float,
        default=engine.probe_timeout_s,
        help="the server's /health is asked every second; a later answer is a missed probe",
    )
    worker.add_argument(
        "--unanswered-probes",
        type=int,
        default=engine.unanswered_probes,
        help="missed probes in a row after which a hung server is killed and started again",
    )
    worker.add_argument(
        "--vllm-python",
        help="--engine vllm: the Python of vLLM's environment (default $DGRPO_VLLM_PYTHON, else .venv-vllm)",
    )
    worker.add_argument(
        "--tensor-parallel-size",
        type=at_least_one,
        default=engine.tensor_parallel_size,
        metavar="N",
        help="--engine vllm: split each layer over N devices of this host (vLLM's flag; GPUs, or core groups on "
        "vLLM's CPU build)",
    )
    worker.add_argument(
        "--data-parallel-size",
        type=at_least_one,
        default=engine.data_parallel_size,
        metavar="N",
        help="--engine vllm: N engine replicas behind the one server (vLLM's flag)",
    )
    worker.add_argument(
        "--distributed-executor-backend",
        choices=("mp", "ray"),
        default=None,
        help="--engine vllm: how vLLM starts its ranks (default vLLM's: mp on one host)",
    )
    worker.add_argument(
        "--serve-port", type=port_number, help="port of the CPU server (default $DGRPO_SERVE_PORT or free)"
    )
    worker.add_argument(
        "--serve-host",
        help="address the inference server binds (default $DGRPO_SERVE_HOST, else 127.0.0.1; any other, "
        "0.0.0.0 for one, needs $DGRPO_SERVE_API_KEY)",
    )
    worker.add_argument(
        "--grace-s",
        type=float,
        help="on SIGTERM (spot preemption): seconds running activities get to finish before they are failed "
        f"and retried on another worker (default ${ENV_WORKER_GRACE_S}, else {WorkerLifecycle().grace_s:.0f})",
    )
    worker.add_argument(
        "--temporal-wait-s",
        type=float,
        help="seconds a starting worker keeps trying to reach Temporal "
        f"(default ${ENV_TEMPORAL_WAIT_S}, else {WorkerLifecycle().temporal_wait_s:.0f})",
    )
    worker.add_argument("--staging", help="trainer staging dir (default $DGRPO_HOME/staging)")
    add_gang_flags(worker)
    worker.add_argument("--worker-id", help="trainer worker id (default host-pid-random)")
    worker.add_argument(
        "--single-process",
        action="store_true",
        help="role all: the trainer in this process too (default: a child)",
    )
    worker.add_argument(
        "--judge-base-url",
        action="append",
        metavar="URL",
        help="control: a judge endpoint runs may name besides the inference server (repeat; "
        "default $DGRPO_JUDGE_BASE_URLS, else none)",
    )
    worker.add_argument(
        "--judge-key-env",
        action="append",
        type=judge_key_arg,
        metavar="URL=NAME",
        help="control: a variable a run's judge.api_key_env may name, sent only to the endpoint URL (repeat; "
        "default $DGRPO_JUDGE_KEY_ENVS, else none)",
    )
    worker.add_argument(
        "--task-module",
        action="append",
        metavar="PREFIX",
        help="inference: a package task.rollout/task.scenarios may be imported from (repeat; default "
        "$DGRPO_TASK_MODULES, else examples.)",
    )
    worker.add_argument(
        "--max-concurrent-activities",
        type=at_least_one,
        metavar="N",
        help="inference: rollout shards and reloads run at once (default Temporal's 100); a small N leaves "
        "a step's other shards to the other inference workers",
    )
    fleet.add_worker_flags(worker)
    worker.add_argument("--ready-file", help=argparse.SUPPRESS)
    worker.set_defaults(func=cmd_worker)
