"""Sample assistant choices in-process with HF ``generate``, with token ids and fp32 sampling logprobs.

The serving engine is the production sampler; this is for the trainer's tests, the learning test and the
bench, where a server is not the point. Prompts are left-padded; logprobs come from ``output_logits``
(the raw logits, so the sampling temperature must be 1 and no top-k/top-p applied).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from base_models.resolve import pad_token_id
from schemas.trajectory import Choice, ChoiceLogprobs, TokenLogprob

if TYPE_CHECKING:
    from activities.tokenize import TrainSequence
    from activities.trainer import Trainer


def chat_prompt_ids(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def sample_choices(
    model: Any,
    tokenizer: Any,
    prompts: list[list[dict[str, Any]]],
    n: int,
    max_new_tokens: int,
    seed: int,
) -> list[Choice]:
    """``n`` sampled choices per prompt (prompt-major order), each with token ids and logprobs."""
    prompt_ids = [chat_prompt_ids(tokenizer, p) for p in prompts for _ in range(n)]
    width = max(len(p) for p in prompt_ids)
    eos = tokenizer.eos_token_id
    pad = pad_token_id(tokenizer)
    device = next(model.parameters()).device
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompt_ids], device=device)
    attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids], device=device)
    torch.manual_seed(seed)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=attn,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            output_logits=True,
            return_dict_in_generate=True,
            use_cache=True,
            pad_token_id=pad,
        )
    model.train(was_training)
    logprobs = torch.stack([torch.log_softmax(x.float(), -1) for x in out.logits], 1)
    choices = []
    for i, p in enumerate(prompt_ids):
        completion = out.sequences[i, width:].tolist()
        finished = eos in completion
        if finished:
            completion = completion[: completion.index(eos) + 1]
        lps = [float(logprobs[i, t, c]) for t, c in enumerate(completion)]
        choices.append(
            Choice(
                message={
                    "role": "assistant",
                    "content": tokenizer.decode(completion, skip_special_tokens=True),
                },
                finish_reason="stop" if finished else "length",
                token_ids=completion,
                prompt_token_ids=p,
                logprobs=ChoiceLogprobs(
                    content=[
                        TokenLogprob(token=f"token_id:{c}", logprob=v)
                        for c, v in zip(completion, lps, strict=True)
                    ]
                ),
            )
        )
    return choices


def max_sampling_logprob_gap(trainer: Trainer, sequences: list[TrainSequence]) -> float:
    """The largest |trainer's logprob - sampling logprob| over the trainable tokens of ``sequences``.

    Near 0 means the importance ratio against the sampler's logprobs is signal, not numerical noise.
    """
    worst = 0.0
    for seq, lps in zip(sequences, trainer.sequence_logprobs(sequences), strict=True):
        for t in range(1, len(seq.tokens)):
            if seq.trainable[t]:
                worst = max(worst, abs(lps[t - 1] - seq.sampling_logprobs[t]))
    return worst
