"""``dgrpo serve``: the CPU serving engine alone, as ``vllm serve`` would run (see serving/server.py)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add this module's subcommands; each sets ``func`` to a callable taking the parsed args."""
    from serving.options import add_arguments

    parser = sub.add_parser(
        "serve",
        help="serve a model (and LoRA adapters) over the OpenAI/vLLM HTTP API on this CPU",
        description="Serve MODEL with /v1/chat/completions, /v1/models, /v1/load_lora_adapter, "
        "/v1/unload_lora_adapter and /health, like `vllm serve MODEL --enable-lora`.",
    )
    add_arguments(parser)
    parser.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    from base_models.resolve import resolve_base_model
    from serving.options import options_from_args

    options = options_from_args(args)
    resolve_base_model(options.model)  # a model that is not there is said before torch loads
    from serving.server import serve

    serve(options)
    return 0
