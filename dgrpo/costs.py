"""ART's ``art.costs``: what API calls cost, as ``costs/...`` metrics.

    @track_api_cost(source="llm_judge/correctness", provider="openai", model_name="openai/gpt-4.1")
    async def judge(...) -> ChatCompletion: ...

    token = model.activate_metrics_context("train")   # or a MetricsBuilder's activate()
    await judge(...)                                  # its cost lands in costs/train/llm_judge/correctness
    await model.log(groups, split="train")            # logs it (and costs/train, costs/all, costs/cum/...)

A response's cost is, in order: the cost the provider reported (``usage.cost``, ``usage.model_extra["cost"]``,
litellm's response-cost header), a registered extractor for the provider, or its token counts (OpenAI's
``prompt_tokens``/``cached_tokens``/``completion_tokens``, Anthropic's ``input``/``output``/cache tokens)
times a price: given to the decorator, registered on the builder, listed in ``MODEL_TOKEN_PRICING`` or
``MODEL_PRICING``, or litellm's price table when litellm is installed. A call with no price is an error,
not a silent zero. dgrpo's own inference runs on the operator's hardware and has no price list.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any, ParamSpec, Protocol, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

CostExtractor = Callable[[Any], float | None]
"""A provider's own reading of a response's cost in USD (None: estimate from the tokens)."""


@dataclass(frozen=True)
class ModelPricing:
    """USD per million tokens of a model served for training (ART's hosted-service prices)."""

    prefill: float
    sample: float
    train: float


@dataclass(frozen=True)
class TokenPricing:
    """USD per million tokens of an API model; cache prices default to the prompt price."""

    prompt_per_million: float
    completion_per_million: float
    cached_prompt_per_million: float | None = None
    cache_creation_per_million: float | None = None
    cache_read_per_million: float | None = None


HOSTED_PRICES: tuple[tuple[str, float, float, float], ...] = (
    ("Qwen/Qwen3.6-35B-A3B", 0.36, 0.89, 1.07),
    ("Qwen/Qwen3.6-27B", 1.24, 3.73, 3.73),
    ("Qwen/Qwen3.5-4B", 0.22, 0.67, 0.67),
    ("Qwen/Qwen3.5-27B", 1.24, 3.73, 3.73),
    ("Qwen/Qwen3.5-35B-A3B", 0.36, 0.89, 1.07),
    ("Qwen/Qwen3.5-397B-A17B", 2.00, 5.00, 6.00),
    ("Qwen/Qwen3.5-397B-A17B:peft:262144", 4.00, 10.00, 12.00),
    ("Qwen/Qwen3-4B-Instruct-2507", 0.07, 0.22, 0.22),
    ("Qwen/Qwen3-8B", 0.13, 0.40, 0.40),
    ("Qwen/Qwen3-8B-Base", 0.13, 0.40, 0.40),
    ("Qwen/Qwen3-30B-A3B", 0.12, 0.30, 0.36),
    ("Qwen/Qwen3-30B-A3B-Base", 0.12, 0.30, 0.36),
    ("Qwen/Qwen3-30B-A3B-Instruct-2507", 0.12, 0.30, 0.36),
    ("Qwen/Qwen3-32B", 0.49, 1.47, 1.47),
    ("Qwen/Qwen3-235B-A22B-Instruct-2507", 0.68, 1.70, 2.04),
    ("Qwen/Qwen3-VL-30B-A3B-Instruct", 0.18, 0.44, 0.53),
    ("Qwen/Qwen3-VL-235B-A22B-Instruct", 1.02, 2.56, 3.07),
    ("meta-llama/Llama-3.2-1B", 0.03, 0.09, 0.09),
    ("meta-llama/Llama-3.2-3B", 0.06, 0.18, 0.18),
    ("meta-llama/Llama-3.1-8B", 0.13, 0.40, 0.40),
    ("meta-llama/Llama-3.1-8B-Instruct", 0.13, 0.40, 0.40),
    ("meta-llama/Llama-3.1-70B", 1.05, 3.16, 3.16),
    ("meta-llama/Llama-3.3-70B-Instruct", 1.05, 3.16, 3.16),
    ("deepseek-ai/DeepSeek-V3.1", 1.13, 2.81, 3.38),
    ("deepseek-ai/DeepSeek-V3.1-Base", 1.13, 2.81, 3.38),
    ("openai/gpt-oss-120b", 0.18, 0.44, 0.52),
    ("openai/gpt-oss-120b:peft:131072", 0.63, 1.54, 1.82),
    ("openai/gpt-oss-20b", 0.12, 0.30, 0.36),
    ("moonshotai/Kimi-K2-Thinking", 0.98, 2.44, 2.93),
    ("moonshotai/Kimi-K2.5", 1.47, 3.66, 4.40),
    ("moonshotai/Kimi-K2.5:peft:131072", 5.15, 12.81, 15.40),
    ("moonshotai/Kimi-K2.6", 1.47, 3.66, 4.40),
    ("moonshotai/Kimi-K2.6:peft:131072", 5.15, 12.81, 15.40),
    ("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", 0.13, 0.33, 0.40),
    ("nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16", 0.38, 0.96, 1.16),
    ("nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16:peft:262144", 0.76, 1.92, 2.32),
)
"""ART 0.5.18's list prices (USD per million tokens: prefill, sample, train) of the models its hosted
training service serves; ``<model>:peft:<context>`` is the long-context LoRA tier."""

MODEL_PRICING: dict[str, ModelPricing] = {
    name: ModelPricing(prefill, sample, train) for name, prefill, sample, train in HOSTED_PRICES
}
"""ART's prices of served models by name: ``track_api_cost`` prices such a model by them when litellm has no
price for it, and ``build_cost_calculator`` makes them a model client's costs. dgrpo's own inference runs on
its operator's hardware, so no dgrpo backend gives a model a cost calculator by itself."""

MODEL_TOKEN_PRICING: dict[str, TokenPricing] = {
    "openai/gpt-4.1": TokenPricing(2.0, 8.0, cached_prompt_per_million=0.5),
    "anthropic/claude-sonnet-4-6": TokenPricing(
        3.0, 15.0, cache_creation_per_million=3.75, cache_read_per_million=0.30
    ),
}
"""API list prices of judge models (USD per million tokens)."""


def get_model_pricing(model_name: str | None, *, strict: bool = False) -> ModelPricing | None:
    """``MODEL_PRICING[model_name]``, or None (``strict``: a ValueError naming the table)."""
    pricing = MODEL_PRICING.get(model_name) if model_name else None
    if pricing is None and strict:
        raise ValueError(
            f"No pricing configured for model {model_name!r}: add it to dgrpo.costs.MODEL_PRICING"
        )
    return pricing


def tokens_to_cost(num_tokens: float, price_per_million: float) -> float:
    return float(num_tokens) * price_per_million / 1_000_000


def compute_sample_costs(
    *, prompt_tokens: int | None, completion_tokens: int | None, cost_context: str, pricing: ModelPricing
) -> dict[str, float]:
    """One inference call's prompt and sampling costs under ART's leaf names
    (``costs/<context>/tinker_prefill``, ``costs/<context>/tinker_sample``)."""
    context = cost_context.strip("/")
    if not context:
        raise ValueError("cost_context must be non-empty")
    return {
        f"costs/{context}/tinker_prefill": tokens_to_cost(prompt_tokens or 0, pricing.prefill),
        f"costs/{context}/tinker_sample": tokens_to_cost(completion_tokens or 0, pricing.sample),
    }


def build_cost_calculator(pricing: ModelPricing) -> CostCalculator:
    """``compute_sample_costs`` with ``pricing`` bound: ``(prompt_tokens, completion_tokens, context)``."""

    def calculate(
        prompt_tokens: int | None, completion_tokens: int | None, cost_context: str
    ) -> dict[str, float]:
        return compute_sample_costs(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cost_context=cost_context,
            pricing=pricing,
        )

    return calculate


CostCalculator = Callable[[int | None, int | None, str], dict[str, float]]
"""``(prompt_tokens, completion_tokens, cost_context)`` -> ``costs/<context>/...`` metrics (ART's)."""


# ---- a response's cost ---------------------------------------------------------------------------------
def _field(container: Any, *path: str) -> Any:
    for name in path:
        if container is None:
            return None
        container = container.get(name) if isinstance(container, Mapping) else getattr(container, name, None)
    return container


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _cost(value: Any) -> float | None:
    """A reported cost: a number, or an object with ``total_cost``."""
    number = _number(value)
    return number if number is not None else _number(_field(value, "total_cost"))


def reported_cost(response: Any) -> float | None:
    """The cost the provider (or a router such as OpenRouter, or litellm) reported with the response."""
    usage = _field(response, "usage")
    for found in (
        _cost(_field(usage, "cost")),
        _cost(_field(usage, "model_extra", "cost")),
        _cost(
            _field(response, "_hidden_params", "additional_headers", "llm_provider-x-litellm-response-cost")
        ),
    ):
        if found is not None:
            return found
    return None


def _tokens(usage: Any, *path: str) -> float:
    return _number(_field(usage, *path)) or 0.0


def sampled_tokens(response: Any) -> tuple[int, int]:
    """A chat completion's prompt tokens, once per choice (each sample is its own prefill, as ART counts
    them), and its completion tokens; 0 where the response reports no usage (a stream)."""
    usage = _field(response, "usage")
    choices = _field(response, "choices") or []
    return int(_tokens(usage, "prompt_tokens")) * max(len(choices), 1), int(
        _tokens(usage, "completion_tokens")
    )


def estimated_cost(provider: str, response: Any, pricing: TokenPricing) -> float | None:
    """The response's token counts times ``pricing``; None when its usage is not the provider's shape."""
    usage = _field(response, "usage")
    prompt_price = pricing.prompt_per_million
    if provider == "openai":
        if all(_field(usage, f) is None for f in ("prompt_tokens", "completion_tokens")):
            return None
        prompt = _tokens(usage, "prompt_tokens")
        cached = min(_tokens(usage, "prompt_tokens_details", "cached_tokens"), prompt)
        cached_price = pricing.cached_prompt_per_million
        return (
            tokens_to_cost(prompt - cached, prompt_price)
            + tokens_to_cost(cached, prompt_price if cached_price is None else cached_price)
            + tokens_to_cost(_tokens(usage, "completion_tokens"), pricing.completion_per_million)
        )
    if provider == "anthropic":
        if all(_field(usage, f) is None for f in ("input_tokens", "output_tokens")):
            return None
        creation, read = pricing.cache_creation_per_million, pricing.cache_read_per_million
        return (
            tokens_to_cost(_tokens(usage, "input_tokens"), prompt_price)
            + tokens_to_cost(
                _tokens(usage, "cache_creation_input_tokens"), prompt_price if creation is None else creation
            )
            + tokens_to_cost(
                _tokens(usage, "cache_read_input_tokens"), prompt_price if read is None else read
            )
            + tokens_to_cost(_tokens(usage, "output_tokens"), pricing.completion_per_million)
        )
    return None


def _litellm_pricing(model_name: str) -> TokenPricing | None:
    """litellm's price table, when litellm is installed and knows the model."""
    try:
        from litellm import get_model_info  # optional: not a dgrpo dependency

        info = get_model_info(model_name)
    except Exception:  # not installed, or an unknown model: no price from here
        return None
    per_million = {k: _number(info.get(k)) for k in info} if isinstance(info, Mapping) else {}
    prompt, completion = per_million.get("input_cost_per_token"), per_million.get("output_cost_per_token")
    if prompt is None or completion is None:
        return None
    read = per_million.get("cache_read_input_token_cost")
    creation = per_million.get("cache_creation_input_token_cost")
    return TokenPricing(
        prompt * 1e6,
        completion * 1e6,
        cached_prompt_per_million=None if read is None else read * 1e6,
        cache_creation_per_million=None if creation is None else creation * 1e6,
        cache_read_per_million=None if read is None else read * 1e6,
    )


PRICE_ARGUMENTS = {
    "prompt_price_per_million": "prompt_per_million",
    "completion_price_per_million": "completion_per_million",
    "cached_prompt_price_per_million": "cached_prompt_per_million",
    "cache_creation_price_per_million": "cache_creation_per_million",
    "cache_read_price_per_million": "cache_read_per_million",
}
"""``track_api_cost``'s price arguments -> ``TokenPricing`` fields."""


def token_pricing(
    model_name: str, registered: Mapping[str, TokenPricing], explicit: Mapping[str, float | None]
) -> TokenPricing:
    """The model's price: ``registered``, then ``MODEL_TOKEN_PRICING``, litellm's table, ``MODEL_PRICING``;
    each price argument given (``prompt_price_per_million=...``) overrides its part."""
    served = get_model_pricing(model_name)
    base = (
        registered.get(model_name)
        or MODEL_TOKEN_PRICING.get(model_name)
        or _litellm_pricing(model_name)
        or (TokenPricing(served.prefill, served.sample) if served is not None else None)
    )
    unknown = set(explicit) - set(PRICE_ARGUMENTS)
    if unknown:
        raise TypeError(f"unknown price arguments: {sorted(unknown)}")
    given = {PRICE_ARGUMENTS[k]: float(v) for k, v in explicit.items() if v is not None}
    if base is None:
        if {"prompt_per_million", "completion_per_million"} <= set(given):
            return TokenPricing(**given)
        raise ValueError(
            f"No pricing configured for model {model_name!r}: pass prompt_price_per_million= and "
            "completion_price_per_million= to track_api_cost, register it with "
            "MetricsBuilder.register_model_pricing(), or add it to dgrpo.costs.MODEL_TOKEN_PRICING"
        )
    return replace(base, **given)


def response_cost(
    response: Any,
    *,
    provider: str,
    model_name: str,
    extractors: Mapping[str, CostExtractor],
    registered: Mapping[str, TokenPricing],
    **explicit_prices: float | None,
) -> float:
    """The response's cost in USD (the module doc says how it is found); a ValueError when it cannot be."""
    reported = reported_cost(response)
    if reported is not None:
        return reported
    extractor = extractors.get(provider)
    if extractor is not None and (custom := extractor(response)) is not None:
        return float(custom)
    pricing = token_pricing(model_name, registered, explicit_prices)
    estimated = estimated_cost(provider, response, pricing)
    if estimated is None:
        raise ValueError(
            f"cannot price a {type(response).__name__} from provider {provider!r}: its usage is not the "
            "provider's (openai: prompt/completion tokens; anthropic: input/output tokens); pass the right "
            "provider, or register a cost extractor for it (MetricsBuilder.register_cost_extractor)"
        )
    return estimated


# ---- recording a decorated call's cost ------------------------------------------------------------------
class CostRecorder(Protocol):
    """What ``track_api_cost`` records into: the active ``MetricsBuilder``."""

    def add_response_cost(
        self, source: str, response: Any, *, provider: str, model_name: str, **prices: Any
    ) -> Any: ...


ACTIVE_RECORDER: ContextVar[CostRecorder] = ContextVar("dgrpo_active_metrics_builder")
"""The builder ``MetricsBuilder.activate()`` made current (in this task and the tasks it starts)."""


def _name(value: str, what: str, strip: str | None = None) -> str:
    name = value.strip(strip).strip() if strip else value.strip()
    if not name:
        raise ValueError(f"{what} must be non-empty")
    return name


def track_api_cost(
    *,
    source: str,
    provider: str,
    model_name: str,
    response_getter: Callable[[Any], Any] | None = None,
    prompt_price_per_million: float | None = None,
    completion_price_per_million: float | None = None,
    cached_prompt_price_per_million: float | None = None,
    cache_creation_price_per_million: float | None = None,
    cache_read_price_per_million: float | None = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Record what each call of the decorated function (sync or async) cost, as
    ``costs/<builder's context>/<source>``, into the active ``MetricsBuilder``; with none active it
    records nothing. ``response_getter`` picks the API response out of the function's result."""
    where = _name(source, "source", "/")
    who = _name(provider, "provider").lower()
    model = _name(model_name, "model_name")
    prices = {
        "prompt_price_per_million": prompt_price_per_million,
        "completion_price_per_million": completion_price_per_million,
        "cached_prompt_price_per_million": cached_prompt_price_per_million,
        "cache_creation_price_per_million": cache_creation_price_per_million,
        "cache_read_price_per_million": cache_read_price_per_million,
    }

    def record(result: Any) -> None:
        recorder = ACTIVE_RECORDER.get(None)
        if recorder is not None:
            response = result if response_getter is None else response_getter(result)
            recorder.add_response_cost(where, response, provider=who, model_name=model, **prices)

    def decorate(func: Callable[P, R]) -> Callable[P, R]:
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def tracked_async(*args: P.args, **kwargs: P.kwargs) -> Any:
                result = await func(*args, **kwargs)
                record(result)
                return result

            return tracked_async  # type: ignore[return-value]

        @functools.wraps(func)
        def tracked(*args: P.args, **kwargs: P.kwargs) -> R:
            result = func(*args, **kwargs)
            record(result)
            return result

        return tracked

    return decorate


__all__ = [
    "MODEL_PRICING",
    "MODEL_TOKEN_PRICING",
    "CostCalculator",
    "ModelPricing",
    "TokenPricing",
    "build_cost_calculator",
    "compute_sample_costs",
    "get_model_pricing",
    "response_cost",
    "tokens_to_cost",
    "track_api_cost",
]
