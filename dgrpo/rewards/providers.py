"""Where a RULER judge named as litellm names it is reached, as ART reaches it through litellm.

``openai/<model>``, ``hosted_vllm/<model>`` and ``openrouter/<vendor>/<model>`` are OpenAI-compatible: this
module finds their endpoint and key in the call's ``api_base``/``api_key`` or in litellm's own environment
variables (``OPENAI_BASE_URL`` / ``OPENAI_API_BASE`` and ``OPENAI_API_KEY``, ``HOSTED_VLLM_API_BASE``, ...), and
the judge is asked with dgrpo's OpenAI client. Any other provider prefix (``anthropic/``, ``gemini/``, ...) is
litellm's to reach (``pip install litellm``, as ART depends on it); without litellm it is refused before any
request. A name without a prefix is dgrpo's extension: the ``api_base`` given, else the inference server in
``$DGRPO_INFERENCE_URL`` (dgrpo's own server as judge); a prefixed name never falls back to it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from dgrpo.errors import UnsupportedArtFeature
from schemas.settings import ENV_INFERENCE_URL
from serving.client import openai_base_url


@dataclass(frozen=True)
class Provider:
    """An OpenAI-compatible litellm provider: where its endpoint and key are read from (in order)."""

    base_url_env: tuple[str, ...]
    default_base_url: str | None
    api_key_env: tuple[str, ...]


OPENAI_COMPATIBLE = {
    "openai": Provider(
        ("OPENAI_BASE_URL", "OPENAI_API_BASE"), "https://api.openai.com/v1", ("OPENAI_API_KEY",)
    ),
    "hosted_vllm": Provider(("HOSTED_VLLM_API_BASE",), None, ("HOSTED_VLLM_API_KEY",)),
    "openrouter": Provider(
        ("OPENROUTER_API_BASE",), "https://openrouter.ai/api/v1", ("OPENROUTER_API_KEY", "OR_API_KEY")
    ),
}
"""litellm 1.82's variables for each (``litellm/main.py``): the call's ``api_base``/``api_key`` win."""


@dataclass(frozen=True)
class JudgeEndpoint:
    """An OpenAI-compatible judge: its base URL (``.../v1``), key and the provider's own model id."""

    base_url: str
    api_key: str | None
    model: str
    own_server: bool
    """dgrpo's extension (an unprefixed name on ``$DGRPO_INFERENCE_URL`` or ``api_base``): asked greedily, with
    at most 512 tokens, unless told otherwise; a provider's judge gets only what the call gives, as in ART."""


def provider_of(judge_model: str) -> str | None:
    """litellm's provider prefix of ``judge_model`` (``openai`` of ``openai/o4-mini``), None without one."""
    prefix, slash, rest = judge_model.partition("/")
    return prefix if slash and rest and prefix.replace("_", "").isalnum() else None


def judge_endpoint(
    judge_model: str, params: Mapping[str, object], env: Mapping[str, str] = os.environ
) -> JudgeEndpoint | None:
    """The OpenAI-compatible endpoint of ``judge_model``; None when it is another provider's (litellm's to
    reach). Raises ``ValueError`` naming what to set when the endpoint or a needed key is unknown."""
    given_url = params.get("api_base") or params.get("base_url")
    given_key = params.get("api_key")
    provider = provider_of(judge_model)
    if provider is None or (provider not in OPENAI_COMPATIBLE and not _litellm_knows(provider)):
        base_url = given_url or env.get(ENV_INFERENCE_URL)
        if not base_url:
            raise ValueError(
                f"no judge endpoint for {judge_model!r}: name its provider as litellm does ('openai/{judge_model}' "
                "with OPENAI_API_KEY, 'hosted_vllm/...' with HOSTED_VLLM_API_BASE, ...), pass "
                f"extra_litellm_params={{'api_base': 'http://host:port/v1'}}, or set {ENV_INFERENCE_URL}"
            )
        return JudgeEndpoint(openai_base_url(str(base_url)), _str(given_key), judge_model, own_server=True)
    if provider not in OPENAI_COMPATIBLE:
        return None
    spec = OPENAI_COMPATIBLE[provider]
    base_url = given_url or next((env[v] for v in spec.base_url_env if env.get(v)), spec.default_base_url)
    if not base_url:
        raise ValueError(
            f"no endpoint for judge {judge_model!r}: set {' or '.join(spec.base_url_env)} (litellm's variable), "
            "or pass extra_litellm_params={'api_base': ...}"
        )
    api_key = given_key or next((env[v] for v in spec.api_key_env if env.get(v)), None)
    if api_key is None and base_url == spec.default_base_url:  # the provider's own service needs one
        raise ValueError(
            f"judge {judge_model!r} needs an API key: set {' or '.join(spec.api_key_env)} (litellm's variable), or "
            "pass extra_litellm_params={'api_key': ...}"
        )
    return JudgeEndpoint(openai_base_url(str(base_url)), _str(api_key), judge_model.split("/", 1)[1], False)


def require_litellm(judge_model: str) -> None:
    """Refuse a provider only litellm reaches when litellm is not installed, before any request."""
    try:
        import litellm  # noqa: F401  # the provider's own API, as ART calls it
    except ImportError:
        raise UnsupportedArtFeature(
            f"judge {judge_model!r}: its provider is reached through litellm, which is not installed "
            "(pip install 'litellm>=1.71.1,<=1.82.0', as ART depends on it); or name an OpenAI-compatible one: "
            f"{', '.join(p + '/...' for p in OPENAI_COMPATIBLE)}"
        ) from None


def _litellm_knows(provider: str) -> bool:
    """A provider litellm reaches (``anthropic``, ``gemini``, ...), as its provider list says when installed;
    without litellm, any lowercase prefix that is not a hub organisation's name reads as one."""
    try:
        import litellm
    except ImportError:
        return provider in KNOWN_PROVIDERS
    return provider in set(litellm.provider_list)


KNOWN_PROVIDERS = frozenset(
    {"anthropic", "gemini", "vertex_ai", "bedrock", "azure", "mistral", "groq", "ollama"}
)
"""Providers named without litellm installed, so their judge is refused (not sent to dgrpo's server)."""


def _str(value: object) -> str | None:
    return None if value is None else str(value)
