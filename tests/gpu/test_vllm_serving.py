"""The serving contract against ``vllm serve`` (``engine=vllm``) on a GPU: the unmodified ``openai`` SDK and our
``ServingClient`` on the real SmolLM2-135M with real LoRA adapters, as tests/serving/test_server.py
checks our CPU server. Started through ``VllmServerProcess``, the launcher the inference worker uses."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import torch
from peft import PeftModel
from serving_adapters import FIXED_ANSWER, TRAIN_QUESTIONS, chat, random_adapter, train_fixed_answer_adapter
from serving_contract import RETURN_IDS, ensure_loaded, greedy, recorded_choice, teacher_forced
from transformers import AutoModelForCausalLM, AutoTokenizer

from base_models.resolve import SMOLLM2_NAME, ensure_smollm2
from schemas.settings import EngineSettings
from serving.client import ServingClient, ServingError
from serving.launchers import VllmServerProcess

pytestmark = pytest.mark.gpu
BASE = SMOLLM2_NAME
GPU_SHARE = 0.3
"""vLLM's share of the GPU: leaves room for the teacher-forced forward in the same process."""
SETTINGS = EngineSettings(
    engine="vllm",
    dtype="bf16",
    max_lora_rank=8,
    max_loras=4,
    sleep_mode=True,
    gpu_memory_utilization=GPU_SHARE,
)  # bf16: FlashAttention serves half precision only
Record = Callable[[str, dict[str, Any]], None]


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {
        "fixed": train_fixed_answer_adapter(root / "fixed"),
        "random": random_adapter(root / "random", seed=1),
        "other": random_adapter(root / "other", seed=2),
    }


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServerProcess]:
    log_path = tmp_path_factory.mktemp("vllm") / "vllm.log"
    server = VllmServerProcess(BASE, SETTINGS, log_path=log_path, extra_args=["--max-model-len", "2048"])
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def client(engine: VllmServerProcess) -> ServingClient:
    return engine.client


