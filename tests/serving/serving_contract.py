"""What the serving-contract tests share with the GPU tests: the calls a rollout makes, and the trainer's view of
a sample (its teacher-forced logprobs), for either engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import torch
from openai.types.chat import ChatCompletion
from serving_adapters import chat

from activities.rollout_model import lift_prompt_token_ids
from schemas.trajectory import Choice
from serving.client import NO_ANSWER, ServingClient, ServingError

RETURN_IDS = {"return_token_ids": True}
"""vLLM sends token ids only when asked; our engine always does."""


async def ensure_loaded(client: ServingClient, name: str, path: Path) -> None:
    """Load ``name`` (or find it loaded). A load the server took and never answered is tried once more, as the
    reload activity retries it: vLLM's CPU build once left one unanswered in a full test run (engine idle)."""
    try:
        await client.load_adapter(name, str(path))
    except ServingError as err:
        if err.status != NO_ANSWER:
            raise
        print(f"retrying a load {client.base_url} did not answer: {err.message}")
        await client.load_adapter(name, str(path))
    assert name in await client.adapters()


async def greedy(sdk: openai.AsyncOpenAI, model: str, question: str, max_tokens: int = 12) -> str:
    r = await sdk.chat.completions.create(
        model=model,
        messages=chat(question),
        max_tokens=max_tokens,
        temperature=0,  # type: ignore[arg-type]
    )
    return r.choices[0].message.content or ""


def recorded_choice(response: ChatCompletion) -> Choice:
    """What a rollout records: vLLM returns ``prompt_token_ids`` on the response; the rollout's HTTP layer lifts
    them into each choice (activities/rollout_model.py) before the SDK parses it."""
    lifted = ChatCompletion.model_validate(lift_prompt_token_ids(response.model_dump()))
    return Choice.model_validate(lifted.choices[0])


def teacher_forced(model: Any, prompt: list[int], completion: list[int], device: str = "cpu") -> torch.Tensor:
    """fp32 logprobs of ``completion`` given ``prompt`` from one unpadded forward: the trainer's view."""
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + completion], device=device)).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)[len(prompt) - 1 : -1]
    return logprobs.gather(1, torch.tensor(completion, device=device).unsqueeze(1)).squeeze(1).cpu()


async def assert_logit_bias_bans_and_forces(sdk: openai.AsyncOpenAI, tokenizer: Any, model: str) -> None:
    """``logit_bias`` as vLLM has it: -100 keeps a token from being drawn, +100 draws it, and the logprob returned
    is the raw distribution's (vLLM's default ``raw_logprobs``), so a forced unlikely token shows as unlikely."""

    async def first_token(bias: dict[str, float] | None) -> tuple[int, float]:
        r = await sdk.chat.completions.create(
            model=model, messages=chat("Name a colour."), max_tokens=1, temperature=0, logprobs=True,  # type: ignore[arg-type]
            logit_bias=bias, extra_body=RETURN_IDS,
        )  # fmt: skip
        choice = recorded_choice(r)
        logprobs = choice.sampled_logprobs()
        assert choice.token_ids and logprobs
        return choice.token_ids[0], logprobs[0]

    free, free_logprob = await first_token(None)
    banned, _ = await first_token({str(free): -100})
    assert banned != free
    forced_id = tokenizer(" zebra", add_special_tokens=False)["input_ids"][0]
    forced, forced_logprob = await first_token({str(forced_id): 100})
    assert forced == forced_id and forced_logprob < free_logprob - 3
