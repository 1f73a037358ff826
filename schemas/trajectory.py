"""Trajectories as ART records them: chat messages (context) interleaved with assistant choices (trainable).

A ``Choice`` mirrors the ``Choice`` object the openai SDK returns, plus the token ids the server sampled
(``token_ids``, as vLLM returns them with ``return_token_ids``) and the exact prompt token ids, so the trainer
never re-tokenizes. An openai ``Choice`` (or any pydantic model with the same fields) is accepted as is.
"""

from __future__ import annotations

import asyncio
import json
import time
import traceback as tb
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Annotated, Any, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    PlainValidator,
    PrivateAttr,
    field_serializer,
    model_validator,
)

from schemas.exchanges import PROTOCOLS, TrajectoryExchanges
from schemas.refs import SHA256_PATTERN

SCHEMA_VERSION = 1
"""Version of the trajectory record; written into every Parquet file's metadata."""

ROLLOUT_DONE: ContextVar[Callable[[Trajectory | BaseException], None] | None] = ContextVar(
    "dgrpo_rollout_done", default=None
)
"""Called as each awaited rollout of a group finishes (``dgrpo.gather_trajectory_groups``' progress bar)."""

MESSAGE_ROLES = ("system", "developer", "user", "assistant", "tool", "function")


def _check_message(message: dict[str, Any]) -> dict[str, Any]:
    role = message.get("role")
    if role not in MESSAGE_ROLES:
        raise ValueError(f"a chat message needs 'role' in {MESSAGE_ROLES}, got {role!r}")
    return message


Message = Annotated[dict[str, Any], AfterValidator(_check_message)]
"""A plain OpenAI chat message (``{"role": ..., "content": ...}``); context, never trained on."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TopLogprob(_Strict):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(_Strict):
    """One sampled token's logprob, as in OpenAI's ``choice.logprobs.content``."""

    token: str
    """The token's text (vLLM's ``token_id:<n>`` form when it returns tokens as ids)."""
    logprob: float
    """Log-probability of the token under the sampling policy."""
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(_Strict):
    content: list[TokenLogprob] | None = None
    refusal: list[TokenLogprob] | None = None


_CHOICE_FIELDS = ("index", "finish_reason", "message", "logprobs", "token_ids", "prompt_token_ids")


class Choice(_Strict):
    """An assistant turn the policy sampled: the trainable part of a trajectory."""

    index: int = Field(0, ge=0)
    """Position of this choice among the ``n`` the request asked for."""
    finish_reason: str | None = None
    """Why sampling stopped: ``stop``, ``length``, ``tool_calls``."""
    message: Message
    """The assistant message (``role``, ``content``, ``tool_calls``)."""
    logprobs: ChoiceLogprobs | None = None
    """Per-token sampling logprobs; the importance ratio's denominator."""
    token_ids: list[int] | None = None
    """Completion token ids exactly as sampled (vLLM ``return_token_ids``)."""
    prompt_token_ids: list[int] | None = None
    """Prompt token ids exactly as the server tokenized them."""

    @model_validator(mode="before")
    @classmethod
    def _from_openai(cls, value: Any) -> Any:
        # An openai SDK Choice: keep the known fields, lift server extras (token ids) out of model_extra.
        if isinstance(value, BaseModel) and not isinstance(value, Choice):
            data = value.model_dump(exclude_none=True)
            extra = value.model_extra or {}
            out = {k: data[k] for k in _CHOICE_FIELDS if k in data}
            for key in ("token_ids", "prompt_token_ids"):
                if key not in out and extra.get(key) is not None:
                    out[key] = list(extra[key])
            if isinstance(out.get("message"), dict):
                out["message"] = {k: v for k, v in out["message"].items() if v is not None}
            return out
        return value

    def sampled_logprobs(self) -> list[float] | None:
        """The per-token logprobs as a plain list, or None when the server returned none."""
        if self.logprobs is None or self.logprobs.content is None:
            return None
        return [t.logprob for t in self.logprobs.content]


class ExceptionRecord(_Strict):
    """A rollout that raised: kept with its group, never silently dropped."""

    type: str
    """The exception class name."""
    message: str
    """``str(exception)``."""
    traceback: str = ""
    """The formatted traceback, when there was one."""

    @classmethod
    def from_exception(cls, exc: BaseException) -> ExceptionRecord:
        return cls(
            type=type(exc).__name__,
            message=str(exc),
            traceback="".join(tb.format_exception(type(exc), exc, exc.__traceback__)),
        )


