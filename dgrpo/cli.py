"""The ``dgrpo`` command: one subcommand module per area, each registering its own subparsers."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback

from dgrpo import cli_fleet, cli_run, cli_serve, cli_stack


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dgrpo", description="durable-grpo: GRPO training as durable Temporal workflows"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (cli_stack, cli_serve, cli_run, cli_fleet):
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


if __name__ == "__main__":
    entry()
