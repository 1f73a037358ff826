"""``dgrpo art-server``: ART's backend HTTP protocol (``art run``) in front of the durable backend, and an
OpenAI-compatible endpoint serving each model's newest step under its name (dgrpo/art_server/)."""

from __future__ import annotations

import argparse
import asyncio

from dgrpo.cli.arg_types import port_number
from schemas.config import TaskQueues
from schemas.settings import ENV_ART_SERVER_API_KEY


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add this module's subcommands; each sets ``func`` to a callable taking the parsed args."""
    from dgrpo.art_server.options import ART_PORT, OPENAI_PORT

    parser = sub.add_parser(
        "art-server",
        help="serve ART's backend API (`art run`) and an OpenAI endpoint over the durable backend",
        description="Serve ART's backend HTTP API (as `art run` does: /register, /_train_model, ...) for clients "
        "such as NeMo Agent Toolkit's ART trainer, each train call a durable TrainStep, and an "
        "OpenAI-compatible endpoint that serves each registered model's newest step under its name. "
        "docs/art-server.md.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address both listeners bind (default loopback)")
    parser.add_argument("--port", type=port_number, default=ART_PORT, help="ART's API (default %(default)s)")
    parser.add_argument(
        "--openai-port",
        type=port_number,
        default=OPENAI_PORT,
        help="the OpenAI-compatible endpoint (default %(default)s, where ART's vLLM answers)",
    )
    parser.add_argument(
        "--api-key",
        default=None,
        help=f"require this Bearer token on both (default ${ENV_ART_SERVER_API_KEY}; required beyond loopback)",
    )
    parser.add_argument(
        "--backend",
        choices=("local", "temporal"),
        default="local",
        help="local: LocalBackend at --path (the embedded stack and workers, reused when running); temporal: "
        "a cluster's (DGRPO_TEMPORAL_ADDRESS, DGRPO_S3_*, DGRPO_INFERENCE_URL)",
    )
    parser.add_argument("--path", default="./.dgrpo", help="the LocalBackend's directory (--backend local)")
    queues = TaskQueues()
    parser.add_argument(
        "--control-queue", default=queues.control, help="the workers' task queues, as given to"
    )
    parser.add_argument("--inference-queue", default=queues.inference, help="`dgrpo worker` (default theirs)")
    parser.add_argument("--trainer-queue", default=queues.trainer)
    parser.add_argument("--art-path", default="./.art", help="where the server keeps its models' local files")
    parser.set_defaults(func=cmd_art_server)


def cmd_art_server(args: argparse.Namespace) -> int:
    from dgrpo.art_server.options import api_key_from_env, art_server_options
    from dgrpo.art_server.server import serve

    options = art_server_options(
        host=args.host,
        port=args.port,
        openai_port=args.openai_port,
        api_key=args.api_key or api_key_from_env(),
        backend=args.backend,
        path=args.path,
        task_queues=TaskQueues(
            control=args.control_queue, inference=args.inference_queue, trainer=args.trainer_queue
        ),
        art_path=args.art_path,
    )
    asyncio.run(serve(options))
    return 0