@pytest.fixture
def sdk(engine: VllmServerProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=engine.client.openai_base_url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(str(ensure_smollm2()))


async def test_chat_returns_logprobs_and_token_ids(sdk: openai.AsyncOpenAI, tokenizer: Any) -> None:
    messages = [{"role": "user", "content": "Say something about cats."}]
    response = await sdk.chat.completions.create(
        model=BASE, messages=messages, max_tokens=16, logprobs=True, top_logprobs=3, seed=0,  # type: ignore[arg-type]
        extra_body=RETURN_IDS,
    )  # fmt: skip
    assert response.model == BASE
    expected_prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    choice = recorded_choice(response)
    assert choice.prompt_token_ids == tokenizer(expected_prompt, add_special_tokens=False)["input_ids"]
    assert choice.token_ids and 1 <= len(choice.token_ids) <= 16
    logprobs = choice.sampled_logprobs()
    assert logprobs is not None and len(logprobs) == len(choice.token_ids)
    assert all(lp <= 0 for lp in logprobs)
    assert response.usage is not None and response.usage.completion_tokens == len(choice.token_ids)
    content = response.choices[0].logprobs.content  # type: ignore[union-attr]
    for token_id, entry in zip(choice.token_ids, content, strict=True):
        assert entry.token == f"token_id:{token_id}"  # --return-tokens-as-token-ids
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.logprob - 1e-6


async def test_sampled_logprobs_agree_with_the_trainers_forward(
    client: ServingClient, sdk: openai.AsyncOpenAI, adapters: dict[str, Path], record: Record
) -> None:
    """GRPO's importance ratio starts at exp(trainer - sampler) per token: vLLM bf16 must stay near fp32."""
    await ensure_loaded(client, "fixed@1", adapters["fixed"])
    jobs = [(m, q) for m in (BASE, "fixed@1") for q in [*TRAIN_QUESTIONS, "Explain why the sky is blue."]]
    responses = await asyncio.gather(
        *(
            sdk.chat.completions.create(
                model=m,
                messages=chat(q),
                max_tokens=32,
                logprobs=True,
                seed=i,
                extra_body=RETURN_IDS,  # type: ignore[arg-type]
            )
            for i, (m, q) in enumerate(jobs)
        )
    )
    base = AutoModelForCausalLM.from_pretrained(str(ensure_smollm2()), dtype=torch.float32).to("cuda").eval()
    policy = PeftModel.from_pretrained(base, str(adapters["fixed"])).eval()
    gaps = []
    for (model, _), response in zip(jobs, responses, strict=True):
        choice = recorded_choice(response)
        assert choice.prompt_token_ids and choice.token_ids
        if model == BASE:
            with policy.disable_adapter():
                expected = teacher_forced(policy, choice.prompt_token_ids, choice.token_ids, "cuda")
        else:
            expected = teacher_forced(policy, choice.prompt_token_ids, choice.token_ids, "cuda")
        gaps.append((torch.tensor(choice.sampled_logprobs()) - expected).abs())
    every = torch.cat(gaps)
    result = {"tokens": every.numel(), "max_abs": float(every.max()), "mean_abs": float(every.mean())}
    record("logprob_agreement_vllm_bf16_vs_trainer_fp32", result)
    assert result["mean_abs"] < 0.05, f"vLLM's sampled logprobs are far from the trainer's: {result}"


async def test_a_trained_adapter_changes_outputs(
    client: ServingClient, sdk: openai.AsyncOpenAI, adapters: dict[str, Path]
) -> None:
    await ensure_loaded(client, "fixed@1", adapters["fixed"])
    models = {m["id"]: m for m in await client.models()}
    assert models["fixed@1"]["parent"] == BASE
    for question in TRAIN_QUESTIONS[:2]:
        assert await greedy(sdk, "fixed@1", question) == FIXED_ANSWER
        assert await greedy(sdk, BASE, question) != FIXED_ANSWER


async def test_load_and_unload_under_32_concurrent_requests(
    client: ServingClient, sdk: openai.AsyncOpenAI, adapters: dict[str, Path]
) -> None:
    await ensure_loaded(client, "fixed@1", adapters["fixed"])
    await ensure_loaded(client, "idle@0", adapters["other"])
    question = TRAIN_QUESTIONS[0]

    async def ask(model: str) -> tuple[str, str]:
        r = await sdk.chat.completions.create(
            model=model,
            messages=chat(question),
            max_tokens=24,
            temperature=0,  # type: ignore[arg-type]
        )
        return r.model, r.choices[0].message.content or ""

    first = [asyncio.create_task(ask(m)) for m in ["fixed@1", BASE] * 16]
    assert await client.load_adapter("random@2", str(adapters["random"]))
    assert await client.unload_adapter("idle@0")
    second = [asyncio.create_task(ask(m)) for m in ["random@2", BASE] * 4]
    answers = await asyncio.gather(*first, *second)  # any failed request raises here
    # Each answered by the model it asked for. bf16 greedy text may shift with the batch it lands in,
    # so only the trained adapter's confident answer is compared word for word.
    assert [model for model, _ in answers] == ["fixed@1", BASE] * 16 + ["random@2", BASE] * 4
    assert all(text == FIXED_ANSWER for model, text in answers if model == "fixed@1")
    assert all(text and text != FIXED_ANSWER for model, text in answers if model != "fixed@1")
    assert (await ask("random@2"))[1] != (await ask(BASE))[1]  # the new adapter is not the base model
    assert "idle@0" not in await client.adapters()
    with pytest.raises(openai.NotFoundError):
        await ask("idle@0")


async def test_requests_in_flight_keep_their_adapter_through_an_unload(
    client: ServingClient, sdk: openai.AsyncOpenAI, adapters: dict[str, Path]
) -> None:
    """What the reload activity's leases rely on when they do let an adapter go."""
    await ensure_loaded(client, "fixed@3", adapters["fixed"])

    async def long_answer(question: str) -> str:
        r = await sdk.chat.completions.create(
            model="fixed@3", messages=chat(question), max_tokens=512, temperature=0,  # type: ignore[arg-type]
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        return r.choices[0].message.content or ""

    in_flight = [asyncio.create_task(long_answer(q)) for q in TRAIN_QUESTIONS * 4]
    await asyncio.sleep(0.2)  # sent and decoding: 512 tokens each take longer than this
    assert await client.unload_adapter("fixed@3")
    answers = await asyncio.gather(*in_flight)
    assert all(a.startswith(FIXED_ANSWER) for a in answers), answers[:2]


async def test_reload_in_place_swaps_the_weights_behind_a_name(
    client: ServingClient, sdk: openai.AsyncOpenAI, adapters: dict[str, Path]
) -> None:
    await client.unload_adapter("swap@1")
    assert await client.load_adapter("swap@1", str(adapters["random"]))
    before = await greedy(sdk, "swap@1", TRAIN_QUESTIONS[1])
    assert before != FIXED_ANSWER
    assert await client.load_adapter("swap@1", str(adapters["fixed"]), replace=True)  # vLLM load_inplace
    assert await greedy(sdk, "swap@1", TRAIN_QUESTIONS[1]) == FIXED_ANSWER


async def test_unknown_models_and_bad_adapters_get_a_4xx_and_the_server_keeps_serving(
    client: ServingClient, sdk: openai.AsyncOpenAI, tmp_path: Path
) -> None:
    hi = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.NotFoundError):
        await sdk.chat.completions.create(model="nobody@7", messages=hi)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError):
        await sdk.chat.completions.create(model=BASE, messages=hi, max_tokens=10_000_000)  # type: ignore[arg-type]
    with pytest.raises(ServingError) as missing:
        await client.load_adapter("ghost@1", str(tmp_path / "nowhere"))
    assert 400 <= missing.value.status < 500
    assert "ghost@1" not in await client.adapters()
    assert not await client.unload_adapter("ghost@1")
    assert await client.health()
    ok = await sdk.chat.completions.create(model=BASE, messages=hi, max_tokens=4)  # type: ignore[arg-type]
    assert ok.choices[0].finish_reason in ("stop", "length")


async def test_sleep_frees_the_gpu_and_wake_up_serves_the_same_adapters(
    client: ServingClient, sdk: openai.AsyncOpenAI, adapters: dict[str, Path], record: Record
) -> None:
    await ensure_loaded(client, "fixed@1", adapters["fixed"])
    free_awake, total = torch.cuda.mem_get_info()
    await client.sleep()
    assert await client.is_sleeping()
    free_asleep, _ = torch.cuda.mem_get_info()
    await client.wake_up()
    assert not await client.is_sleeping()
    freed = free_asleep - free_awake
    record("vllm_sleep", {"freed_gib": freed / 2**30, "share_gib": GPU_SHARE * total / 2**30})
    assert freed > 0.5 * GPU_SHARE * total, f"sleep freed only {freed / 2**30:.1f} GiB"
    assert await greedy(sdk, "fixed@1", TRAIN_QUESTIONS[0]) == FIXED_ANSWER
