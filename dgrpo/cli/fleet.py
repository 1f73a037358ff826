"""``dgrpo runs``, and the flags a ``dgrpo worker`` takes for a shared fleet: the bounds on runs' priority and
fairness weight, its Worker Deployment and build id, and its metrics endpoint (``docs/fleet.md``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from rich.console import Console
from rich.measure import Measurement
from temporalio.service import RPCError

from dgrpo.client.fleet_view import RunRow, list_runs, runs_table
from schemas.errors import DgrpoError, EngineSetupError
from schemas.settings import (
    ENV_BUILD_ID,
    ENV_DEPLOYMENT_NAME,
    ENV_HIGHEST_PRIORITY,
    ENV_MAX_FAIRNESS_WEIGHT,
    ENV_METRICS_BIND,
    FleetBounds,
    WorkerDeployment,
)
from workers.temporal import connect_client


def add_worker_flags(worker: argparse.ArgumentParser) -> None:
    """The fleet flags of ``dgrpo worker``; each left out keeps its variable's value, else the default."""
    bounds = FleetBounds()
    worker.add_argument(
        "--highest-priority",
        type=int,
        choices=range(1, 6),
        metavar="1-5",
        help="the highest priority (smallest number) a run may ask for; runs above it are refused "
        f"(default ${ENV_HIGHEST_PRIORITY}, else {bounds.highest_priority})",
    )
    worker.add_argument(
        "--max-fairness-weight",
        type=float,
        metavar="W",
        help="the largest fairness weight a run may ask for; runs above it are refused. Raise it only on a "
        f"Temporal with fairness on (default ${ENV_MAX_FAIRNESS_WEIGHT}, else {bounds.max_fairness_weight:g})",
    )
    worker.add_argument(
        "--deployment-name",
        help=f"Worker Versioning: the Worker Deployment this worker belongs to (default ${ENV_DEPLOYMENT_NAME}; "
        "unset: unversioned)",
    )
    worker.add_argument(
        "--build-id", help=f"Worker Versioning: this worker's build id (default ${ENV_BUILD_ID})"
    )
    worker.add_argument(
        "--metrics-bind",
        metavar="HOST:PORT",
        help=f"serve Prometheus metrics there (default ${ENV_METRICS_BIND}, else none; role all's trainer "
        "child uses the next port)",
    )


def worker_options(args: argparse.Namespace) -> dict[str, Any]:
    """``WorkerOptions`` fields from the fleet flags."""
    env = FleetBounds.from_env()
    flags = {"highest_priority": args.highest_priority, "max_fairness_weight": args.max_fairness_weight}
    try:
        bounds = FleetBounds.model_validate(
            {**env.model_dump(), **{k: v for k, v in flags.items() if v is not None}}
        )
    except ValueError as err:
        raise EngineSetupError(f"--max-fairness-weight / ${ENV_MAX_FAIRNESS_WEIGHT}: {err}") from None
    return {
        "bounds": bounds,
        "deployment": WorkerDeployment.from_flags(args.deployment_name, args.build_id),
        "metrics_bind": args.metrics_bind,
    }


async def _runs(args: argparse.Namespace) -> int:
    client = await connect_client()
    rows = await list_runs(client, include_closed=args.all, limit=args.limit)
    print_runs(rows, args.output)
    return 0


def print_runs(rows: list[RunRow], output: str) -> None:
    """``rows`` on stdout: a table (``text``; off a terminal as wide as its widest line, so a run's row is one
    line that ``grep`` finds), a JSON list (``json``) or one JSON object a line (``jsonl``), as the ``temporal``
    CLI's ``--output``."""
    if output == "json":
        print(json.dumps([r.model_dump(mode="json") for r in rows], indent=2))
    elif output == "jsonl":
        for r in rows:
            print(r.model_dump_json())
    else:
        table, console = runs_table(rows), Console()
        if not console.is_terminal:
            unbounded = Console(width=1 << 16)
            console = Console(width=Measurement.get(unbounded, unbounded.options, table).maximum)
        console.print(table)


def cmd_runs(args: argparse.Namespace) -> int:
    try:
        return int(asyncio.run(_runs(args)))
    except (DgrpoError, RPCError) as err:
        print(f"dgrpo runs: {err}", file=sys.stderr)
        return 2


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    runs = sub.add_parser(
        "runs", help="every run on the cluster: step, reward, steps per hour, priority, what it waits on"
    )
    runs.add_argument("--all", action="store_true", help="ended runs too, not only running ones")
    runs.add_argument("--limit", type=int, default=200, help="at most this many runs (default 200)")
    runs.add_argument(
        "-o",
        "--output",
        choices=("text", "json", "jsonl"),
        default="text",
        help="text: a table (default); json: a list of runs; jsonl: one run a line (each as RunRow in "
        "dgrpo/client/fleet_view.py), for scripts",
    )
    runs.set_defaults(func=cmd_runs)