def as_entry(item: Any) -> Choice | dict[str, Any]:
    """One ``messages_and_choices`` item as our ``Choice`` or a checked chat message.

    Items appended after construction are not validated by pydantic: an openai ``Choice``
    (``traj.messages_and_choices.append(completion.choices[0])``) is converted here, where it is read.
    """
    if isinstance(item, Choice):
        return item
    if isinstance(item, BaseModel):
        data = item.model_dump(exclude_none=True)
        # A choice (it has a message), or a message model such as ``choice.message`` (context only).
        return Choice.model_validate(item) if "message" in data else _check_message(data)
    if isinstance(item, dict):
        return _check_message(item)
    raise TypeError(
        f"messages_and_choices holds a {type(item).__name__}; append chat messages as dicts "
        "({'role': ..., 'content': ...}) and the policy's turns as `completion.choices[0]`"
    )


def _entries_messages(items: Iterable[Any]) -> list[dict[str, Any]]:
    return [e.message if isinstance(e, Choice) else e for e in map(as_entry, items)]


def _entries_choices(items: Iterable[Any]) -> list[Choice]:
    return [e for e in map(as_entry, items) if isinstance(e, Choice)]


def _sdk_model(value: Any) -> BaseModel:
    if not isinstance(value, BaseModel):
        raise ValueError(f"expected a pydantic model (an openai Choice), got {type(value).__name__}")
    return value


SdkModel = Annotated[BaseModel, PlainValidator(_sdk_model, json_schema_input_type=dict[str, Any])]
"""Any pydantic model instance, as given (never built from a dict)."""

Entry = Choice | Message | SdkModel
"""A ``messages_and_choices`` item: our ``Choice``, a chat message dict, or an SDK model (an openai
``Choice`` or message) kept as given and converted by ``as_entry`` where it is read or stored."""


class _Conversation(_Strict):
    """Messages and sampled choices in order, and the tools offered: what a trajectory and each of its
    additional histories hold alike."""

    messages_and_choices: list[Entry] = Field(default_factory=list)
    """Chat messages (context) and the policy's sampled choices (trainable), in order."""
    tools: list[dict[str, Any]] | None = None
    """OpenAI tool definitions offered to the model, if any."""

    @field_serializer("messages_and_choices")
    def _serialize_entries(self, items: list[Any]) -> list[Any]:
        return [e.model_dump() if isinstance(e, Choice) else e for e in map(as_entry, items)]

    def messages(self) -> list[dict[str, Any]]:
        """The plain OpenAI message list: choices replaced by their assistant message."""
        return _entries_messages(self.messages_and_choices)

    def choices(self) -> list[Choice]:
        """The trainable choices, in order (openai ``Choice`` objects appended later included)."""
        return _entries_choices(self.messages_and_choices)


def _comparable(message: Any) -> Any:
    # The same message as the trajectory lists it and as a client sends it back (None fields dropped; a tool
    # call's arguments as the JSON they hold: LangChain sends back json.dumps of the arguments it parsed).
    if isinstance(message, BaseModel):
        message = message.model_dump(exclude_none=True)
    if isinstance(message, dict):
        return {
            k: _comparable(_json_value(v) if k == "arguments" else v)
            for k, v in message.items()
            if v is not None and v != []
        }
    if isinstance(message, list):
        return [_comparable(v) for v in message]
    return message


def _json_value(text: Any) -> Any:
    if isinstance(text, str):
        try:
            return json.loads(text)
        except ValueError:
            pass
    return text


def _continues(conversation: _Conversation, messages: list[Any], tools: Any) -> bool:
    seen = conversation.messages()
    if not seen:
        return conversation.tools is None or conversation.tools == tools
    return conversation.tools == tools and [_comparable(m) for m in messages[: len(seen)]] == [
        _comparable(m) for m in seen
    ]


class History(_Conversation):
    """Another conversation of the same rollout (a sub-agent, a summariser), as ART's ``History``."""


