"""Trajectories + advantages -> training sequences, from the token ids the server sampled.

Each assistant ``Choice`` carries ``prompt_token_ids`` (the exact prompt the server tokenized),
``token_ids`` (the sampled completion) and per-token sampling logprobs, so nothing is re-tokenized and
the importance ratio compares the same tokens the policy sampled.

Multi-turn: a later choice's prompt normally starts with the earlier turns' tokens (prompt + sampled
completion + the tool/user messages that followed). When the next choice's ``prompt_token_ids`` start
with the whole sequence built so far, the choice is appended to it, so one sequence carries every
trainable turn and the turns in between are context (mask off). When they do not (the server
re-rendered an earlier turn differently, or the history was edited), the sequence so far is closed and
the choice starts a new sequence from its own prompt: every choice is trained exactly once either way.

Choices without token ids take their prompt from the tokenizer's chat template (rendered with
``add_generation_prompt``). Their sampled tokens are recovered from their logprobs as ART 0.5.17 recovers
them (a client such as NeMo Agent Toolkit builds choices from its own LLM calls, with logprobs and no token
ids): each logprob's ``token`` read as vLLM's ``token_id:<n>``, else as a vocabulary token; their sampling
logprobs are the logprobs'. A token that is neither is refused (ART trains an end-of-sequence token in its
place). A choice without logprobs falls back to the chat template for its completion too (the rest of the
rendered turn, up to its end-of-turn token); its sampling logprobs are unknown (NaN): the trainer uses the
current policy's detached logprobs, so its ratio is 1.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from activities import progress
from host.time_bound import TimeBoundExceeded, within
from schemas.errors import StalledError
from schemas.trajectory import Choice, Trajectory

log = logging.getLogger(__name__)


class ChatTokenizer(Protocol):
    """What the chat-template fallback needs (any HF tokenizer)."""

    @property
    def eos_token(self) -> Any: ...

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def __call__(self, text: str, **kwargs: Any) -> Any: ...

    def convert_tokens_to_ids(self, tokens: list[str]) -> Any: ...

    def convert_ids_to_tokens(self, ids: list[int]) -> Any: ...


TOKEN_ID_PREFIX = "token_id:"
"""vLLM's form of a logprob's token when it returns tokens as ids (``--return-tokens-as-token-ids``)."""


@dataclass
class TrainSequence:
    """One training sequence; every list is aligned with ``tokens``."""

    tokens: list[int]
    trainable: list[bool]
    """True on tokens the policy sampled (the loss mask); prompts and tool output are False."""
    sampling_logprobs: list[float]
    """Logprob of each trainable token under the sampling policy; NaN where unknown or not trainable."""
    advantage: float
    trajectory_index: int
    """Which input trajectory this came from (a trajectory may span several sequences)."""

    @property
    def n_trainable(self) -> int:
        return sum(self.trainable)


@dataclass
class TokenizedStep:
    sequences: list[TrainSequence] = field(default_factory=list)
    n_dropped_overlength: int = 0
    """Sequences longer than ``max_seq_len``, dropped (never truncated)."""
    n_template_choices: int = 0
    """Choices without token ids or logprobs, tokenized with the chat template (ratio 1)."""
    n_recovered_choices: int = 0
    """Choices without token ids whose sampled tokens were recovered from their logprobs (ART 0.5.17's way)."""
    n_split_choices: int = 0
    """Choices whose prompt did not extend the sequence so far and started a new sequence."""


@dataclass(frozen=True)
class TemplatedTokenizer:
    """A tokenizer that renders chats with a run's own template (``ModelSpec.chat_template``)."""

    tokenizer: Any
    chat_template: str

    @property
    def eos_token(self) -> Any:
        return self.tokenizer.eos_token

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
        return self.tokenizer.apply_chat_template(conversation, chat_template=self.chat_template, **kwargs)

    def __call__(self, text: str, **kwargs: Any) -> Any:
        return self.tokenizer(text, **kwargs)

    def convert_tokens_to_ids(self, tokens: list[str]) -> Any:
        return self.tokenizer.convert_tokens_to_ids(tokens)

    def convert_ids_to_tokens(self, ids: list[int]) -> Any:
        return self.tokenizer.convert_ids_to_tokens(ids)


def run_tokenizer(tokenizer: Any, chat_template: str | None) -> ChatTokenizer:
    """The base model's tokenizer, rendering with the run's own chat template when it has one."""
    return tokenizer if chat_template is None else TemplatedTokenizer(tokenizer, chat_template)


def _render(tokenizer: ChatTokenizer, messages: list[dict[str, Any]], tools: Any, gen_prompt: bool) -> str:
    """One chat rendered, stopped at the render stage's bound (a run's own template may run on: it is Jinja)."""
    clean = [{**m, "content": m.get("content") or ""} for m in messages]
    try:
        with progress.stage("render"):
            text = within(
                progress.bound("render"),
                lambda: tokenizer.apply_chat_template(
                    clean, tools=tools, add_generation_prompt=gen_prompt, tokenize=False
                ),
            )
    except TimeBoundExceeded as err:
        whose = "the run's chat template (model.chat_template)" if isinstance(tokenizer, TemplatedTokenizer) else (
            "the base model's chat template"
        )  # fmt: skip
        raise StalledError(
            f"rendering one chat with {whose} ran past the render stage's bound of {err.seconds:g} s and was "
            f"stopped: simplify the template (a worker's operator may raise the bound: DGRPO_STAGE_BOUNDS)"
        ) from None
    return str(text)


def _encode(tokenizer: ChatTokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def recovered_token_ids(tokenizer: ChatTokenizer | None, tokens: list[str]) -> list[int]:
    """The sampled token ids of a choice without them, from its logprobs' tokens as ART 0.5.17 reads them:
    every one vLLM's ``token_id:<n>``, else each a vocabulary token. A token that names none is refused: ART
    trains an end-of-sequence token in its place, which is not what was sampled."""
    if tokens and all(t.startswith(TOKEN_ID_PREFIX) and t[len(TOKEN_ID_PREFIX) :].isdigit() for t in tokens):
        return [int(t[len(TOKEN_ID_PREFIX) :]) for t in tokens]
    if tokenizer is None:
        raise ValueError(
            "a choice's logprob tokens are not token_id:<n> and no tokenizer was given to read them"
        )
    ids = list(tokenizer.convert_tokens_to_ids(tokens))
    # A token outside the vocabulary reads as the unknown token's id (or None): its id names another token.
    named = tokenizer.convert_ids_to_tokens([0 if i is None else i for i in ids])
    unknown = [t for t, i, n in zip(tokens, ids, named, strict=True) if i is None or n != t]
    if unknown:
        raise ValueError(
            f"a choice has no token ids and its logprobs name tokens that are not in the vocabulary "
            f"({unknown[:3]}): ask the server for token ids (vLLM's return_tokens_as_token_ids, as ART's server "
            "returns them, or return_token_ids), or call the model through model.openai_client()"
        )
    return ids


def choice_tokens(
    trajectory: Trajectory, position: int, tokenizer: ChatTokenizer | None
) -> tuple[list[int], list[int], list[float], str]:
    """``(prompt_ids, completion_ids, sampling_logprobs, source)`` of the choice at ``position``; ``source`` is
    where its completion's ids came from: ``sampled`` (the server's), ``logprobs`` (recovered) or ``template``."""
    choice = trajectory.messages_and_choices[position]
    assert isinstance(choice, Choice)
    messages = trajectory.messages()
    prompt_ids = choice.prompt_token_ids
    completion_ids = choice.token_ids
    logprobs = choice.sampled_logprobs()
    source = "sampled"
    if completion_ids is None and logprobs:
        assert choice.logprobs is not None and choice.logprobs.content is not None
        completion_ids = recovered_token_ids(tokenizer, [t.token for t in choice.logprobs.content])
        source = "logprobs"
    if prompt_ids is None or completion_ids is None:
        if tokenizer is None:
            raise ValueError(
                "a choice has no token_ids/prompt_token_ids and no tokenizer was given for the "
                "chat-template fallback"
            )
        prompt_text = _render(tokenizer, messages[:position], trajectory.tools, True)
        if prompt_ids is None:
            prompt_ids = _encode(tokenizer, prompt_text)
        if completion_ids is None:
            full = _render(tokenizer, messages[: position + 1], trajectory.tools, False)
            if not full.startswith(prompt_text):
                raise ValueError("the chat template does not render the prompt as a prefix of the turn")
            completion = full[len(prompt_text) :]
            eos = str(tokenizer.eos_token or "")
            if eos and eos in completion:
                completion = completion[: completion.rindex(eos) + len(eos)]
            completion_ids = _encode(tokenizer, completion)
            source, logprobs = "template", None
    if logprobs is not None and len(logprobs) != len(completion_ids):
        log.warning(
            "choice has %d token ids but %d logprobs; treating its sampling logprobs as unknown",
            len(completion_ids),
            len(logprobs),
        )
        logprobs = None
    return list(prompt_ids), list(completion_ids), logprobs or [math.nan] * len(completion_ids), source


def trajectory_sequences(
    trajectory: Trajectory,
    advantage: float,
    trajectory_index: int,
    tokenizer: ChatTokenizer | None = None,
    stats: TokenizedStep | None = None,
) -> list[TrainSequence]:
    """The training sequences of one trajectory (usually one; more when turns do not chain)."""
    out: list[TrainSequence] = []
    cur: TrainSequence | None = None
    for position, item in enumerate(trajectory.messages_and_choices):
        if not isinstance(item, Choice):
            continue
        prompt, completion, logprobs, source = choice_tokens(trajectory, position, tokenizer)
        if stats is not None and source == "template":
            stats.n_template_choices += 1
        if stats is not None and source == "logprobs":
            stats.n_recovered_choices += 1
        if not completion:
            continue
        if cur is not None and prompt[: len(cur.tokens)] == cur.tokens:
            context = prompt[len(cur.tokens) :]
        else:
            if cur is not None:
                out.append(cur)
                if stats is not None:
                    stats.n_split_choices += 1
            cur = TrainSequence([], [], [], advantage, trajectory_index)
            context = prompt
        cur.tokens += context + completion
        cur.trainable += [False] * len(context) + [True] * len(completion)
        cur.sampling_logprobs += [math.nan] * len(context) + list(logprobs)
    if cur is not None:
        out.append(cur)
    return out


def build_sequences(
    trajectories: Sequence[Trajectory],
    advantages: Sequence[float],
    max_seq_len: int,
    tokenizer: ChatTokenizer | None = None,
) -> TokenizedStep:
    """Every trajectory's training sequences; overlength ones dropped and counted."""
    if len(trajectories) != len(advantages):
        raise ValueError(f"{len(trajectories)} trajectories but {len(advantages)} advantages")
    step = TokenizedStep()
    for index, (trajectory, advantage) in enumerate(zip(trajectories, advantages, strict=True)):
        progress.advance()
        for seq in trajectory_sequences(trajectory, advantage, index, tokenizer, step):
            if len(seq.tokens) > max_seq_len:
                step.n_dropped_overlength += 1
                continue
            if seq.n_trainable:
                step.sequences.append(seq)
    if step.n_dropped_overlength:
        log.warning(
            "dropped %d sequence(s) longer than max_seq_len=%d (raise TrainConfig.max_seq_len to keep them)",
            step.n_dropped_overlength,
            max_seq_len,
        )
    return step
