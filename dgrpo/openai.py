"""ART's ``art.openai``: a streamed chat completion (``stream=True``) put back together as the ``ChatCompletion``
the same call returns unstreamed.

    stream = await client.chat.completions.create(..., stream=True)
    completion = await consume_chat_completion_stream(stream, on_chunk=show_progress)

Choices are matched by their ``index``; text (``content``, ``refusal``, ``reasoning``), tool-call and function
arguments are joined in order, a tool call's ``id`` and ``name`` taken as sent; logprobs and vLLM's ``token_ids``
are joined; ``usage`` is the last chunk's that has one. ``on_chunk(chunk, completion so far)`` may raise
``StopIteration`` to close the stream early. A stream with no choice, or one that ends before each choice's
``finish_reason`` (unless stopped early), raises ``IncompleteChatCompletionStreamError`` (ART 0.5.23's rule).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from openai import AsyncStream, Stream
from openai.types.chat.chat_completion import ChatCompletion, Choice, ChoiceLogprobs
from openai.types.chat.chat_completion_chunk import ChatCompletionChunk
from openai.types.chat.chat_completion_chunk import Choice as ChunkChoice
from openai.types.chat.chat_completion_message import ChatCompletionMessage, FunctionCall
from openai.types.chat.chat_completion_message_function_tool_call import (
    ChatCompletionMessageFunctionToolCall,
    Function,
)

OnChunk = Callable[[ChatCompletionChunk, ChatCompletion], Any]


class IncompleteChatCompletionStreamError(ValueError):
    """The stream returned no choice, or ended before a choice finished."""


async def consume_chat_completion_stream(
    stream: AsyncStream[ChatCompletionChunk], on_chunk: OnChunk | None = None
) -> ChatCompletion:
    """The completion ``stream`` streams, once it ends (or ``on_chunk`` stops it)."""
    completion: ChatCompletion | None = None
    stopped = False
    async for chunk in stream:
        completion = _added(completion, chunk)
        if on_chunk is not None:
            try:
                on_chunk(chunk, completion)
            except StopIteration:
                await stream.close()
                stopped = True
                break
    return finalize_chat_completion(completion, allow_unfinished=stopped)


def consume_sync_chat_completion_stream(stream: Stream[ChatCompletionChunk]) -> ChatCompletion:
    """``consume_chat_completion_stream`` for the synchronous client's stream."""
    completion: ChatCompletion | None = None
    for chunk in stream:
        completion = _added(completion, chunk)
    return finalize_chat_completion(completion)


def _added(completion: ChatCompletion | None, chunk: ChatCompletionChunk) -> ChatCompletion:
    if completion is None:
        completion = init_chat_completion(chunk)
    update_chat_completion(completion, chunk)
    return completion


def init_chat_completion(chunk: ChatCompletionChunk) -> ChatCompletion:
    """An empty completion with the stream's id, model and time (its choices come with the chunks)."""
    return ChatCompletion(
        id=chunk.id, choices=[], created=chunk.created, model=chunk.model, object="chat.completion"
    )


def update_chat_completion(completion: ChatCompletion, chunk: ChatCompletionChunk) -> None:
    """Add ``chunk``'s deltas to ``completion`` (in place)."""
    for delta_choice in chunk.choices:
        choice = next((c for c in completion.choices if c.index == delta_choice.index), None)
        if choice is None:
            choice = Choice.model_construct(
                index=delta_choice.index,
                finish_reason=None,  # type: ignore[arg-type]  # set by the chunk that finishes it
                logprobs=None,
                message=ChatCompletionMessage(role="assistant"),
            )
            completion.choices.append(choice)
        _add_delta(choice, delta_choice)
    if chunk.usage is not None:
        completion.usage = chunk.usage
    completion.service_tier = chunk.service_tier or completion.service_tier
    completion.system_fingerprint = chunk.system_fingerprint or completion.system_fingerprint


def _add_delta(choice: Choice, delta_choice: ChunkChoice) -> None:
    delta, message = delta_choice.delta, choice.message
    if delta_choice.finish_reason is not None:
        choice.finish_reason = delta_choice.finish_reason
    if delta.content:
        message.content = (message.content or "") + delta.content
    if delta.refusal:
        message.refusal = (message.refusal or "") + delta.refusal
    reasoning = (delta.model_extra or {}).get("reasoning") or (delta.model_extra or {}).get(
        "reasoning_content"
    )
    if reasoning:
        setattr(message, "reasoning", (getattr(message, "reasoning", None) or "") + reasoning)  # noqa: B010
    if delta.function_call is not None:
        message.function_call = message.function_call or FunctionCall(name="", arguments="")
        message.function_call.name = delta.function_call.name or message.function_call.name
        message.function_call.arguments += delta.function_call.arguments or ""
    for call in delta.tool_calls or []:
        calls = message.tool_calls = message.tool_calls or []
        while len(calls) <= call.index:
            calls.append(
                ChatCompletionMessageFunctionToolCall(
                    id="", type="function", function=Function(name="", arguments="")
                )
            )
        tool_call = calls[call.index]
        assert isinstance(tool_call, ChatCompletionMessageFunctionToolCall)
        tool_call.id = call.id or tool_call.id
        if call.function is not None:
            tool_call.function.name = call.function.name or tool_call.function.name
            tool_call.function.arguments += call.function.arguments or ""
    if delta_choice.logprobs is not None:
        logprobs = choice.logprobs = choice.logprobs or ChoiceLogprobs()
        if delta_choice.logprobs.content:
            logprobs.content = [*(logprobs.content or []), *delta_choice.logprobs.content]
        if delta_choice.logprobs.refusal:
            logprobs.refusal = [*(logprobs.refusal or []), *delta_choice.logprobs.refusal]
    token_ids = (delta_choice.model_extra or {}).get("token_ids")
    if token_ids:  # vLLM's return_token_ids, which the trainer needs
        setattr(choice, "token_ids", [*(getattr(choice, "token_ids", None) or []), *token_ids])  # noqa: B010


def finalize_chat_completion(
    completion: ChatCompletion | None, *, allow_unfinished: bool = False
) -> ChatCompletion:
    """The completion once its stream ended: refused when it has no choice, or (unless ``allow_unfinished``, a
    stream stopped early) a choice that never got its ``finish_reason``; choices in index order."""
    if completion is None or not completion.choices:
        raise IncompleteChatCompletionStreamError("the chat completion stream returned no choices")
    unfinished = sorted(c.index for c in completion.choices if c.finish_reason is None)
    if unfinished and not allow_unfinished:
        raise IncompleteChatCompletionStreamError(
            f"the chat completion stream ended before choice(s) {unfinished} finished (no finish_reason)"
        )
    for choice in completion.choices:
        if choice.finish_reason is None:
            choice.finish_reason = "stop"  # stopped early by on_chunk
    completion.choices.sort(key=lambda c: c.index)
    return completion


__all__ = [
    "IncompleteChatCompletionStreamError",
    "consume_chat_completion_stream",
    "consume_sync_chat_completion_stream",
    "finalize_chat_completion",
    "init_chat_completion",
    "update_chat_completion",
]