class Trajectory(_Conversation):
    """One rollout of an agent: what it saw, what it sampled, and how it was scored."""

    additional_histories: list[History] = Field(default_factory=list)
    """Other conversations of this rollout (ART's sub-agent histories); not trained by dgrpo yet."""
    reward: float = 0.0
    """The scalar reward GRPO optimises."""
    metrics: dict[str, float | int | bool] = Field(default_factory=dict)
    """Numbers worth logging per trajectory (averaged per step)."""
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    """Small labels: scenario id, difficulty, anything to slice results by (any JSON value, as ART 0.5.23's)."""
    logs: list[str] = Field(default_factory=list)
    """Free-text notes the rollout wants to keep."""
    policy_step: int | None = Field(None, ge=0)
    """The training step whose adapter sampled the choices (None when unknown)."""
    policy_sha256: str | None = Field(None, pattern=SHA256_PATTERN)
    """The ``adapter_sha256`` of the adapter that sampled the choices, as the inference worker loaded it (None
    when unknown): a step trained again after its trainer was lost is another adapter under the same step."""
    initial_policy_version: int | None = None
    """ART's: the policy version (step) when the rollout began, as the program set it; stored, not read."""
    final_policy_version: int | None = None
    """ART's: the policy version (step) when the rollout ended, as the program set it; stored, not read."""
    start_time: datetime = Field(default_factory=datetime.now, exclude=True)
    """When the rollout began (``finish()`` measures from here); not stored."""
    exchanges: TrajectoryExchanges = Field(default_factory=TrajectoryExchanges, exclude_if=lambda e: not e)
    """ART 0.5.23's record: the calls ``with trajectory:`` (``art.trajectory(...)``) captured, by protocol
    (schemas/exchanges.py); never together with ``messages_and_choices``. Written only when it holds one."""

    def __init__(self, /, **data: Any) -> None:
        """As ART's (a pydantic model that ignores what it does not know), a keyword argument that is not a
        field (``Trajectory(..., scenario=s)``, as ART's mcp-rl example passes) is dropped, with a warning
        naming it; reading stored trajectories (``model_validate``) stays strict."""
        unknown = sorted(data.keys() - type(self).model_fields.keys())
        if unknown:
            warnings.warn(
                f"Trajectory ignores keyword argument(s) {', '.join(map(repr, unknown))}: not fields of a "
                "trajectory (ART ignores them too); keep such values in metadata= to have them stored",
                UserWarning,
                stacklevel=2,
            )
            data = {k: v for k, v in data.items() if k not in unknown}
        super().__init__(**data)

    # Validation (``model_validate``, a field holding a trajectory) does not go through this ``__init__``, only a
    # call of the class does: pydantic calls a model's own ``__init__`` unless it carries the mark
    # ``BaseModel.__init__`` carries (tests/schemas/test_trajectory.py checks both paths).
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @model_validator(mode="after")
    def _one_representation(self) -> Trajectory:
        if self.exchanges and (
            self.messages_and_choices or self.tools is not None or self.additional_histories
        ):
            raise ValueError(
                "a trajectory holds either captured exchanges or messages_and_choices (with tools and "
                "additional_histories), not both"
            )
        return self

    def model_copy(  # type: ignore[override]
        self,
        *,
        include_models: str | Iterable[str] | None = None,
        exclude_models: str | Iterable[str] | None = None,
        update: Mapping[str, Any] | None = None,
        deep: bool = False,
    ) -> Self:
        """A copy whose exchanges are those of the models ``include_models`` selects and ``exclude_models``
        does not (an exact captured name first, else a shell pattern: ``TrajectoryExchanges.model_copy``);
        every other field copied as pydantic copies; an ``update`` wins as given."""
        exchanges = (
            TrajectoryExchanges()
            if update is not None and "exchanges" in update
            else self.exchanges.model_copy(include_models=include_models, exclude_models=exclude_models)
        )
        filtered = super().model_copy(update={"exchanges": exchanges})
        return super(Trajectory, filtered).model_copy(update=update, deep=deep)

    # ---- ART 0.5.23's capture scope: ``with trajectory:`` records the calls begun inside it ----------
    def __enter__(self) -> Trajectory:
        CAPTURE_SCOPES.set((*CAPTURE_SCOPES.get(), CaptureScope(self)))
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        scopes = CAPTURE_SCOPES.get()
        if not scopes or scopes[-1].trajectory is not self:
            raise RuntimeError("trajectory capture scopes must exit in the order they were entered")
        CAPTURE_SCOPES.set(scopes[:-1])
        self.finish()

    def add_turn(self, messages: list[Any], tools: list[dict[str, Any]] | None, choice: Any) -> None:
        """Record one chat completion: the request's ``messages`` not yet recorded, then the returned
        ``choice``, in the conversation they continue (with the same ``tools``): this one, one of its
        ``additional_histories``, or a new one of those (as ART 0.5.18's capture)."""
        conversations: list[_Conversation] = [self, *self.additional_histories]
        conversation = next((c for c in conversations if _continues(c, messages, tools)), None)
        if conversation is None:
            conversation = History()
            self.additional_histories.append(conversation)
        conversation.messages_and_choices.extend(messages[len(conversation.messages_and_choices) :])
        conversation.messages_and_choices.append(choice)
        conversation.tools = tools

    def messages(self) -> list[dict[str, Any]]:
        """The plain OpenAI message list: choices replaced by their assistant message. For captured
        exchanges, the one conversation their Chat Completions make (an error if they make several)."""
        if not self.exchanges:
            return super().messages()
        return self._folded().messages()

    def offered_tools(self) -> list[dict[str, Any]] | None:
        """The tools the agent was offered: ``tools``, or for captured exchanges those their Chat Completions
        conversation was asked with (as ART's ``history().as_chat_completions_history().tools``)."""
        return self._folded().tools if self.exchanges else self.tools

    def _folded(self) -> Trajectory:
        """The one Chat Completions conversation the captured exchanges make, as a trajectory of messages and
        choices; an error if they make several, or hold other protocols' exchanges."""
        folded = Trajectory()
        for exchange in sorted(self.exchanges.chat_completions, key=lambda e: e.start_time):
            choices = getattr(exchange.response, "choices", None) or []
            if choices:
                folded.add_turn(
                    list(exchange.request.get("messages") or []), exchange.request.get("tools"), choices[0]
                )
        others = [name for name in PROTOCOLS[1:] if getattr(self.exchanges, name)]
        if folded.additional_histories or others:
            raise ValueError(
                "this trajectory's exchanges are not one Chat Completions conversation"
                + (f" (it also holds {', '.join(others)} exchanges)" if others else "")
                + ": read trajectory.exchanges, or copy one model's with trajectory.model_copy(include_models=...)"
            )
        return folded

    def log(self, message: str) -> None:
        """Keep a free-text note with the trajectory."""
        self.logs.append(message)

    def finish(self) -> Trajectory:
        """Record ``metrics["duration"]``: seconds since the trajectory was created. Returns self."""
        self.metrics["duration"] = (datetime.now() - self.start_time).total_seconds()
        return self

    @asynccontextmanager
    async def track_duration(self, metric_name: str) -> AsyncIterator[None]:
        """Add the block's wall time to ``metrics["<metric_name>_duration"]`` (summed over uses)."""
        started = time.monotonic()
        try:
            yield
        finally:
            key = f"{metric_name}_duration"
            self.metrics[key] = float(self.metrics.get(key, 0.0)) + time.monotonic() - started

    def for_logging(self) -> dict[str, Any]:
        """A plain dict for printing or logging: each message marked ``trainable`` or not (a trajectory of
        captured exchanges: its JSON dump, as ART 0.5.23's)."""
        if self.exchanges:
            return self.model_dump(mode="json")
        messages = []
        for entry in map(as_entry, self.messages_and_choices):
            if isinstance(entry, Choice):
                messages.append({**entry.message, "trainable": True})
            else:
                messages.append({**entry, "trainable": False})
        return {
            "reward": self.reward,
            "metrics": self.metrics,
            "metadata": self.metadata,
            "messages": messages,
            "tools": self.tools,
            "logs": self.logs,
        }

    def __str__(self) -> str:
        return f"Trajectory(reward={self.reward}, metrics={self.metrics}, metadata={self.metadata})"


