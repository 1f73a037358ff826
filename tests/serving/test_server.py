"""The CPU serving engine end to end: the real SmolLM2-135M behind the real HTTP server, driven by the
unmodified ``openai`` SDK and our ``ServingClient``, with real LoRA adapters.

The server runs with an API key (``$DGRPO_SERVE_API_KEY``) and an adapter root (``$DGRPO_ADAPTER_ROOT``,
this session's pytest temp dir), so every test here also shows the client sends the key.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch
from peft import PeftModel
from serving_adapters import FIXED_ANSWER, TRAIN_QUESTIONS, chat, random_adapter
from serving_contract import assert_logit_bias_bans_and_forces, greedy
from temporalio.testing import ActivityEnvironment
from transformers import AutoModelForCausalLM, AutoTokenizer

from activities.judge import JudgeActivities, JudgeEndpoints
from activities.object_store import ObjectStore
from activities.rollouts import RolloutActivities
from base_models.resolve import SMOLLM2_NAME, ensure_smollm2
from schemas.activities import JudgeInput, RolloutsInput
from schemas.config import JudgeConfig, TaskSpec
from schemas.settings import ENV_ADAPTER_ROOT, ENV_SERVE_API_KEY, EngineSettings
from schemas.trajectory import Choice
from serving.client import NO_ANSWER, ServingClient, ServingError, auth_headers
from serving.launchers import CpuServerProcess
from serving.server import main as server_main

BASE = SMOLLM2_NAME
API_KEY = secrets.token_hex(16)
RENDER_TIMEOUT_S = 2.0
"""The server (trusting requests' own chat templates) stops a render after this long."""
MAX_LORA_RANK = 8


@pytest.fixture(scope="module")
def adapters(served_adapters: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The session's adapters, and ``wide``: rank 16 in its config, above the server's ``--max-lora-rank``."""
    wide = random_adapter(tmp_path_factory.mktemp("adapters") / "wide", seed=3)
    config = json.loads((wide / "adapter_config.json").read_text())
    config["r"] = 2 * MAX_LORA_RANK  # refused by the config alone, before any weight is read
    (wide / "adapter_config.json").write_text(json.dumps(config))
    return {**served_adapters, "wide": wide}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CpuServerProcess]:
    """At most rank-8 adapters, taking a request's own chat template (a worker's ``--trust-request-chat-template``),
    with an API key."""
    settings = EngineSettings(max_lora_rank=MAX_LORA_RANK, trust_request_chat_template=True)
    with pytest.MonkeyPatch.context() as mp:  # the server and every ServingClient read these
        mp.setenv(ENV_SERVE_API_KEY, API_KEY)
        mp.setenv(ENV_ADAPTER_ROOT, str(tmp_path_factory.getbasetemp()))
        server = CpuServerProcess(
            BASE,
            settings,
            threads=1,
            log_path=tmp_path_factory.mktemp("serve") / "serve.log",
            extra_args=["--render-timeout-s", str(RENDER_TIMEOUT_S)],
        )
        server.start()
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture
def client(engine: CpuServerProcess) -> ServingClient:
    return engine.client


@pytest.fixture
def sdk(engine: CpuServerProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=engine.client.openai_base_url, api_key=API_KEY, max_retries=0)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(str(ensure_smollm2()))


async def ensure_loaded(client: ServingClient, name: str, path: Path) -> None:
    await client.load_adapter(name, str(path))
    assert name in await client.adapters()


def teacher_forced_logprobs(model: Any, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """fp32 logprobs of ``completion`` given ``prompt`` from one unpadded forward (what the trainer does)."""
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + completion])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)[len(prompt) - 1 : -1]
    return logprobs.gather(1, torch.tensor(completion).unsqueeze(1)).squeeze(1)


async def test_base_model_chat_returns_logprobs_and_token_ids(
    sdk: openai.AsyncOpenAI, tokenizer: Any
) -> None:
    messages = [{"role": "user", "content": "Say something about cats."}]
    response = await sdk.chat.completions.create(
        model=BASE,
        messages=messages,
        max_tokens=16,
        logprobs=True,
        top_logprobs=3,
        seed=0,  # type: ignore[arg-type]
    )
    assert response.model == BASE
    expected_prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    choice = Choice.model_validate(response.choices[0])  # what a rollout records: ids lifted from model_extra
    assert choice.prompt_token_ids == tokenizer(expected_prompt, add_special_tokens=False)["input_ids"]
    assert choice.prompt_token_ids == (response.model_extra or {})["prompt_token_ids"]
    assert choice.token_ids and 1 <= len(choice.token_ids) <= 16
    logprobs = choice.sampled_logprobs()
    assert logprobs is not None and len(logprobs) == len(choice.token_ids)
    assert all(lp <= 0 for lp in logprobs)
    assert choice.message["content"] == tokenizer.decode(choice.token_ids, skip_special_tokens=True)
    assert response.usage is not None and response.usage.completion_tokens == len(choice.token_ids)
    content = response.choices[0].logprobs.content  # type: ignore[union-attr]
    for token_id, entry in zip(choice.token_ids, content, strict=True):
        assert entry.token == tokenizer.decode([token_id])
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.logprob - 1e-6


async def test_logprobs_match_a_teacher_forced_forward_in_a_left_padded_mixed_batch(
    client: ServingClient, sdk: openai.AsyncOpenAI, adapters: dict[str, Path]
) -> None:
    await ensure_loaded(client, "fixed@1", adapters["fixed"])
    questions = ["Hi", "Explain, in some detail, why the sky looks blue during the day but red at sunset."]
    jobs = [(model, q) for model in (BASE, "fixed@1") for q in questions]  # lengths differ: left padding
    responses = await asyncio.gather(
        *(
            sdk.chat.completions.create(
                model=model, messages=[{"role": "user", "content": q}], max_tokens=12, logprobs=True, seed=i
            )
            for i, (model, q) in enumerate(jobs)
        )
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        base = AutoModelForCausalLM.from_pretrained(str(ensure_smollm2()), dtype=torch.float32).eval()
        policy = PeftModel.from_pretrained(base, str(adapters["fixed"])).eval()
        worst = 0.0
        for (model, _), response in zip(jobs, responses, strict=True):
            choice = Choice.model_validate(response.choices[0])
            assert choice.prompt_token_ids and choice.token_ids
            if model == BASE:
                with policy.disable_adapter():
                    expected = teacher_forced_logprobs(policy, choice.prompt_token_ids, choice.token_ids)
            else:
                expected = teacher_forced_logprobs(policy, choice.prompt_token_ids, choice.token_ids)
            served = torch.tensor(choice.sampled_logprobs())
            worst = max(worst, float((served - expected).abs().max()))
    finally:
        torch.set_num_threads(threads)
    assert worst < 1e-4, f"served logprobs differ from the teacher-forced fp32 forward by {worst:.2e}"


async def test_a_trained_adapter_changes_outputs(
    client: ServingClient, sdk: openai.AsyncOpenAI, adapters: dict[str, Path]
) -> None:
    await ensure_loaded(client, "fixed@1", adapters["fixed"])
    models = {m["id"]: m for m in await client.models()}
    assert models["fixed@1"]["parent"] == BASE and models[BASE]["parent"] is None
    for question in TRAIN_QUESTIONS[:2]:
        tuned, base = await asyncio.gather(
            *(
                sdk.chat.completions.create(model=m, messages=chat(question), max_tokens=12, temperature=0)  # type: ignore[arg-type]
                for m in ("fixed@1", BASE)
            )
        )
        assert tuned.choices[0].message.content == FIXED_ANSWER
        assert tuned.choices[0].finish_reason == "stop"
        assert (tuned.choices[0].model_extra or {})["token_ids"][-1] == 2  # EOS sampled and returned
        assert base.choices[0].message.content != FIXED_ANSWER


async def test_reload_in_place_swaps_the_weights_behind_a_name(
    client: ServingClient, sdk: openai.AsyncOpenAI, adapters: dict[str, Path]
) -> None:
    await client.unload_adapter("swap@1")
    assert await client.load_adapter("swap@1", str(adapters["random"]))
    assert await greedy(sdk, "swap@1", TRAIN_QUESTIONS[1]) != FIXED_ANSWER
    assert await client.load_adapter("swap@1", str(adapters["fixed"]), replace=True)  # vLLM's load_inplace
    assert await greedy(sdk, "swap@1", TRAIN_QUESTIONS[1]) == FIXED_ANSWER
    assert await client.unload_adapter("swap@1")


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
        extra_body={"chat_template": OWN_TEMPLATE},
    )  # fmt: skip
    expected = tokenizer.apply_chat_template(
        messages, chat_template=OWN_TEMPLATE, add_generation_prompt=True, tokenize=False
    )
    assert expected.endswith("<|im_start|>USER: Name a colour.<|im_end|>\n<|im_start|>ASSISTANT:")
    prompt_ids = Choice.model_validate(response.choices[0]).prompt_token_ids
    assert prompt_ids == tokenizer(expected, add_special_tokens=False)["input_ids"]


async def test_load_and_unload_under_32_concurrent_requests(
    client: ServingClient, sdk: openai.AsyncOpenAI, adapters: dict[str, Path]
) -> None:
    await ensure_loaded(client, "fixed@1", adapters["fixed"])
    question = chat(TRAIN_QUESTIONS[0])

    async def ask(model: str, max_tokens: int = 10) -> tuple[str, str | None, float]:
        r = await sdk.chat.completions.create(
            model=model, messages=question, max_tokens=max_tokens, temperature=0
        )  # type: ignore[arg-type]
        return r.model, r.choices[0].message.content, time.monotonic()

    _, base_answer, _ = await ask(BASE)
    first = [asyncio.create_task(ask(m, 24)) for m in ["fixed@1", BASE] * 16]
    deadline = time.monotonic() + 60
    while {m["id"]: m for m in await client.models()}["fixed@1"]["in_flight"] < 16:  # all 16 hold a lease
        assert time.monotonic() < deadline, "the requests never reached the server"
        await asyncio.sleep(0.05)
    unload = asyncio.create_task(client.unload_adapter("fixed@1"))
    assert await client.load_adapter("random@2", str(adapters["random"]))
    second = [asyncio.create_task(ask(m)) for m in ["random@2", BASE] * 4]
    assert await unload
    unloaded_at = time.monotonic()
    results = await asyncio.gather(*first, *second)  # any failed request raises here
    assert len(results) == 40
    for model, content, done_at in results[:32]:
        if model == "fixed@1":
            assert content == FIXED_ANSWER
            assert done_at <= unloaded_at  # the unload waited for every request that held the adapter
        else:
            assert model == BASE and (content or "").startswith(base_answer or "")
    _, random_answer, _ = await ask("random@2")
    assert random_answer != base_answer
    for model, content, _ in results[32:]:
        assert content == (random_answer if model == "random@2" else base_answer)
    assert "fixed@1" not in await client.adapters()
    with pytest.raises(openai.NotFoundError):
        await ask("fixed@1")


async def test_bad_input_gets_a_clear_4xx_and_the_server_keeps_serving(
    client: ServingClient, sdk: openai.AsyncOpenAI, adapters: dict[str, Path], tmp_path: Path
) -> None:
    hi = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        await sdk.chat.completions.create(model="nobody@7", messages=hi)  # type: ignore[arg-type]
    bad_bodies = [
        {"model": BASE, "messages": [{"content": "no role"}]},
        {"model": BASE, "messages": [{"role": "wizard", "content": "x"}]},
        {"model": BASE, "messages": [{"role": "user", "content": 42}]},
        {"model": BASE, "messages": []},
        {"model": BASE, "messages": hi, "temperature": -1},
        {"model": BASE, "messages": hi, "n": 0},
        {"model": BASE, "messages": hi, "max_tokens": 10_000_000},
        {"model": BASE, "messages": hi, "stream": True},
    ]
    async with httpx.AsyncClient(base_url=client.openai_base_url, headers=auth_headers(API_KEY)) as http:
        for body in bad_bodies:
            r = await http.post("/chat/completions", json=body)
            assert r.status_code == 400, (body, r.text)
            error = r.json()["error"]
            assert error["type"] == "BadRequestError" and error["message"]
        r = await http.post(
            "/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert r.status_code == 400
    with pytest.raises(ServingError) as missing:
        await client.load_adapter("ghost@1", str(tmp_path / "nowhere"))
    assert missing.value.status == 404 and "does not exist" in missing.value.message
    with pytest.raises(ServingError) as not_adapter:
        await client.load_adapter("ghost@1", str(tmp_path))
    assert not_adapter.value.status == 400 and "adapter_config.json" in not_adapter.value.message
    with pytest.raises(ServingError) as mismatch:
        await client.load_adapter(
            "ghost@1", str(adapters["random"]), sha256={"adapter_model.safetensors": "0" * 64}
        )
    assert mismatch.value.status == 400 and "sha256 mismatch" in mismatch.value.message
    with pytest.raises(ServingError) as wide:  # --max-lora-rank 8 and a rank-16 adapter
        await client.load_adapter("wide@1", str(adapters["wide"]))
    assert wide.value.status == 400 and "rank 16" in wide.value.message
    assert "ghost@1" not in await client.adapters() and "wide@1" not in await client.adapters()
    assert not await client.unload_adapter("ghost@1")
    assert await client.health()
    ok = await sdk.chat.completions.create(model=BASE, messages=hi, max_tokens=4)  # type: ignore[arg-type]
    assert ok.choices[0].finish_reason in ("stop", "length")


BAD_PARAMETERS = [
    ("seed", {"seed": 2**64}),
    ("seed", {"seed": -(2**63) - 1}),
    ("stop_token_ids", {"stop_token_ids": [10**6], "min_tokens": 2}),
    ("stop_token_ids", {"stop_token_ids": [-1]}),
    ("logit_bias", {"logit_bias": {"999999": -100}}),
    ("logit_bias", {"logit_bias": {"the": 5}}),
    ("min_tokens", {"min_tokens": 9, "max_tokens": 4}),
    ("response_format", {"response_format": {"type": "json_object"}}),
    ("frequency_penalty", {"frequency_penalty": 0.5}),
]
"""Parameters a batch cannot sample (or this server would otherwise ignore), each with the name its 400 gives."""


async def test_a_bad_request_fails_alone_with_a_400_naming_its_parameter(client: ServingClient) -> None:
    """Bad requests arriving with good ones (other runs' rollouts, the judge): each bad one gets a 400 naming
    its parameter, checked before it joins a batch, and every good one finishes as if they had not come."""
    hi = [{"role": "user", "content": "Count to twenty."}]
    good = {"model": BASE, "messages": hi, "max_tokens": 24, "ignore_eos": True, "seed": 5}
    async with httpx.AsyncClient(
        base_url=client.openai_base_url, headers=auth_headers(API_KEY), timeout=300
    ) as http:
        answers = await asyncio.gather(
            *(http.post("/chat/completions", json={**good, "seed": i}) for i in range(3)),
            *(http.post("/chat/completions", json={**good, **bad}) for _, bad in BAD_PARAMETERS),
        )
    for r in answers[:3]:
        assert r.status_code == 200, r.text
        assert len(r.json()["choices"][0]["token_ids"]) == 24
    for (param, body), r in zip(BAD_PARAMETERS, answers[3:], strict=True):
        assert r.status_code == 400, (body, r.text)
        error = r.json()["error"]
        assert error["param"] == param and param in error["message"], (body, error)


SLOW_TEMPLATE = (
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    "{% for m in messages %}{{ m['content'] }}{% endfor %}"
)
"""Ten billion loop turns: hours of Jinja, unless the server stops it."""


async def test_a_slow_chat_template_is_stopped_and_the_server_answers_meanwhile(
    client: ServingClient, sdk: openai.AsyncOpenAI
) -> None:
    """A request's own template renders off the server's event loop, within --render-timeout-s: while it
    renders the server answers its probes and other requests, and then the request gets a 400."""
    slow = asyncio.create_task(
        sdk.chat.completions.create(
            model=BASE, messages=[{"role": "user", "content": "hi"}], max_tokens=2,  # type: ignore[arg-type]
            extra_body={"chat_template": SLOW_TEMPLATE},
        )
    )  # fmt: skip
    await asyncio.sleep(0.3)  # the render has started
    assert await asyncio.wait_for(client.health(), 5)
    ok = await asyncio.wait_for(
        sdk.chat.completions.create(model=BASE, messages=[{"role": "user", "content": "hi"}], max_tokens=2),  # type: ignore[arg-type]
        60,
    )
    assert ok.choices
    with pytest.raises(openai.BadRequestError) as refused:
        await asyncio.wait_for(slow, 60)
    assert f"took over {RENDER_TIMEOUT_S:g} s" in str(refused.value)
    assert (refused.value.body or {}).get("param") == "chat_template"  # type: ignore[union-attr]
    assert await client.health()


async def test_sampling_options(sdk: openai.AsyncOpenAI) -> None:
    messages = [{"role": "user", "content": "Count from one to twenty in words."}]
    kwargs: dict[str, Any] = {"model": BASE, "messages": messages, "max_tokens": 8}
    first, again = [await sdk.chat.completions.create(n=3, seed=7, logprobs=True, **kwargs) for _ in range(2)]
    ids = [(c.model_extra or {})["token_ids"] for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert ids == [(c.model_extra or {})["token_ids"] for c in again.choices]  # a seed reproduces
    assert len({tuple(i) for i in ids}) > 1  # ... and each choice draws its own
    greedy = await sdk.chat.completions.create(temperature=0, **kwargs)
    assert (
        greedy.choices[0].finish_reason == "length"
        and len((greedy.choices[0].model_extra or {})["token_ids"]) == 8
    )
    text = greedy.choices[0].message.content or ""
    stop = text.split()[1]
    stopped = await sdk.chat.completions.create(temperature=0, stop=[stop], **kwargs)
    assert stopped.choices[0].finish_reason == "stop"
    assert stop not in (stopped.choices[0].message.content or "") and text.startswith(
        stopped.choices[0].message.content or ""
    )
    narrow = await sdk.chat.completions.create(top_p=0.05, seed=3, **kwargs)
    assert (narrow.choices[0].model_extra or {})["token_ids"] == (greedy.choices[0].model_extra or {})[
        "token_ids"
    ]
    long = await sdk.chat.completions.create(
        model=BASE, messages=messages, max_tokens=6, extra_body={"ignore_eos": True, "min_tokens": 6}
    )
    assert len((long.choices[0].model_extra or {})["token_ids"]) == 6


async def test_tools_reach_the_prompt(sdk: openai.AsyncOpenAI, tokenizer: Any) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather of a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    response = await sdk.chat.completions.create(model=BASE, messages=messages, tools=tools, max_tokens=4)  # type: ignore[arg-type]
    prompt = tokenizer.decode((response.model_extra or {})["prompt_token_ids"])
    assert "<tools>" in prompt and '"get_weather"' in prompt
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "<tool_response>\nsunny\n</tool_response>" in prompt
    # What a tool-using rollout sends (examples/tool_agent.py): tools and tool_choice "auto", answered.
    asked = await sdk.chat.completions.create(
        model=BASE, messages=chat("What is the weather in Paris? Use the tool."), tools=tools,  # type: ignore[arg-type]
        tool_choice="auto", max_tokens=48, temperature=0,
    )  # fmt: skip
    assert asked.choices[0].message.tool_calls or asked.choices[0].message.content


async def test_sleep_holds_requests_until_wake_up(client: ServingClient, sdk: openai.AsyncOpenAI) -> None:
    await client.sleep()
    assert await client.is_sleeping()
    request = asyncio.create_task(
        sdk.chat.completions.create(model=BASE, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    )
    await asyncio.sleep(0.5)
    assert not request.done()
    await client.wake_up()
    assert not await client.is_sleeping()
    assert (await asyncio.wait_for(request, 60)).choices


async def test_a_control_call_the_server_takes_and_never_answers_is_a_retryable_error(
    engine: CpuServerProcess, adapters: dict[str, Path]
) -> None:
    """A server that accepts a load and goes silent (seen once from vLLM's CPU build) must end the call with
    a 5xx ``ServingError`` that names the silence, so the reload activity retries it; then the server, woken,
    loads the adapter."""
    impatient = ServingClient(engine.base_url, timeout_s=2.0)
    assert engine.process is not None
    pid = engine.process.info.pid
    os.kill(pid, signal.SIGSTOP)  # the kernel still accepts the connection; nothing reads it
    try:
        with pytest.raises(ServingError) as silent:
            await impatient.load_adapter("silent@1", str(adapters["random"]))
    finally:
        os.kill(pid, signal.SIGCONT)
    assert silent.value.status == NO_ANSWER >= 500
    assert "stopped answering" in silent.value.message and "/v1/load_lora_adapter" in silent.value.message
    # The stopped server read the request when it woke; a retry finds the adapter loaded or loads it.
    await impatient.load_adapter("silent@1", str(adapters["random"]))
    assert "silent@1" in await impatient.adapters()
    assert await impatient.unload_adapter("silent@1")


async def test_every_endpoint_but_health_wants_the_api_key(
    engine: CpuServerProcess, sdk: openai.AsyncOpenAI, adapters: dict[str, Path]
) -> None:
    hi = {"model": BASE, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    calls = [
        ("GET", "/v1/models", None),
        ("POST", "/v1/chat/completions", hi),
        ("POST", "/v1/load_lora_adapter", {"lora_name": "sneaky@1", "lora_path": str(adapters["random"])}),
        ("POST", "/v1/unload_lora_adapter", {"lora_name": "sneaky@1"}),
        ("POST", "/sleep", None),
        ("POST", "/wake_up", None),
        ("GET", "/is_sleeping", None),
        ("GET", "/docs", None),
        ("GET", "//v1/models", None),
    ]
    for headers in ({}, auth_headers("wrong-key"), {"Authorization": API_KEY}):
        async with httpx.AsyncClient(base_url=engine.base_url, headers=headers) as http:
            for method, path, body in calls:
                r = await http.request(method, path, json=body)
                assert r.status_code == 401, (headers, path, r.text)
                assert "API key" in r.json()["error"]["message"]
            assert (await http.get("/health")).status_code == 200  # probes need no key
    no_key = ServingClient(engine.base_url, api_key="wrong-key")
    with pytest.raises(ServingError) as refused:
        await no_key.models()
    assert refused.value.status == 401
    assert "sneaky@1" not in await engine.client.adapters()  # nothing was loaded, and the server serves on
    assert not await engine.client.is_sleeping()
    ok = await sdk.chat.completions.create(**hi)  # type: ignore[call-overload]
    assert ok.choices


async def test_adapters_load_only_from_under_the_adapter_root(
    client: ServingClient, adapters: dict[str, Path], tmp_path: Path
) -> None:
    outside = Path(tempfile.mkdtemp(prefix="dgrpo-outside-"))  # not under the pytest temp root
    try:
        shutil.copytree(adapters["random"], outside / "adapter")
        (tmp_path / "link").symlink_to(outside / "adapter")
        inside = tmp_path / "inside"
        escapes = [
            str(outside / "adapter"),
            str(inside.joinpath(*[".."] * (len(inside.parts) - 1), *outside.parts[1:], "adapter")),  # ../..
            str(tmp_path / "link"),  # a link inside the root to a directory outside it
        ]
        for path in escapes:
            with pytest.raises(ServingError) as refused:
                await client.load_adapter("escape@1", path)
            assert refused.value.status == 400, path
            assert "outside this server's adapter root" in refused.value.message
            assert "--adapter-root" in refused.value.message
        assert "escape@1" not in await client.adapters()
        assert await client.load_adapter("inside@1", str(adapters["random"]))  # under the root: fine
        assert await client.unload_adapter("inside@1")
    finally:
        shutil.rmtree(outside, ignore_errors=True)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.10"])
def test_the_server_refuses_to_bind_beyond_loopback_without_an_api_key(
    host: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(ENV_SERVE_API_KEY, raising=False)
    with pytest.raises(SystemExit) as refused:
        server_main(["--model", BASE, "--host", host, "--port", "1"])
    assert refused.value.code == 2
    message = caplog.text
    assert f"--host {host} serves beyond this machine" in message
    assert "--api-key" in message and ENV_SERVE_API_KEY in message


async def test_rollouts_and_the_default_judge_send_the_servers_key(
    engine: CpuServerProcess, object_store: ObjectStore
) -> None:
    """The workers' side of ``--api-key``: with ``$DGRPO_SERVE_API_KEY`` set, a real rollout and the default
    judge reach the keyed server (a missing key would be a 401, not a result)."""
    url = engine.client.openai_base_url
    rollouts = RolloutActivities(url, object_store)  # discovers the base model's name with the key too
    task = TaskSpec(rollout="examples.arithmetic:rollout", scenarios="examples.arithmetic:scenarios")
    inp = RolloutsInput(
        run_id="keyed", step=1, model_name="agent", task=task, groups_per_step=1, group_size=2
    )
    trajectories = await ActivityEnvironment().run(rollouts.rollouts, inp)
    assert trajectories.n_trajectories == 2 and trajectories.n_exceptions == 0
    judge = JudgeActivities(object_store, url, JudgeEndpoints())
    judge_input = JudgeInput(
        run_id="keyed", step=1, trajectories=trajectories, judge=JudgeConfig(kind="ruler", max_tokens=16),
        base_model_name=BASE,
    )  # fmt: skip
    scored = await ActivityEnvironment().run(judge.judge, judge_input)
    assert scored.n_trajectories == 2


async def test_logit_bias_bans_and_forces_tokens_and_logprobs_stay_raw(
    sdk: openai.AsyncOpenAI, tokenizer: Any
) -> None:
    """As vLLM (tests/serving/test_serving_contract.py)."""
    await assert_logit_bias_bans_and_forces(sdk, tokenizer, BASE)


async def test_guided_decoding_is_refused_never_ignored(sdk: openai.AsyncOpenAI) -> None:
    """Our engine samples freely, so what vLLM would constrain (``structured_outputs``, ART's ``guided_choice``,
    as dgrpo's routed client sends it or as sent raw) gets a 400 instead of an unconstrained answer."""
    from activities.rollout_model import route_request_body

    body = {"model": BASE, "messages": chat("Pick a square."), "max_tokens": 8, "guided_choice": ["B2", "C3"]}
    routed = route_request_body(body, "/v1/chat/completions", "student", lambda: BASE)
    ask = {k: v for k, v in routed.items() if k not in ("model", "messages", "max_tokens")}
    for extra in (ask, {"guided_choice": ["B2"]}):
        with pytest.raises(openai.BadRequestError, match="not enforced by this server"):
            await sdk.chat.completions.create(
                model=BASE,
                messages=chat("Pick a square."),
                max_tokens=8,
                extra_body=extra,  # type: ignore[arg-type]
            )
