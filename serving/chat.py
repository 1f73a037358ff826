"""Chat requests to token ids and sampling parameters, and completions back to OpenAI/vLLM responses."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable
from typing import Any

from host.time_bound import TimeBoundExceeded, within
from schemas.numbers import SEED_MAX, SEED_MIN
from serving.api import ChatCompletionRequest, ServingHTTPError
from serving.batcher import Completion
from serving.options import DEFAULT_RENDER_TIMEOUT_S
from serving.sampling import SamplingParams
from serving.tool_calls import prepare_messages

ToolCallParser = Callable[[str], tuple[str | None, list[dict[str, Any]]]]


class ChatRenderer:
    """Applies the model's chat template and shapes responses; holds the tokenizer. Its methods are CPU
    work: the server calls them off its event loop."""

    def __init__(
        self,
        tokenizer: Any,
        max_model_len: int,
        default_max_tokens: int,
        trust_request_chat_template: bool = False,
        vocab_size: int | None = None,
        render_bound_s: float = DEFAULT_RENDER_TIMEOUT_S,
    ) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.default_max_tokens = default_max_tokens
        self.trust_request_chat_template = trust_request_chat_template
        self.vocab_size = vocab_size or len(tokenizer)
        """Logits per position (the model's ``vocab_size``): token ids a request names must be below it."""
        self.render_bound_s = render_bound_s
        template = tokenizer.chat_template
        self.template = template if isinstance(template, str) else str(template or "")
        longest = max((len(t) for t in tokenizer.get_vocab()), default=1)
        self.max_prompt_chars = max_model_len * max(longest, 1)
        """A rendered prompt longer than this cannot fit the context whatever it tokenizes to (no token is
        longer than ``longest`` characters), so it is refused before the tokenizer spends time on it."""

    def request_template(self, req: ChatCompletionRequest) -> str:
        """The template ``req`` renders with: its own when it brings one and the server trusts that, else the
        model's."""
        if req.chat_template is None:
            return self.template
        if not self.trust_request_chat_template:
            raise ServingHTTPError(
                400,
                "the request brings its own chat_template, which this server renders only when started with "
                "--trust-request-chat-template (its operator trusts callers' Jinja)",
                "chat_template",
            )
        return req.chat_template

    def prompt_ids(self, req: ChatCompletionRequest) -> list[int]:
        messages = [m.model_dump(exclude_none=True) for m in req.messages]
        template = self.request_template(req)

        def render() -> str:
            prepared, native_tools = prepare_messages(messages, req.tools, template)
            return str(
                self.tokenizer.apply_chat_template(
                    prepared,
                    tools=req.tools if native_tools else None,
                    add_generation_prompt=True,
                    tokenize=False,
                    chat_template=template,
                    **(req.chat_template_kwargs or {}),
                )
            )

        param = "chat_template" if req.chat_template is not None else "messages"
        try:
            text = within(self.render_bound_s, render)
        except TimeBoundExceeded:
            raise ServingHTTPError(
                400,
                f"rendering the chat template for these messages took over {self.render_bound_s:g} s; "
                "this server stops a render there: simplify the template or shorten the messages",
                param,
            ) from None
        except Exception as err:  # a template that cannot render these messages: the caller's input
            raise ServingHTTPError(
                400, f"cannot apply the chat template to these messages: {err}", "messages"
            ) from None
        if len(text) > self.max_prompt_chars:
            raise ServingHTTPError(
                400,
                f"the rendered prompt is {len(text):,} characters, more than a context of "
                f"{self.max_model_len} tokens can hold",
                param,
            )
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def logit_bias(self, req: ChatCompletionRequest) -> tuple[tuple[int, float], ...]:
        """``req.logit_bias`` with its keys as token ids (vLLM's reading: ``int(key)``)."""
        bias: dict[int, float] = {}
        for key, value in (req.logit_bias or {}).items():
            try:
                bias[int(key)] = value
            except ValueError:
                raise ServingHTTPError(
                    400, f"logit_bias key {key!r} is not a token id (an integer)", "logit_bias"
                ) from None
        return tuple(bias.items())

    def prepare(self, req: ChatCompletionRequest) -> tuple[list[int], SamplingParams]:
        """The prompt's token ids and the sampling parameters, every parameter checked (400 naming it), so
        a request that joins a batch cannot fail it."""
        refused = req.not_implemented()
        if refused is not None:
            raise ServingHTTPError(400, refused[1], refused[0])
        prompt_ids = self.prompt_ids(req)
        room = self.max_model_len - len(prompt_ids)
        if room < 1:
            raise ServingHTTPError(
                400,
                f"the prompt is {len(prompt_ids)} tokens; this model's context is {self.max_model_len}",
                "messages",
            )
        asked = req.max_completion_tokens or req.max_tokens
        if asked is not None and asked > room:
            raise ServingHTTPError(
                400,
                f"max_tokens={asked} plus the {len(prompt_ids)}-token prompt exceeds the context of "
                f"{self.max_model_len} tokens",
                "max_tokens",
            )
        params = SamplingParams(
            max_tokens=asked or min(self.default_max_tokens, room),
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=max(req.top_k or 0, 0),
            seed=req.seed,
            stop=req.stops,
            stop_token_ids=tuple(req.stop_token_ids or ()),
            ignore_eos=req.ignore_eos,
            min_tokens=req.min_tokens,
            top_logprobs=(req.top_logprobs or 0) if req.logprobs else 0,
            logit_bias=self.logit_bias(req),
        )
        problem = params.problem(self.vocab_size)
        if problem is not None:
            raise ServingHTTPError(400, problem[1], problem[0])
        return prompt_ids, params

    @staticmethod
    def params_for_choice(params: SamplingParams, index: int) -> SamplingParams:
        """Choice ``index`` of a seeded request draws from seed + index (wrapped within the seed range), so
        the n choices differ."""
        if params.seed is None or index == 0:
            return params
        seed = (params.seed + index - SEED_MIN) % (SEED_MAX - SEED_MIN + 1) + SEED_MIN
        return dataclasses.replace(params, seed=seed)

    def _token_strings(self, ids: list[int], as_ids: bool) -> list[str]:
        if as_ids or not ids:
            return [f"token_id:{i}" for i in ids]
        return list(self.tokenizer.batch_decode([[i] for i in ids]))

    def _logprobs(self, completion: Completion, as_ids: bool) -> dict[str, Any]:
        tokens = self._token_strings(completion.token_ids, as_ids)
        top_ids = sorted({i for step in completion.top_logprobs for i, _ in step})
        top_names = dict(zip(top_ids, self._token_strings(top_ids, as_ids), strict=True))
        content = []
        for token, logprob, top in zip(tokens, completion.logprobs, completion.top_logprobs, strict=True):
            content.append(
                {
                    "token": token,
                    "logprob": logprob,
                    "bytes": list(token.encode("utf-8")),
                    "top_logprobs": [
                        {"token": top_names[i], "logprob": lp, "bytes": list(top_names[i].encode("utf-8"))}
                        for i, lp in top
                    ],
                }
            )
        return {"content": content}

    def response(
        self,
        req: ChatCompletionRequest,
        prompt_ids: list[int],
        completions: list[Completion],
        parse_tool_calls: ToolCallParser,
    ) -> dict[str, Any]:
        choices = []
        for index, completion in enumerate(completions):
            message: dict[str, Any] = {"role": "assistant", "content": completion.text}
            finish_reason: str = completion.finish_reason
            if req.tools and req.tool_choice != "none":
                content, calls = parse_tool_calls(completion.text)
                if calls:
                    message = {"role": "assistant", "content": content, "tool_calls": calls}
                    finish_reason = "tool_calls"
            choices.append(
                {
                    "index": index,
                    "message": message,
                    "logprobs": self._logprobs(completion, req.return_tokens_as_token_ids)
                    if req.logprobs
                    else None,
                    "finish_reason": finish_reason,
                    "token_ids": completion.token_ids,
                    "prompt_token_ids": prompt_ids,
                }
            )
        completion_tokens = sum(len(c.token_ids) for c in completions)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": req.model,
            "choices": choices,
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": completion_tokens,
                "total_tokens": len(prompt_ids) + completion_tokens,
            },
            "prompt_token_ids": prompt_ids,
        }
