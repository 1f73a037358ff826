"""``dgrpo.costs``: what an API call cost, recorded by ``track_api_cost`` and logged by ``model.log``."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import dgrpo as art
from activities.object_store import ObjectStore
from activities.retention import metrics_by_step
from dgrpo.costs import ModelPricing, compute_sample_costs, track_api_cost
from dgrpo.metrics import MetricsBuilder


def openai_response(prompt: int, completion: int, cached: int = 0, **usage: Any) -> SimpleNamespace:
    details = SimpleNamespace(cached_tokens=cached)
    return SimpleNamespace(
        usage=SimpleNamespace(
            prompt_tokens=prompt, completion_tokens=completion, prompt_tokens_details=details, **usage
        )
    )


def anthropic_response(inputs: int, outputs: int, creation: int = 0, read: int = 0) -> dict[str, Any]:
    return {
        "usage": {
            "input_tokens": inputs,
            "output_tokens": outputs,
            "cache_creation_input_tokens": creation,
            "cache_read_input_tokens": read,
        }
    }


async def costs_of(builder: MetricsBuilder, call: Any) -> dict[str, float]:
    with builder.activate_context():
        result = call()
        if hasattr(result, "__await__"):
            await result
    return {k: v for k, v in (await builder.flush()).items() if k.startswith("costs/")}


async def test_token_counts_times_the_prices_given_registered_or_listed() -> None:
    @track_api_cost(source="judge/a", provider="openai", model_name="some/judge", prompt_price_per_million=1.0,
                    completion_price_per_million=2.0)  # fmt: skip
    async def explicit() -> Any:
        return openai_response(100, 50, cached=40)  # no cached price: cached tokens cost the prompt price

    @track_api_cost(source="judge/b", provider="openai", model_name="openai/gpt-4.1")
    def listed() -> Any:  # a plain function works too
        return openai_response(1000, 100, cached=800)

    @track_api_cost(
        source="judge/c", provider="anthropic", model_name="mine/claude", response_getter=lambda r: r[1]
    )
    async def registered() -> Any:
        return ("other", anthropic_response(400, 600, creation=100, read=1000))

    builder = MetricsBuilder("train")
    builder.register_model_pricing(
        "mine/claude", prompt_per_million=1.5, completion_per_million=2.5, cache_read_per_million=0.1
    )
    assert (await costs_of(builder, explicit))["costs/train/judge/a"] == pytest.approx(0.0002)
    assert (await costs_of(builder, listed))["costs/train/judge/b"] == pytest.approx(
        (200 * 2.0 + 800 * 0.5 + 100 * 8.0) / 1e6
    )
    assert (await costs_of(builder, registered))["costs/train/judge/c"] == pytest.approx(
        (400 * 1.5 + 100 * 1.5 + 1000 * 0.1 + 600 * 2.5) / 1e6
    )


async def test_a_reported_cost_or_an_extractor_comes_before_the_tokens() -> None:
    @track_api_cost(source="router", provider="openrouter", model_name="openrouter/any")
    async def reported() -> Any:
        return openai_response(100, 50, cost=1.5e-5)

    @track_api_cost(source="extra", provider="openrouter", model_name="openrouter/any")
    async def in_model_extra() -> Any:
        return openai_response(100, 50, model_extra={"cost": 2.5e-5})

    @track_api_cost(source="custom", provider="openai", model_name="openai/gpt-4.1")
    async def custom() -> Any:
        return openai_response(1, 1)

    builder = MetricsBuilder("eval")
    builder.register_cost_extractor("OpenAI", lambda _response: 0.75)
    assert (await costs_of(builder, reported))["costs/eval/router"] == pytest.approx(1.5e-5)
    assert (await costs_of(builder, in_model_extra))["costs/eval/extra"] == pytest.approx(2.5e-5)
    assert (await costs_of(builder, custom))["costs/eval/custom"] == 0.75


async def test_an_unpriced_call_is_an_error_and_no_active_builder_records_nothing() -> None:
    @track_api_cost(source="judge", provider="openai", model_name="nobody/prices-this")
    async def unpriced() -> Any:
        return openai_response(10, 20)

    assert (await unpriced()).usage.prompt_tokens == 10  # no builder is active: nothing recorded, no error
    with pytest.raises(ValueError, match="No pricing configured for model 'nobody/prices-this'"):
        await costs_of(MetricsBuilder("train"), unpriced)
    with pytest.raises(ValueError, match="source must be non-empty"):
        track_api_cost(source="/", provider="openai", model_name="m")


def test_sample_costs_use_arts_leaf_names() -> None:
    pricing = ModelPricing(prefill=0.12, sample=0.30, train=0.36)
    assert compute_sample_costs(
        prompt_tokens=1000, completion_tokens=2000, cost_context="train", pricing=pricing
    ) == pytest.approx({"costs/train/tinker_prefill": 0.00012, "costs/train/tinker_sample": 0.0006})


class StoreOnlyBackend(art.TemporalBackend):
    """The real object store, no workers: all ``model.log`` needs."""

    async def start(self) -> None:
        return None


async def test_model_log_writes_each_splits_costs_at_its_step(
    object_store: ObjectStore, tmp_path: Path
) -> None:
    @track_api_cost(source="judge", provider="openai", model_name="j", prompt_price_per_million=1.0,
                    completion_price_per_million=2.0)  # fmt: skip
    async def judge() -> Any:
        return openai_response(100, 50)

    model = art.Model(name="costs", project="p", base_path=str(tmp_path), report_metrics=[])
    await model.register(StoreOnlyBackend(s3=object_store.settings))
    token = model.activate_metrics_context("train")
    await judge()
    token.var.reset(token)
    token = model.activate_metrics_context("eval")
    await judge()
    await judge()
    token.var.reset(token)
    await model.log(split="val", step=1, metrics={})  # the eval costs only
    await model.log(split="train", step=2, metrics={})
    rows = metrics_by_step(object_store, model.run_id)
    assert rows[1]["costs/eval/judge"] == pytest.approx(0.0004) and rows[1].get("costs/train/judge") is None
    assert rows[2]["costs/train/judge"] == pytest.approx(0.0002)
    assert rows[2]["costs/cum/all"] == pytest.approx(0.0006)
