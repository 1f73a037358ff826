"""The HTTP contract of the serving engines: OpenAI chat completions plus vLLM's LoRA and sleep endpoints.

Request bodies are the ones vLLM accepts (unknown OpenAI fields are ignored, as vLLM does); responses add
vLLM's ``prompt_token_ids`` (on the response and on every choice) and each choice's ``token_ids``.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from schemas.config import MAX_CHAT_TEMPLATE_CHARS
from schemas.numbers import SEED_MAX, SEED_MIN
from schemas.refs import SHA256_PATTERN
from schemas.trajectory import MESSAGE_ROLES


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _check_role(self) -> ChatMessage:
        if self.role not in MESSAGE_ROLES:
            raise ValueError(f"role must be one of {', '.join(MESSAGE_ROLES)}, got {self.role!r}")
        return self


NOT_IMPLEMENTED: dict[str, tuple[Any, ...]] = {
    "frequency_penalty": (None, 0, 0.0),
    "presence_penalty": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0),
    "min_p": (None, 0, 0.0),
    "use_beam_search": (None, False),
    "best_of": (None, 1),
    "length_penalty": (None, 1, 1.0),
    "include_stop_str_in_output": (None, False),
    "skip_special_tokens": (None, True),
    "spaces_between_special_tokens": (None, True),
    "allowed_token_ids": (None, []),
    "bad_words": (None, []),
    "prompt_logprobs": (None, 0),
    "logprob_token_ids": (None,),
    "echo": (None, False),
    "continue_final_message": (None, False),
    "add_generation_prompt": (None, True),
    "truncate_prompt_tokens": (None,),
    "logits_processors": (None,),
}
"""vLLM request fields this server does not implement, each with the values that ask for nothing (vLLM's
defaults): a request setting any other value is refused (400) rather than served as if it had not. Constrained
decoding is refused by ``ChatCompletionRequest``'s own validator, which says what to do instead."""

RESPONSE_FORMATS = ("text",)
"""``response_format`` types this server honours; JSON modes need a grammar-constrained sampler (vLLM's)."""

RENDERER_ARGUMENTS = frozenset(
    {"chat_template", "conversation", "tools", "add_generation_prompt", "tokenize"}
)
"""``apply_chat_template`` arguments the server sets itself, which ``chat_template_kwargs`` may not."""


GUIDED_FIELDS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
"""vLLM's removed guided-decoding fields (``structured_outputs`` replaced them; vLLM 0.32 ignores them)."""


class ChatCompletionRequest(BaseModel):
    """``POST /v1/chat/completions`` (non-streaming)."""

    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    """vLLM extra: -1 or 0 keeps every token."""
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    n: int = Field(1, ge=1, le=128)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    """vLLM's range: a signed 64-bit integer."""
    logit_bias: dict[str, float] | None = None
    """Token id (as a string) -> bias added to its logit before a token is drawn, clamped to [-100, 100]."""
    response_format: dict[str, Any] | None = None
    """Only ``{"type": "text"}``: a JSON mode is refused (400), never answered with free text."""
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    ignore_eos: bool = False
    """vLLM extra: keep sampling past EOS up to ``max_tokens`` (benchmarks)."""
    min_tokens: int = Field(0, ge=0)
    """vLLM extra: EOS and stop tokens are not drawn before this many tokens."""
    return_tokens_as_token_ids: bool = False
    """vLLM extra: logprob tokens as ``token_id:<n>`` instead of text."""
    chat_template_kwargs: dict[str, Any] | None = None
    """vLLM extra: keyword arguments the chat template is rendered with (``enable_thinking``, ...)."""
    chat_template: str | None = Field(None, min_length=1, max_length=MAX_CHAT_TEMPLATE_CHARS)
    """vLLM extra: a Jinja chat template to render this request with instead of the model's, taken only by a
    server started with ``--trust-request-chat-template`` (as vLLM's)."""
    stream: bool = False

    @model_validator(mode="after")
    def _check(self) -> ChatCompletionRequest:
        if self.stream:
            raise ValueError("stream=true is not supported by this server; send stream=false")
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=true")
        reserved = sorted(set(self.chat_template_kwargs or {}) & RENDERER_ARGUMENTS)
        if (
            reserved
        ):  # a template of the request's own, as vLLM refuses one without --trust-request-chat-template
            raise ValueError(
                f"chat_template_kwargs may not set {', '.join(reserved)}: this server renders them"
            )
        return self

    def not_implemented(self) -> tuple[str, str] | None:
        """``(parameter, why it is refused)`` for a field this server would otherwise ignore; else None."""
        if self.response_format is not None:
            kind = self.response_format.get("type")
            if kind not in RESPONSE_FORMATS:
                return "response_format", (
                    f"response_format type {kind!r} is not supported by this server (only 'text'): it does "
                    "not constrain sampling to JSON; leave response_format out or serve the model with vLLM"
                )
        extra = self.model_extra or {}
        for name, neutral in NOT_IMPLEMENTED.items():
            if name in extra and not any(extra[name] == v and type(extra[name]) is type(v) for v in neutral):
                return name, (
                    f"{name}={extra[name]!r} is not supported by this server: leave it out (or at its default) "
                    "or serve the model with vLLM"
                )
        return None

    @property
    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(s for s in self.stop if s)

    @model_validator(mode="after")
    def _refuse_unenforced_guidance(self) -> ChatCompletionRequest:
        """Constrained decoding (vLLM's ``structured_outputs``, the removed ``guided_*`` fields, a ``tool_choice``
        that forces a call) is refused, not ignored: this engine samples freely, so a student "guided" to its
        teacher's answer would learn from something else (vLLM honours them)."""
        extra = self.model_extra or {}
        asked = [k for k in ("structured_outputs", *GUIDED_FIELDS) if extra.get(k) is not None]
        if self.tools and (self.tool_choice == "required" or isinstance(self.tool_choice, dict)):
            asked.append(f"tool_choice={self.tool_choice!r}")
        if asked:
            raise ValueError(
                f"{', '.join(asked)}: constrained decoding is not enforced by this server; serve the model with "
                "vLLM (`dgrpo worker inference --engine vllm`), or leave it out"
            )
        return self


class LoadLoraAdapterRequest(BaseModel):
    """``POST /v1/load_lora_adapter``: vLLM's body, plus an optional sha256 map checked before loading."""

    model_config = ConfigDict(extra="allow")

    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)
    load_inplace: bool = False
    """Replace an adapter already loaded under ``lora_name`` (vLLM's flag)."""
    sha256: dict[str, str] | None = None
    """Expected sha256 per file, relative to ``lora_path``; any mismatch refuses the load."""

    @model_validator(mode="after")
    def _check_hashes(self) -> LoadLoraAdapterRequest:
        for path, digest in (self.sha256 or {}).items():
            if not re.match(SHA256_PATTERN, digest):
                raise ValueError(f"sha256[{path!r}] is not a lowercase hex sha256")
        return self


class UnloadLoraAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    lora_name: str = Field(min_length=1)
    lora_int_id: int | None = None


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """The OpenAI error JSON shape (vLLM puts the status in ``code``)."""
    kind = {
        400: "BadRequestError",
        404: "NotFoundError",
        409: "ConflictError",
        503: "ServiceUnavailableError",
    }
    return {
        "error": {
            "message": message,
            "type": kind.get(status, "InternalServerError"),
            "param": param,
            "code": status,
        }
    }


class ServingHTTPError(Exception):
    """Raised by the server's handlers; answered with ``error_body(status, message)``."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
