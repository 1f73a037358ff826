"""The model's own OpenAI client as ART wraps it (``model.openai_client()``): each ``chat.completions.create``
sends the model's default ``extra_body`` (ART's ``_internal_config["chat_template_kwargs"]``; the caller's
keys win) and hands the response to the model, which records what it cost
(``TrainableModel.set_cost_calculator``: ``costs/<context>/tinker_prefill`` and ``tinker_sample`` into the
active ``MetricsBuilder``). Everything else is the wrapped ``AsyncOpenAI``'s own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

RecordCosts = Callable[[Any], None]
"""Given each chat completion response."""


def merged_extra_body(defaults: Mapping[str, Any], given: Mapping[str, Any] | None) -> dict[str, Any]:
    """``defaults`` with ``given`` merged in, nested dicts key by key; a key of ``given`` wins."""
    merged = dict(defaults)
    for key, value in (given or {}).items():
        if isinstance(merged.get(key), Mapping) and isinstance(value, Mapping):
            merged[key] = merged_extra_body(merged[key], value)
        else:
            merged[key] = value
    return merged


class CostRecordingCompletions:
    """``client.chat.completions``: ``create`` adds the default ``extra_body`` and records the response."""

    def __init__(
        self, completions: Any, record_costs: RecordCosts, default_extra_body: dict[str, Any] | None = None
    ) -> None:
        self.completions = completions
        self.record_costs = record_costs
        self.default_extra_body = default_extra_body

    async def create(self, *args: Any, **kwargs: Any) -> Any:
        if self.default_extra_body is not None:
            kwargs["extra_body"] = merged_extra_body(self.default_extra_body, kwargs.get("extra_body"))
        response = await self.completions.create(*args, **kwargs)
        self.record_costs(response)
        return response

    def __getattr__(self, name: str) -> Any:  # parse, list, ...: the wrapped client's
        return getattr(self.completions, name)


class CostRecordingChat:
    """``client.chat``, whose ``completions`` record."""

    def __init__(
        self, chat: Any, record_costs: RecordCosts, default_extra_body: dict[str, Any] | None = None
    ) -> None:
        self.chat = chat
        self.completions = CostRecordingCompletions(chat.completions, record_costs, default_extra_body)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.chat, name)


class CostRecordingClient:
    """An ``AsyncOpenAI`` whose ``chat.completions.create`` records (``with_options`` keeps it so)."""

    def __init__(
        self, client: Any, record_costs: RecordCosts, default_extra_body: dict[str, Any] | None = None
    ) -> None:
        self.client = client
        self.record_costs = record_costs
        self.default_extra_body = default_extra_body
        self.chat = CostRecordingChat(client.chat, record_costs, default_extra_body)

    def with_options(self, *args: Any, **kwargs: Any) -> CostRecordingClient:
        return CostRecordingClient(
            self.client.with_options(*args, **kwargs), self.record_costs, self.default_extra_body
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)
