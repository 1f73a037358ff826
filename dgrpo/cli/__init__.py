"""The ``dgrpo`` command (``entry``, the console script; ``python -m dgrpo.cli``): one module per command group,
each registering its own subparsers: ``stack`` (up, down, env, schema), ``serve``, ``worker``, ``runs`` (train,
status, pause, resume, stop, demo), ``art_server`` (art-server).

The CLI is not ART's API: it drives the façade and the layers below; nothing else in ``dgrpo`` imports it.

A wrong call ends with one line saying what to fix, and exit status 2 (argparse's own for a usage error):
expected errors (``DgrpoError``, a flag's value a settings model refuses, a path that is not there) are
caught here, once, for every subcommand; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback

from pydantic import ValidationError

from dgrpo.cli import art_server, fleet, runs, serve, stack, worker
from schemas.errors import DgrpoError

USAGE_ERROR = 2
PATH_ERRORS = (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError, FileExistsError)
"""A path given on the command line that cannot be read or written there."""


def flag_problems(err: ValidationError) -> str:
    """A settings model's refusal of flag values, each named as its flag (``--max-loras 0: ...``)."""
    problems = []
    for e in err.errors(include_url=False):
        flag = "--" + str(e["loc"][-1]).replace("_", "-") if e["loc"] else "a flag"
        problems.append(f"{flag} {e.get('input')!r}: {e['msg']}")
    return "; ".join(problems)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dgrpo", description="durable-grpo: GRPO training as durable Temporal workflows"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (stack, serve, worker, runs, fleet, art_server):
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except ValidationError as err:
        print(f"dgrpo {args.command}: {flag_problems(err)}", file=sys.stderr)
    except (DgrpoError, *PATH_ERRORS) as err:
        print(f"dgrpo {args.command}: {err}", file=sys.stderr)
    return USAGE_ERROR


def entry() -> None:
    """The console script: run ``main`` and leave without interpreter teardown.

    The Temporal client's Rust threads can outlive the event loop; tearing the interpreter down under them
    aborts a finished command with "PyGILState_Release ... finalizing" (temporalio/sdk-python#300).
    """
    try:
        code = main()
    except Exception:
        traceback.print_exc()
        code = 1
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
