"""ART 0.5.23's record of a rollout: each request it made to a model endpoint and the response, as captured.

An exchange is one successful call: the request body as sent (``request``, a JSON object), the response as
the provider's SDK object (``response``: an openai ``ChatCompletion``, ``Completion`` or ``Response``, an
anthropic ``Message``; kept as given, the client that captured it parsed it), and when it began and ended.
``model`` is the request's ``model``, else the response's. A trajectory keeps them by protocol
(``TrajectoryExchanges``); dgrpo trains the policy's Chat Completions exchanges, folded into
``messages_and_choices`` (``Trajectory.add_turn``, the fold the 0.5.18 capture records with).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from typing import Annotated, Any, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    SerializationInfo,
    computed_field,
    field_serializer,
)


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


UtcDateTime = Annotated[datetime, AfterValidator(_utc)]


def _sdk_response(value: Any) -> BaseModel:
    if not isinstance(value, BaseModel):
        raise ValueError(
            f"an exchange's response is the SDK's response object (openai ChatCompletion, Completion, Response; "
            f"anthropic Message), got {type(value).__name__}: parse the body with the SDK's model_validate"
        )
    return value


SdkResponse = Annotated[BaseModel, PlainValidator(_sdk_response, json_schema_input_type=dict[str, Any])]


class Exchange(BaseModel):
    """One call a rollout made to a model endpoint, and its (2xx) response."""

    model_config = ConfigDict(validate_assignment=True)

    request: dict[str, Any]
    """The request's JSON body, as sent (``model``, ``messages``, ``tools``, ...)."""
    response: SdkResponse
    """The response, parsed by the SDK of its protocol (a streamed one put together once complete)."""
    start_time: UtcDateTime
    """When the request was sent (UTC)."""
    end_time: UtcDateTime
    """When the response was complete (UTC)."""

    @field_serializer("response")
    def _serialize_response(self, response: BaseModel, info: SerializationInfo) -> dict[str, Any]:
        return response.model_dump(mode=info.mode, exclude_unset=True)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def model(self) -> str | None:
        """The model the request named (else the one the response names)."""
        requested = self.request.get("model")
        if isinstance(requested, str):
            return requested
        answered = getattr(self.response, "model", None)
        return answered if isinstance(answered, str) else None


class ChatCompletionsExchange(Exchange):
    """``POST .../chat/completions``: ``response`` is an openai ``ChatCompletion``."""


class CompletionsExchange(Exchange):
    """``POST .../completions``: ``response`` is an openai ``Completion``."""


class ResponsesExchange(Exchange):
    """``POST .../responses``: ``response`` is an openai ``Response``."""


class MessagesExchange(Exchange):
    """``POST .../messages`` (Anthropic's Messages API): ``response`` is an anthropic ``Message``."""


PROTOCOLS = ("chat_completions", "completions", "responses", "messages")
"""``TrajectoryExchanges``' fields, one per protocol."""


def matching_models(candidates: set[str | None], selectors: str | Iterable[str] | None) -> set[str | None]:
    """The candidates a selector names: its exact name when a candidate has it, else those its case-sensitive
    shell pattern matches (``agent*``); ``None`` selects all, an empty iterable none (as ART's)."""
    if selectors is None:
        return set(candidates)
    chosen = (selectors,) if isinstance(selectors, str) else tuple(selectors)
    return {
        candidate
        for selector in chosen
        for candidate in candidates
        if candidate == selector
        or (selector not in candidates and candidate is not None and fnmatchcase(candidate, selector))
    }


class TrajectoryExchanges(BaseModel):
    """A trajectory's exchanges, one list per protocol, each in the order the calls began."""

    chat_completions: list[ChatCompletionsExchange] = Field(default_factory=list)
    completions: list[CompletionsExchange] = Field(default_factory=list)
    responses: list[ResponsesExchange] = Field(default_factory=list)
    messages: list[MessagesExchange] = Field(default_factory=list)

    def __bool__(self) -> bool:
        return any((self.chat_completions, self.completions, self.responses, self.messages))

    def all(self) -> list[Exchange]:
        """Every exchange, of all protocols."""
        return [*self.chat_completions, *self.completions, *self.responses, *self.messages]

    def model_copy(  # type: ignore[override]
        self,
        *,
        include_models: str | Iterable[str] | None = None,
        exclude_models: str | Iterable[str] | None = None,
        update: Mapping[str, Any] | None = None,
        deep: bool = False,
    ) -> Self:
        """A copy with fresh lists holding the exchanges of the models ``include_models`` selects and
        ``exclude_models`` does not (``matching_models``); an ``update`` of a list wins as given."""
        models = {e.model for e in self.all()}
        selected = matching_models(models, include_models)
        if exclude_models is not None:
            selected -= matching_models(models, exclude_models)
        lists = {
            name: [e for e in getattr(self, name) if e.model in selected]
            for name in PROTOCOLS
            if update is None or name not in update
        }
        filtered = super().model_copy(update=lists)
        return super(TrajectoryExchanges, filtered).model_copy(update=update, deep=deep)
