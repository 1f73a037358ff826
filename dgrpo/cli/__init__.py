"""The ``dgrpo`` command (``entry``, the console script; ``python -m dgrpo.cli``): one module per command group,
each registering its own subparsers: ``stack`` (up, down, env, schema), ``serve``, ``worker``, ``runs`` (train,
status, pause, resume, stop, demo).

The CLI is not ART's API: it drives the façade and the layers below; nothing else in ``dgrpo`` imports it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback

from dgrpo.cli import fleet, runs, serve, stack, worker


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dgrpo", description="durable-grpo: GRPO training as durable Temporal workflows"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (stack, serve, worker, runs, fleet):
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
