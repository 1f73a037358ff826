"""The model's own ``openai_client()`` as ART wraps it: its chat completions' cost under the active metrics
context (``set_cost_calculator``, at ART's price of a model ART prices), and the model's
``chat_template_kwargs`` sent with each request and rendered by dgrpo's server. Against a scripted
OpenAI-compatible server (tests/activities/openai_stub.py) and the server's own chat renderer; no stack."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pydantic import ValidationError
from transformers import AutoTokenizer

import dgrpo as art
from base_models.resolve import ensure_smollm2
from dgrpo.costs import MODEL_PRICING, build_cost_calculator, track_api_cost
from dgrpo.errors import UnsupportedArtOption
from dgrpo.metrics import MetricsBuilder
from serving.api import ChatCompletionRequest, ServingHTTPError
from serving.chat import ChatRenderer

sys.path.insert(0, str(Path(__file__).parents[1] / "activities"))
from openai_stub import USAGE, StubServer, openai_stub

HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture
def stub() -> StubServer:
    with openai_stub() as server:
        yield server  # type: ignore[misc]


async def test_the_models_client_records_what_its_completions_cost_and_sends_its_template_kwargs(
    stub: StubServer,
) -> None:
    model = art.TrainableModel(
        name="agent",
        project="p",
        base_model="openai/gpt-oss-20b",
        _internal_config={"chat_template_kwargs": {"enable_thinking": False}},
    )
    model.inference_base_url = stub.base_url
    model.set_cost_calculator(build_cost_calculator(MODEL_PRICING["openai/gpt-oss-20b"]))
    client = model.openai_client()
    await client.chat.completions.create(model="agent", messages=HELLO)  # no context active: not recorded
    builder = model.metrics_builder("eval")
    with builder.activate_context():
        await client.chat.completions.create(
            model="agent", messages=HELLO, extra_body={"chat_template_kwargs": {"reasoning": "low"}}
        )
        await client.with_options(timeout=30).chat.completions.create(model="agent", messages=HELLO)
    costs = {k: v for k, v in (await builder.flush()).items() if k.startswith("costs/eval")}

    prefill, sample = 0.12, 0.30  # ART's price of openai/gpt-oss-20b, USD per million tokens
    assert costs == pytest.approx(
        {
            "costs/eval/tinker_prefill": 2 * USAGE["prompt_tokens"] * prefill / 1e6,
            "costs/eval/tinker_sample": 2 * USAGE["completion_tokens"] * sample / 1e6,
            "costs/eval": 2 * (USAGE["prompt_tokens"] * prefill + USAGE["completion_tokens"] * sample) / 1e6,
        }
    )
    assert [r["chat_template_kwargs"] for r in stub.requests] == [
        {"enable_thinking": False},
        {"enable_thinking": False, "reasoning": "low"},  # the caller's keys join the model's
        {"enable_thinking": False},
    ]
    assert model.litellm_completion_params()["extra_body"] == {
        "chat_template_kwargs": {"enable_thinking": False}
    }


async def test_a_judge_at_arts_hosted_price_is_priced_without_litellm() -> None:
    @track_api_cost(source="judge", provider="openai", model_name="Qwen/Qwen3-8B")
    async def judge() -> dict[str, dict[str, int]]:
        return {"usage": {"prompt_tokens": 1000, "completion_tokens": 2000}}

    builder = MetricsBuilder("train")
    with builder.activate_context():
        await judge()
    assert (await builder.flush())["costs/train/judge"] == pytest.approx((1000 * 0.13 + 2000 * 0.40) / 1e6)


def test_the_server_renders_the_chat_template_with_the_requests_kwargs() -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(ensure_smollm2()))
    tokenizer.chat_template = (
        "{% if enable_thinking %}<think>{% endif %}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    renderer = ChatRenderer(tokenizer, max_model_len=256, default_max_tokens=8)

    def rendered(**kwargs: object) -> str:
        request = ChatCompletionRequest(model="m", messages=HELLO, **kwargs)  # type: ignore[arg-type]
        return str(tokenizer.decode(renderer.prompt_ids(request)))

    assert rendered(chat_template_kwargs={"enable_thinking": True}) == "<think>hello"
    assert rendered() == "hello"
    with pytest.raises(ValidationError, match="chat_template_kwargs may not set chat_template"):
        rendered(chat_template_kwargs={"chat_template": "{{ 'mine' }}"})  # as vLLM, untrusted by default


OWN = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}|{% endfor %}"


async def test_a_models_own_chat_template_goes_with_each_of_its_chats(
    stub: StubServer, tmp_path: Path
) -> None:
    path = tmp_path / "chat_template.jinja"
    path.write_text(OWN, encoding="utf-8")
    by_path = art.TrainableModel(
        name="agent", project="p", _internal_config={"chat_template_path": str(path)}
    )
    model = art.TrainableModel(
        name="agent", project="p", _internal_config={"chat_template": OWN, "chat_template_kwargs": {"x": 1}}
    )
    assert by_path.spec.chat_template == model.spec.chat_template == OWN  # in the spec the workers read
    assert art.TrainableModel(name="agent", project="p").spec.chat_template is None
    model.inference_base_url = stub.base_url
    await model.openai_client().chat.completions.create(model="agent", messages=HELLO)
    [request] = stub.requests
    assert (request["chat_template"], request["chat_template_kwargs"]) == (OWN, {"x": 1})
    assert model.litellm_completion_params()["extra_body"] == {
        "chat_template": OWN,
        "chat_template_kwargs": {"x": 1},
    }

    with pytest.raises(ValueError, match="Set only one of chat_template or chat_template_path"):
        art.TrainableModel(name="m", _internal_config={"chat_template": OWN, "chat_template_path": str(path)})
    with pytest.raises(ValueError, match=r"chat_template_path.*cannot read"):
        art.TrainableModel(name="m", _internal_config={"chat_template_path": str(tmp_path / "none.jinja")})
    with pytest.raises(UnsupportedArtOption, match="chat_template_content_format='openai' is not supported"):
        art.TrainableModel(name="m", _internal_config={"chat_template_content_format": "openai"})


def test_the_server_renders_a_requests_own_template_only_when_trusted() -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(ensure_smollm2()))
    request = ChatCompletionRequest(model="m", messages=HELLO, chat_template=OWN)  # type: ignore[arg-type]
    trusting = ChatRenderer(
        tokenizer, max_model_len=256, default_max_tokens=8, trust_request_chat_template=True
    )
    assert tokenizer.decode(trusting.prompt_ids(request)) == "user: hello|"
    with pytest.raises(ServingHTTPError, match="--trust-request-chat-template") as refused:
        ChatRenderer(tokenizer, max_model_len=256, default_max_tokens=8).prompt_ids(request)
    assert refused.value.status == 400
