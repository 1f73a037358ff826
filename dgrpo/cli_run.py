"""Subcommands of ``dgrpo`` (see dgrpo/cli.py)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add this module's subcommands; each sets ``func`` to a callable taking the parsed args."""
