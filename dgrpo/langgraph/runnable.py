"""The chat model ``init_chat_model`` gives (ART's ``LoggingLLM``): a LangChain ``Runnable`` around a chat model.

It records nothing itself: ``wrap_rollout``'s capture records each chat completion from the wire. What it keeps
of ART's wrapper is how a program's calls behave: ``ainvoke`` bounded by ``invoke_timeout``; string tool-call
arguments parsed; ``with_structured_output(schema)`` as a tool the model is offered, its first call's arguments
validated into ``schema`` (dgrpo's CPU server refuses ``response_format`` schemas); ``with_retry`` leaving the
model as it is (the OpenAI client retries); ``with_config`` pointing a model built by ``init_chat_model`` at the
rollout running now. Imports LangChain: ``init_chat_model`` imports this module only when called.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.runnables import Runnable, RunnableConfig
from langchain_openai import ChatOpenAI

from activities.rollout_model import DEFAULT_API_KEY, routed_http_client
from dgrpo.langgraph.rollout import rollout_model
from serving.client import openai_base_url

RebuildChatModel = Callable[[Any], Any]
"""Given the rollout's model, the chat model for it."""


def served_chat_openai(model: Any, name: str | None, kwargs: dict[str, Any]) -> ChatOpenAI:
    """LangChain's ``ChatOpenAI`` on ``model``'s endpoint (``name``, or the step ``model`` serves now), asking
    for logprobs and token ids; ``kwargs`` win."""
    if model.inference_base_url is None:
        raise LookupError(
            f"model {model.name!r} has no inference server yet: `await model.register(backend)` before its "
            "rollouts (or give it inference_base_url=...)"
        )
    served = model.get_inference_name() if name in (None, model.name) else name
    options: dict[str, Any] = {
        "base_url": openai_base_url(model.inference_base_url),
        "api_key": model.inference_api_key or DEFAULT_API_KEY,
        "model": served,
        "temperature": 1.0,  # the policy's own distribution, as GRPO assumes (ART's)
        "logprobs": True,
        # the async client asks for token ids itself and copies the prompt's into each choice (vLLM's answer)
        "http_async_client": routed_http_client(served, served),
        **kwargs,
    }
    options["extra_body"] = {"return_token_ids": True, **(options.get("extra_body") or {})}
    return ChatOpenAI(**options)


class RolloutChatModel(Runnable[Any, Any]):
    """A chat model whose calls a ``wrap_rollout`` rollout records (ART's ``LoggingLLM``)."""

    def __init__(
        self,
        chat_model: Any,
        *,
        invoke_timeout: float | None,
        rebuild: RebuildChatModel | None = None,
        tools: Sequence[Any] | None = None,
        tool_options: dict[str, Any] | None = None,
        structured_output: type[Any] | None = None,
    ) -> None:
        self.chat_model = chat_model
        """The LangChain chat model, tools not bound."""
        self.invoke_timeout = invoke_timeout
        self.rebuild = rebuild
        """Makes ``chat_model`` for another rollout's model (``with_config``); None for a given instance."""
        self.tools = list(tools) if tools else None
        self.tool_options = tool_options or {}
        """``bind_tools``' other arguments (``tool_choice``, ...), given to the chat model's."""
        self.structured_output = structured_output
        self.llm = chat_model.bind_tools(self.tools, **self.tool_options) if self.tools else chat_model
        """What is called: ``chat_model`` with ``tools`` bound."""

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        return self._answer(self.llm.invoke(input, config=config, **kwargs))

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        call = self.llm.ainvoke(input, config=config, **kwargs)
        return self._answer(await asyncio.wait_for(call, timeout=self.invoke_timeout))

    def _answer(self, message: Any) -> Any:
        tool_calls = getattr(message, "tool_calls", None) or []
        for tool_call in tool_calls:
            if isinstance(tool_call["args"], str):
                tool_call["args"] = json.loads(tool_call["args"])
        if self.structured_output is None:
            return message
        return self.structured_output.model_validate(tool_calls[0]["args"] if tool_calls else None)

    def _with(self, **changes: Any) -> RolloutChatModel:
        fields: dict[str, Any] = {
            "chat_model": self.chat_model,
            "invoke_timeout": self.invoke_timeout,
            "rebuild": self.rebuild,
            "tools": self.tools,
            "tool_options": self.tool_options,
            "structured_output": self.structured_output,
            **changes,
        }
        return RolloutChatModel(fields.pop("chat_model"), **fields)

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> RolloutChatModel:
        """The model offered ``tools`` (LangChain tools, functions or OpenAI tool dicts)."""
        return self._with(tools=tools, tool_options=kwargs, structured_output=None)

    def with_structured_output(self, schema: type[Any]) -> RolloutChatModel:
        """The model offered ``schema`` (a pydantic model) as its one tool, answering with the ``schema`` its
        first tool call makes (ART's; not ``response_format``, which dgrpo's CPU server refuses)."""
        return self._with(tools=[schema], tool_options={}, structured_output=schema)

    def with_retry(self, **kwargs: Any) -> RolloutChatModel:  # type: ignore[override]
        """This model: its OpenAI client already retries a failed request (ART's wrapper does not retry)."""
        return self

    def with_config(self, config: RunnableConfig | None = None, **kwargs: Any) -> RolloutChatModel:  # type: ignore[override]
        """A model built by ``init_chat_model`` pointed at the ``wrap_rollout`` rollout running now; a given
        instance configured by its own ``with_config``."""
        if self.rebuild is not None:
            return self._with(chat_model=self.rebuild(rollout_model()))
        return self._with(chat_model=self.chat_model.with_config(config=config, **kwargs))
