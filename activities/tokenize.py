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

Choices without token ids fall back to the tokenizer's chat template (prompt rendered with
``add_generation_prompt``, completion = the rest of the rendered turn, up to its end-of-turn token).
Their sampling logprobs are unknown (NaN): the trainer uses the current policy's detached logprobs,
so their ratio is 1.
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
    """Choices without token ids, tokenized with the chat template (ratio 1)."""
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


def choice_tokens(
    trajectory: Trajectory, position: int, tokenizer: ChatTokenizer | None
) -> tuple[list[int], list[int], list[float], bool]:
    """``(prompt_ids, completion_ids, sampling_logprobs, from_template)`` of the choice at ``position``."""
    choice = trajectory.messages_and_choices[position]
    assert isinstance(choice, Choice)
    messages = trajectory.messages()
    prompt_ids = choice.prompt_token_ids
    completion_ids = choice.token_ids
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
    logprobs = choice.sampled_logprobs() if choice.token_ids is not None else None
    if logprobs is not None and len(logprobs) != len(completion_ids):
        log.warning(
            "choice has %d token ids but %d logprobs; treating its sampling logprobs as unknown",
            len(completion_ids),
            len(logprobs),
        )
        logprobs = None
    from_template = choice.token_ids is None
    return list(prompt_ids), list(completion_ids), logprobs or [math.nan] * len(completion_ids), from_template


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
        prompt, completion, logprobs, from_template = choice_tokens(trajectory, position, tokenizer)
        if stats is not None and from_template:
            stats.n_template_choices += 1
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