class TrajectoryGroup(_Strict):
    """Rollouts of one scenario, compared with each other by GRPO.

    Like ART's, it may be built from awaitables (``TrajectoryGroup(rollout(m, s) for _ in range(8))``);
    ``await group`` then runs them and returns a group of finished trajectories and recorded exceptions.
    """

    trajectories: list[Trajectory] = Field(default_factory=list)
    """The finished rollouts."""
    exceptions: list[ExceptionRecord] = Field(default_factory=list)
    """Rollouts that raised, kept for the record."""
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    """Labels shared by the group (scenario id, ...; any JSON value, as ART 0.5.23's)."""
    metrics: dict[str, float | int | bool] = Field(default_factory=dict)
    """Numbers about the group as a whole (logged once per group)."""
    logs: list[str] = Field(default_factory=list)
    """Free-text notes about the group."""

    _pending: list[Awaitable[Trajectory]] = PrivateAttr(default_factory=list)

    def __init__(
        self,
        trajectories: Iterable[Trajectory | BaseException | Awaitable[Trajectory] | dict[str, Any]] = (),
        **data: Any,
    ) -> None:
        done: list[Any] = []
        pending: list[Awaitable[Trajectory]] = []
        # ART passes exceptions=[...] as raised exceptions; stored groups pass them as records.
        exceptions = [
            ExceptionRecord.from_exception(e) if isinstance(e, BaseException) else e
            for e in data.pop("exceptions", [])
        ]
        for item in trajectories:
            if isinstance(item, BaseException):
                exceptions.append(ExceptionRecord.from_exception(item))
            elif isinstance(item, Awaitable) and not isinstance(item, (Trajectory, dict)):
                pending.append(item)
            else:
                done.append(item)
        super().__init__(trajectories=done, exceptions=exceptions, **data)  # type: ignore[call-arg]
        self._pending = pending

    def __len__(self) -> int:
        """How many finished trajectories the group holds (rollouts that raised are not counted)."""
        return len(self.trajectories)

    def __iter__(self) -> Iterator[Trajectory]:  # type: ignore[override]
        """The finished trajectories, as ART's groups iterate (not pydantic's (field, value) pairs)."""
        return iter(self.trajectories)

    def log(self, message: str) -> None:
        """Keep a free-text note with the group."""
        self.logs.append(message)

    def __copy__(self) -> TrajectoryGroup:
        """A group with its own lists and dicts (as ART's ``copy.copy``), holding the same trajectories: adding
        to or dropping from the copy leaves this group as it was."""
        copied = super().__copy__()
        copied.trajectories = list(self.trajectories)
        copied.exceptions = list(self.exceptions)
        copied.metadata = dict(self.metadata)
        copied.metrics = dict(self.metrics)
        copied.logs = list(self.logs)
        copied._pending = list(self._pending)
        return copied

    @property
    def pending(self) -> int:
        """How many rollouts are still to run (awaitables given to the constructor)."""
        return len(self._pending)

    def __await__(self):  # type: ignore[no-untyped-def]
        return self._gather().__await__()

    async def _gather(self) -> TrajectoryGroup:
        results = await asyncio.gather(*(_report(p) for p in self._pending), return_exceptions=True)
        self._pending = []
        for result in results:
            if isinstance(result, Trajectory):
                self.trajectories.append(result)
            elif isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result
                self.exceptions.append(ExceptionRecord.from_exception(result))
            else:
                self.exceptions.append(
                    ExceptionRecord(
                        type="TypeError",
                        message=f"a rollout returned {type(result).__name__}, expected Trajectory",
                    )
                )
        return self


async def _report(rollout: Awaitable[Trajectory]) -> Trajectory:
    try:
        result = await rollout
    except Exception as err:
        if (done := ROLLOUT_DONE.get()) is not None:
            done(err)
        raise
    if (done := ROLLOUT_DONE.get()) is not None:
        done(result)
    return result


@dataclass(frozen=True, slots=True)
class CaptureScope:
    """A trajectory the calls begun in this context are recorded into: as exchanges (ART 0.5.23's
    ``with trajectory:``), or, ``legacy``, as messages and choices (ART 0.5.18's ``capture_auto_trajectory``)."""

    trajectory: Trajectory
    legacy: bool = False


CAPTURE_SCOPES: ContextVar[tuple[CaptureScope, ...]] = ContextVar("dgrpo_capture_scopes", default=())
"""The capture scopes of this context, innermost last; a call is recorded into the innermost when it begins.
Tasks copy it, so concurrent rollouts record only their own calls."""
