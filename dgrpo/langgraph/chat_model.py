"""ART's ``art.langgraph.init_chat_model``: a LangChain chat model of the rollout's served model.

LangChain is not a dependency of dgrpo (it is ART's optional extra ``openpipe-art[langgraph]``): it is imported
here when a chat model is made, and when it is missing the ``ImportError`` names the ``pip install``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Literal

from dgrpo.langgraph.rollout import rollout_model

if TYPE_CHECKING:
    from dgrpo.langgraph.runnable import RolloutChatModel

DEFAULT_INVOKE_TIMEOUT = 10 * 60
"""Seconds a call of the chat model may take (ART's): ``asyncio.wait_for`` around ``ainvoke``."""
OPENAI_COMPATIBLE_PROVIDERS = {None, "openai", "openai-compatible", "openai_compatible"}
"""The ``model_provider`` values whose model ``init_chat_model`` builds itself (ART's)."""
LANGCHAIN_INSTALL = "pip install 'langchain-core>=0.3.51' 'langchain-openai>=0.3.27' 'langgraph>=0.6.2'"
"""What ART's ``openpipe-art[langgraph]`` extra installs."""
_LANGCHAIN_MODULES = {"langchain_core", "langchain_openai"}


def init_chat_model(
    model: str | Any | None = None,
    *,
    model_provider: str | None = None,
    configurable_fields: Literal[None] = None,
    config_prefix: str | None = None,
    invoke_timeout: float | None = DEFAULT_INVOKE_TIMEOUT,
    **kwargs: Any,
) -> RolloutChatModel:
    """A LangChain chat model for a ``wrap_rollout`` rollout (ART's).

    With ``model`` a name or None: LangChain's ``ChatOpenAI`` on the rollout model's endpoint and key, asking for
    ``model`` (the model's own name, or None, means the step it serves now), at temperature 1.0, with logprobs and
    token ids; ``kwargs`` (``temperature``, ``max_tokens``, ``timeout``, ...) go to ``ChatOpenAI`` and win. With
    ``model`` a LangChain chat model instance: that model, for another provider. Either way its calls in a
    ``wrap_rollout`` rollout are recorded in the rollout's trajectory; ``invoke_timeout`` bounds each
    ``ainvoke`` (None: no bound).
    """
    if configurable_fields is not None:
        raise ValueError("configurable_fields is not supported by ART's init_chat_model (nor dgrpo's)")
    if config_prefix is not None:
        raise ValueError("config_prefix is not supported by ART's init_chat_model (nor dgrpo's)")
    runnable = _langchain_runnable()
    if model is not None and not isinstance(model, str):
        return runnable.RolloutChatModel(model, invoke_timeout=invoke_timeout)
    if model_provider not in OPENAI_COMPATIBLE_PROVIDERS:
        raise ValueError(
            f"init_chat_model builds only OpenAI-compatible chat models (as ART's), not provider "
            f"{model_provider!r}: pass a LangChain chat model instance as `model` to use it"
        )

    def served_chat_model(rollout: Any) -> Any:
        return runnable.served_chat_openai(rollout, model, kwargs)

    return runnable.RolloutChatModel(
        served_chat_model(rollout_model()), invoke_timeout=invoke_timeout, rebuild=served_chat_model
    )


def _langchain_runnable() -> Any:
    """``dgrpo.langgraph.runnable``, which imports LangChain; an ``ImportError`` naming the install without it."""
    try:
        return importlib.import_module("dgrpo.langgraph.runnable")
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] not in _LANGCHAIN_MODULES:
            raise
        raise ImportError(
            f"art.langgraph's chat model needs LangChain, which dgrpo does not install ({error.name} is "
            f"missing): {LANGCHAIN_INSTALL}",
            name=error.name,
        ) from error
