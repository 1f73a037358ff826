"""``dgrpo up``, ``down``, ``env``, ``schema``: the embedded stack and the run-spec schema."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dgrpo.cli.arg_types import port_number
from schemas.config import RunSpec
from schemas.settings import dgrpo_home
from workers.stack import (
    DEFAULT_S3_PORT,
    DEFAULT_TEMPORAL_PORT,
    DEFAULT_UI_PORT,
    EmbeddedStack,
    StackError,
)


def _home(args: argparse.Namespace) -> Path:
    return Path(args.home or dgrpo_home())


def cmd_up(args: argparse.Namespace) -> int:
    stack = EmbeddedStack(
        _home(args),
        temporal_port=args.temporal_port,
        ui_port=args.ui_port,
        s3_port=args.s3_port,
        ui=not args.headless,
    )
    already = stack.load_state() is not None
    try:
        state = stack.start()
    except StackError as err:
        print(f"dgrpo up: {err}", file=sys.stderr)
        return 1
    print(f"{'already running' if already else 'started'}: embedded stack in {state.home}")
    print(f"  Temporal address: {state.temporal_address}")
    print(f"  Temporal UI:      {state.ui_url or '(headless)'}")
    print(f"  S3 endpoint:      http://{state.s3_endpoint}  (bucket {state.bucket})")
    print('point your shell at it:  eval "$(dgrpo env)"')
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    stopped = EmbeddedStack(_home(args)).stop(timeout=args.timeout)
    print(f"stopped the stack in {_home(args)}" if stopped else f"no stack was running in {_home(args)}")
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    stack = EmbeddedStack(_home(args))
    try:
        lines = stack.env_lines()
    except StackError as err:
        print(f"dgrpo env: {err}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    text = json.dumps(RunSpec.model_json_schema(), indent=2) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add this module's subcommands; each sets ``func`` to a callable taking the parsed args."""
    home_help = "state directory (default $DGRPO_HOME, else ./.dgrpo)"

    up = sub.add_parser("up", help="start the embedded Temporal + S3 stack (reuses a running one)")
    up.add_argument("--home", help=home_help)
    up.add_argument(
        "--temporal-port",
        type=port_number,
        help=f"Temporal gRPC port (default {DEFAULT_TEMPORAL_PORT}, or a free one)",
    )
    up.add_argument(
        "--ui-port", type=port_number, help=f"Temporal UI port (default {DEFAULT_UI_PORT}, or a free one)"
    )
    up.add_argument("--s3-port", type=port_number, help=f"S3 port (default {DEFAULT_S3_PORT}, or a free one)")
    up.add_argument("--headless", action="store_true", help="no Temporal web UI")
    up.set_defaults(func=cmd_up)

    down = sub.add_parser("down", help="stop the embedded stack (its data is kept)")
    down.add_argument("--home", help=home_help)
    down.add_argument("--timeout", type=float, default=10.0, help="seconds before SIGTERM becomes SIGKILL")
    down.set_defaults(func=cmd_down)

    env = sub.add_parser("env", help='print export lines for the running stack: eval "$(dgrpo env)"')
    env.add_argument("--home", help=home_help)
    env.set_defaults(func=cmd_env)

    schema = sub.add_parser("schema", help="print the RunSpec JSON Schema")
    schema.add_argument("--out", help="write it to this file instead")
    schema.set_defaults(func=cmd_schema)
