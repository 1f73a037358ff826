"""Options of the CPU serving engine's server, and its command line (no torch imported here)."""

from __future__ import annotations

import argparse
import ipaddress
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

from schemas.errors import DgrpoError
from schemas.settings import ENV_ADAPTER_ROOT, ENV_SERVE_API_KEY, dgrpo_home

DEFAULT_RENDER_TIMEOUT_S = 10.0
"""Rendering one request's chat template may take this long (a model's own renders in well under a
millisecond); a longer render is stopped where it is and the request refused (400)."""


def default_adapter_root() -> str:
    """``$DGRPO_ADAPTER_ROOT``, else ``$DGRPO_HOME/adapters`` (where the reload activity downloads)."""
    return os.environ.get(ENV_ADAPTER_ROOT) or str(Path(dgrpo_home()) / "adapters")


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1); False for ``0.0.0.0`` and the rest."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
    api_key: SecretStr | None = None
    """Bearer token every endpoint but ``/health`` requires (``/v1/*``, ``/sleep``, ``/wake_up``, ...);
    required when ``host`` is not a loopback address."""
    max_lora_rank: int | None = Field(None, ge=1)
    """Runtime adapters of a higher rank are refused (400), as vLLM's ``--max-lora-rank``; None: any rank."""
    trust_request_chat_template: bool = False
    """Render a request with the ``chat_template`` it brings (vLLM's flag of the same name); else refused (400)."""
    render_timeout_s: float = Field(DEFAULT_RENDER_TIMEOUT_S, gt=0, le=3600)
    """Rendering one request's chat template may take this long; a longer render is stopped and the request
    refused (400)."""
    adapter_root: str = Field(default_factory=default_adapter_root)
    """``/v1/load_lora_adapter`` loads only directories under this one (start-up adapters are exempt)."""

    @model_validator(mode="after")
    def _check_exposure(self) -> ServerOptions:
        if self.api_key is None and not is_loopback(self.host):
            raise ValueError(
                f"--host {self.host} serves beyond this machine, so the server needs an API key: pass "
                f"--api-key or set {ENV_SERVE_API_KEY} (or bind --host 127.0.0.1)"
            )
        return self


FLAGS = {"batch_window_s": "--batch-window"}
"""The options whose flag is not ``--`` and their name with dashes."""


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
    parser.add_argument("--max-lora-rank", type=int, default=None, help="refuse adapters of a higher rank")
    parser.add_argument("--default-max-tokens", type=int, default=1024)
    parser.add_argument(
        "--prefix-cache-mb",
        type=int,
        default=1024,
        help="KV kept for prompts that extend earlier ones; 0: off",
    )
    parser.add_argument(
        "--api-key",
        default=None,
        help=f"require this Bearer token on every endpoint but /health (default ${ENV_SERVE_API_KEY}; "
        "required beyond loopback)",
    )
    parser.add_argument(
        "--trust-request-chat-template",
        action="store_true",
        help="render a request with the chat_template it brings (else such a request is refused)",
    )
    parser.add_argument(
        "--render-timeout-s",
        type=float,
        default=DEFAULT_RENDER_TIMEOUT_S,
        help="a request's chat template render is stopped (and the request refused) after this long",
    )
    parser.add_argument(
        "--adapter-root",
        default=None,
        help=f"load runtime adapters only from under this dir (default ${ENV_ADAPTER_ROOT}, "
        "else $DGRPO_HOME/adapters)",
    )


def options_from_args(args: argparse.Namespace) -> ServerOptions:
    modules = {}
    for item in args.lora_modules:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise DgrpoError(f"--lora-modules takes NAME=PATH, got {item!r}")
        modules[name] = path
    api_key = args.api_key or os.environ.get(ENV_SERVE_API_KEY) or None
    try:
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
            max_lora_rank=args.max_lora_rank,
            default_max_tokens=args.default_max_tokens,
            api_key=None if api_key is None else SecretStr(api_key),
            adapter_root=args.adapter_root or default_adapter_root(),
            prefix_cache_mb=args.prefix_cache_mb,
            trust_request_chat_template=args.trust_request_chat_template,
            render_timeout_s=args.render_timeout_s,
        )
    except ValidationError as err:
        problems = []
        for e in err.errors(include_url=False):
            message = str(e["msg"]).removeprefix("Value error, ")
            field = str(e["loc"][0]) if e["loc"] else None
            flag = FLAGS.get(field, f"--{field.replace('_', '-')}") if field else None
            problems.append(f"{flag} {e.get('input')!r}: {message}" if flag else message)
        raise DgrpoError(f"refusing to start the server: {'; '.join(problems)}") from None
