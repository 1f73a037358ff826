"""``dgrpo train``, ``status``, ``pause``, ``resume``, ``stop`` and ``demo``: ``TrainingRun`` workflows."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from rich.console import Console
from temporalio.client import WorkflowFailureError
from temporalio.service import RPCError

from dgrpo.cli.arg_types import at_least_one
from dgrpo.cli.progress import RunProgress, status_summary, status_view
from dgrpo.client import run_control
from schemas.config import load_run_spec
from schemas.errors import DgrpoError
from schemas.run_state import RunStatus
from schemas.settings import ENGINES
from workers.temporal import connect_client
from workflows.training_run import TrainingRun


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """``key.path=value`` pairs; a value is read as JSON when it parses (numbers, true, lists), else a string."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise DgrpoError(f"--set {pair!r}: expected key=value, e.g. --set train.learning_rate=1e-4")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


async def _train(args: argparse.Namespace) -> int:
    spec = load_run_spec(args.spec, parse_overrides(args.set or []))
    if args.dry_run:
        print(spec.model_dump_json(indent=2))
        return 0
    client = await connect_client()
    handle = await run_control.start_run(client, spec)
    print(f"started run {spec.run_id} (workflow {handle.id} on {spec.task_queues.control})")
    if args.no_wait:
        print(f"watch it with: dgrpo status {spec.run_id} --watch")
        return 0
    return await _watch(handle)


async def _watch(handle: Any) -> int:
    console = Console()
    try:
        with RunProgress(console) as bar:
            final = await run_control.watch(handle, bar.update)
    except WorkflowFailureError as err:
        console.print(f"[red]run {handle.id} failed:[/red] {err.cause}")
        return 1
    console.print(status_view(final))
    return 0


async def _status(args: argparse.Namespace) -> int:
    client = await connect_client()
    handle = run_control.handle_of(client, args.run_id)
    if args.watch:
        return await _watch(handle)
    status: RunStatus = await handle.query(TrainingRun.status)
    Console().print(status_view(status))
    return 0


async def _steer(args: argparse.Namespace) -> int:
    client = await connect_client()
    if args.command == "resume":
        how, status = await run_control.resume_run(client, args.run_id)
        print(f"{how} run {args.run_id}" + ("" if status is None else f"\n{status_summary(status)}"))
        return 0
    handle = run_control.handle_of(client, args.run_id)
    update = TrainingRun.pause if args.command == "pause" else TrainingRun.stop
    status = await handle.execute_update(update)
    verb = "pauses" if args.command == "pause" else "stops"
    print(f"run {args.run_id} {verb} at the next step boundary\n{status_summary(status)}")
    return 0


def _run_async(fn: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            return int(asyncio.run(fn(args)))
        except (DgrpoError, RPCError, KeyError) as err:
            print(f"dgrpo {args.command}: {err}", file=sys.stderr)
            return 2

    return run


def cmd_demo(args: argparse.Namespace) -> int:
    from dgrpo.cli.demo import run_demo

    return run_demo(args)


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add this module's subcommands; each sets ``func`` to a callable taking the parsed args."""
    train = sub.add_parser("train", help="start a TrainingRun from RUN.toml or RUN.json")
    train.add_argument("spec", help="run spec file (.toml or .json)")
    train.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a field (dotted path)")
    train.add_argument("--dry-run", action="store_true", help="print the resolved spec and exit")
    train.add_argument("--no-wait", action="store_true", help="start and return; watch with `dgrpo status`")
    train.set_defaults(func=_run_async(_train))

    status = sub.add_parser("status", help="a run's step, phase, rewards and checkpoint")
    status.add_argument("run_id")
    status.add_argument("--watch", action="store_true", help="live progress until the run ends")
    status.set_defaults(func=_run_async(_status))

    for name, text in (
        ("pause", "pause a run at the next step boundary"),
        ("resume", "resume a paused run, or restart a terminated/dead one from its newest checkpoint"),
        ("stop", "stop a run gracefully at the next step boundary"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("run_id")
        p.set_defaults(func=_run_async(_steer))

    demo = sub.add_parser("demo", help="train SmolLM2-135M on an example task, on this machine")
    demo.add_argument("--steps", type=at_least_one, default=None, help="training steps (default per task)")
    demo.add_argument("--task", choices=("arithmetic", "tool_agent"), default="arithmetic")
    demo.add_argument("--home", help="stack state directory (default $DGRPO_HOME, else ./.dgrpo)")
    demo.add_argument("--run-id", help="run id (default demo-<task>-<time>)")
    demo.add_argument(
        "--engine",
        choices=ENGINES,
        default=None,
        help="inference engine (vllm: deploy/install.sh --vllm); default $DGRPO_ENGINE, else cpu",
    )
    demo.set_defaults(func=cmd_demo)
