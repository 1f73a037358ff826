"""Options of the CPU serving engine's server, and its command line (no torch imported here)."""

from __future__ import annotations

import argparse
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ServerOptions(BaseModel):
    """How ``dgrpo serve`` / ``python -m serving.server`` runs the CPU engine."""

    model_config = ConfigDict(extra="forbid")

    model: str
    """A ``base_model`` string (see base_models/resolve.py)."""
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    served_name: str | None = None
    """Name the base model answers to; default the ``--model`` string (an adapter dir: its base's)."""
    start_adapter_name: str | None = None
    """Name of the starting adapter when ``--model`` is an adapter dir; default ``<dir name>@0``."""
    lora_modules: dict[str, str] = Field(default_factory=dict)
    """More adapters to load at start, name -> directory (vLLM's ``--lora-modules name=path``)."""
    dtype: Literal["fp32", "bf16"] = "fp32"
    """fp32 keeps sampling logprobs equal to the trainer's fp32 logprobs (to ~1e-5)."""
    max_batch: int = Field(32, ge=1)
    """Rows decoded together; more requests wait for a row to finish."""
    batch_window_s: float = Field(0.02, ge=0)
    """An idle engine collects requests until none arrived for this long (at most ten times this)."""
    threads: int | None = Field(None, ge=1)
    """torch intra-op threads; None keeps torch's default (the physical cores)."""
    max_model_len: int | None = Field(None, ge=16)
    """Prompt + completion limit; None uses the model's ``max_position_embeddings``."""
    default_max_tokens: int = Field(1024, ge=1)
    """Completion length when a request gives no ``max_tokens`` (capped by the context left)."""
    prefix_cache_mb: int = Field(1024, ge=0)
    """Keys and values of finished sequences kept for prompts that extend them (multi-turn agents, a
    group's shared prompt), least recently used dropped first; 0 turns prefix caching off."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The server's command-line options (shared by ``dgrpo serve`` and ``python -m serving.server``)."""
    parser.add_argument(
        "--model", required=True, help="base_model: built-in name, HF dir, adapter dir or hub id"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-name", default=None, help="name the base model answers to")
    parser.add_argument("--start-adapter-name", default=None, help="served name of an adapter --model")
    parser.add_argument(
        "--lora-modules", nargs="*", default=[], metavar="NAME=PATH", help="adapters to load at start"
    )
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument(
        "--batch-window", type=float, default=0.02, help="seconds of quiet that end a burst of requests"
    )
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--default-max-tokens", type=int, default=1024)
    parser.add_argument(
        "--prefix-cache-mb",
        type=int,
        default=1024,
        help="KV kept for prompts that extend earlier ones; 0: off",
    )


def options_from_args(args: argparse.Namespace) -> ServerOptions:
    modules = {}
    for item in args.lora_modules:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise SystemExit(f"--lora-modules takes NAME=PATH, got {item!r}")
        modules[name] = path
    return ServerOptions(
        model=args.model,
        host=args.host,
        port=args.port,
        served_name=args.served_name,
        start_adapter_name=args.start_adapter_name,
        lora_modules=modules,
        dtype=args.dtype,
        max_batch=args.max_batch,
        batch_window_s=args.batch_window,
        threads=args.threads,
        max_model_len=args.max_model_len,
        default_max_tokens=args.default_max_tokens,
        prefix_cache_mb=args.prefix_cache_mb,
    )
