"""ART's ``art.dev.openai_server``: the vLLM server configuration of ART's local backend. dgrpo's inference
worker builds its vLLM command line from its own flags (serving/launchers.py), one server for every run on
the worker, so a model's server configuration has nothing to apply to: ``get_openai_server_config`` is
refused, saying so, and the typed dicts exist for programs that name them."""

from __future__ import annotations

from typing import Any

from pydantic import with_config
from typing_extensions import TypedDict

from dgrpo.dev.engine import ART_DICT, EngineArgs
from dgrpo.errors import UnsupportedArtFeature

WHY = (
    "ART's local backend builds a vLLM server per model; dgrpo's inference worker runs one server for all runs "
    "and builds its command line from the worker's flags (`dgrpo worker inference --engine vllm --max-loras "
    "--max-lora-rank --dtype`, serving/launchers.py), so there is no per-model server configuration to make"
)


@with_config(ART_DICT)
class ServerArgs(TypedDict, total=False):
    """vLLM's OpenAI-compatible server arguments (ART's, e.g. ``api_key``, ``lora_modules``, ``chat_template``)."""

    host: str | None
    port: int
    api_key: str | None
    lora_modules: list[str] | None
    chat_template: str | None
    chat_template_content_format: str


@with_config(ART_DICT)
class OpenAIServerConfig(TypedDict, total=False):
    """ART's server configuration: its log file, ``ServerArgs`` and ``EngineArgs``."""

    log_file: str
    server_args: ServerArgs
    engine_args: EngineArgs


def get_openai_server_config(*args: Any, **kwargs: Any) -> OpenAIServerConfig:
    """Refused: see ``WHY``."""
    raise UnsupportedArtFeature(f"art.dev.get_openai_server_config: {WHY}")
