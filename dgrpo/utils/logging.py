"""ART's ``art.utils.logging``: the coloured, timestamped status lines ART's example scripts print.

    info("loading scenarios")  # [14:02:07] INFO  loading scenarios  (INFO in blue)

Lines go to stdout, as ART's do: they are the program's own progress for the person watching it, not
diagnostics (those go through the standard ``logging`` module).
"""

from __future__ import annotations

import time


class _C:
    """ANSI escape codes (ART's scripts colour their own text with them)."""

    RESET = "\x1b[0m"
    DIM = "\x1b[2m"
    BOLD = "\x1b[1m"
    ITAL = "\x1b[3m"
    GRAY = "\x1b[90m"
    RED = "\x1b[31m"
    GREEN = "\x1b[32m"
    YELLOW = "\x1b[33m"
    BLUE = "\x1b[34m"
    MAGENTA = "\x1b[35m"
    CYAN = "\x1b[36m"


def _ts() -> str:
    """The wall-clock time as ``HH:MM:SS``."""
    return time.strftime("%H:%M:%S")


def _line(label: str, colour: str, msg: object) -> None:
    print(f"[{_ts()}] {colour}{label}{_C.RESET}{' ' * (6 - len(label))}{msg}")


def info(msg: object) -> None:
    _line("INFO", _C.BLUE, msg)


def step(msg: object) -> None:
    _line("STEP", _C.CYAN, msg)


def ok(msg: object) -> None:
    _line("OK", _C.GREEN, msg)


def warn(msg: object) -> None:
    _line("WARN", _C.YELLOW, msg)


def err(msg: object) -> None:
    _line("ERR", _C.RED, msg)


def dim(msg: object) -> None:
    print(f"{_C.DIM}{msg}{_C.RESET}")
