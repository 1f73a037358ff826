"""ART's ``art.metrics``: ``MetricsBuilder``, the step-metrics accumulator, and ``track_api_cost`` (dgrpo/costs.py).

Numbers added during a step (costs, times, token and scenario counts) are summed per key until ``flush``,
which returns the step's row: the sums, the ``costs/...`` roll-ups to every parent and ``costs/all``, a
running total ``<section>/cum/...`` for each ``costs``, ``time`` and ``data`` number, the count of unique
scenarios seen, and throughput (tokens per second) from the running totals. Builders made with
``for_cost_context`` share the running totals and prices; each buffer scope (``train``, ``eval``) keeps its
own pending numbers, so a validation's costs are not logged as training's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import Token
from dataclasses import dataclass, field
from typing import Any

from dgrpo.costs import (
    ACTIVE_RECORDER,
    CostExtractor,
    CostRecorder,
    TokenPricing,
    response_cost,
    track_api_cost,
)

CUMULATIVE_SECTIONS = frozenset({"costs", "time", "data"})
"""Sections whose every number also gets a running total under ``<section>/cum/``."""
IDLE_TOTALS = {
    "throughput/step_trainer_idle_s": "throughput/cum/trainer_idle_s",
    "throughput/step_actor_idle_s": "throughput/cum/actor_idle_s",
}
THROUGHPUTS = {
    "throughput/avg_trainer_tok_per_s": ("data/cum/trainer_tokens", "time/cum/trainer_s"),
    "throughput/avg_actor_tok_per_s": ("data/cum/actor_tokens", "time/cum/actor_s"),
}
"""Throughput -> (running tokens, running seconds) it divides, reported in steps that add to either."""


def is_cumulative(key: str) -> bool:
    """``<section>/cum/...``: the running totals ``flush`` writes, never added by hand."""
    return key.split("/")[1:2] == ["cum"]


def cumulative_key(key: str) -> str:
    """``time/step_wall_s`` -> ``time/cum/wall_s``; ``costs/train/gpu`` -> ``costs/cum/train/gpu``."""
    section, rest = key.split("/", 1)
    return f"{section}/cum/{rest.removeprefix('step_')}"


@dataclass
class _Pending:
    values: dict[str, float] = field(default_factory=dict)
    scenario_ids: set[str] = field(default_factory=set)


@dataclass
class _Shared:
    """What every builder of one model shares: running totals, prices and each scope's pending numbers."""

    totals: dict[str, float] = field(default_factory=dict)
    scenario_ids: set[str] = field(default_factory=set)
    pending: dict[str, _Pending] = field(default_factory=dict)
    extractors: dict[str, CostExtractor] = field(default_factory=dict)
    pricing: dict[str, TokenPricing] = field(default_factory=dict)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    throughputs: dict[str, tuple[str, str]] = field(default_factory=lambda: dict(THROUGHPUTS))
    idle_totals: dict[str, str] = field(default_factory=lambda: dict(IDLE_TOTALS))


class MetricsBuilder:
    """A step's metrics, added as they happen and flushed once per logged step (module doc)."""

    def __init__(
        self,
        cost_context: str,
        *,
        buffer_scope: str | None = None,
        _shared: _Shared | None = None,
        throughputs: dict[str, tuple[str, str]] | None = None,
        idle_totals: bool = True,
    ) -> None:
        """``throughputs`` (throughput -> running tokens and seconds it divides) and ``idle_totals`` (keep
        ``throughput/cum/*_idle_s``): ART 0.5.18's by default; ``model.log``'s 0.5.23 files give 0.5.23's
        (dgrpo/model_log/dialect.py)."""
        if not cost_context.strip():
            raise ValueError("cost_context must be non-empty")
        self.cost_context = cost_context.strip()
        self.buffer_scope = buffer_scope or self.cost_context
        self._shared = _shared or _Shared()
        if throughputs is not None:
            self._shared.throughputs = dict(throughputs)
        if not idle_totals:
            self._shared.idle_totals = {}

    # ---- adding numbers ---------------------------------------------------------------------------------
    def add_metric(self, key: str, value: float) -> None:
        """Add ``value`` to ``key`` (``<section>/<name>``) for this step."""
        if "/" not in key:
            raise ValueError(f"metric key {key!r} must start with a section: '<section>/<name>'")
        if is_cumulative(key):
            raise ValueError(f"metric key {key!r} is in the cumulative namespace flush() writes")
        values = self._pending().values
        for other in values:
            if other.startswith(f"{key}/") or key.startswith(f"{other}/"):
                raise ValueError(f"{key!r} and {other!r} cannot both be leaves: one is the other's parent")
        values[key] = values.get(key, 0.0) + float(value)

    def add_cost(self, path: str, usd: float) -> None:
        """Add ``usd`` to ``costs/<path>``."""
        if not path.strip("/"):
            raise ValueError("cost path must be non-empty")
        self.add_metric(f"costs/{path.strip('/')}", usd)

    def add_response_cost(
        self, source: str, response: Any, *, provider: str, model_name: str, **prices: Any
    ) -> float:
        """Add what ``response`` cost (dgrpo.costs says how it is found) to ``costs/<context>/<source>``."""
        if not source.strip("/"):
            raise ValueError("source must be non-empty")
        cost = response_cost(
            response,
            provider=provider.strip().lower(),
            model_name=model_name.strip(),
            extractors=self._shared.extractors,
            registered=self._shared.pricing,
            **prices,
        )
        self.add_cost(f"{self.cost_context}/{source.strip('/')}", cost)
        return cost

    def add_data(
        self,
        step_num_scenarios: int | None = None,
        step_actor_tokens: int | None = None,
        scenario_ids: list[str] | None = None,
    ) -> None:
        for key, value in (
            ("data/step_num_scenarios", step_num_scenarios),
            ("data/step_actor_tokens", step_actor_tokens),
        ):
            if value is not None:
                self.add_metric(key, value)
        self._pending().scenario_ids.update(str(s) for s in scenario_ids or ())

    def add_user_timing(
        self,
        step_wall_s: float | None = None,
        step_actor_s: float | None = None,
        step_eval_s: float | None = None,
    ) -> None:
        for key, value in (
            ("time/step_wall_s", step_wall_s),
            ("time/step_actor_s", step_actor_s),
            ("time/step_eval_s", step_eval_s),
        ):
            if value is not None:
                self.add_metric(key, value)

    def add_idle_times(
        self, step_trainer_idle_s: float | None = None, step_actor_idle_s: float | None = None
    ) -> None:
        for key, value in (
            ("throughput/step_trainer_idle_s", step_trainer_idle_s),
            ("throughput/step_actor_idle_s", step_actor_idle_s),
        ):
            if value is not None:
                self.add_metric(key, value)

    @contextmanager
    def measure(self, key: str) -> Iterator[None]:
        """Add the block's wall seconds to ``key``."""
        started = time.monotonic()
        try:
            yield
        finally:
            self.add_metric(key, time.monotonic() - started)

    def pending(self) -> tuple[dict[str, float], frozenset[str]]:
        """A copy of this scope's numbers and scenario ids added since the last flush (what ``flush`` will sum)."""
        pending = self._pending()
        return dict(pending.values), frozenset(pending.scenario_ids)

    # ---- the step's row ---------------------------------------------------------------------------------
    async def flush(self) -> dict[str, float]:
        """This scope's numbers since the last flush, with roll-ups, running totals and throughput; the
        pending numbers start again from nothing. A step that added nothing flushes ``{}``."""
        async with self._shared.lock:
            pending = self._pending()
            row = dict(pending.values)
            costs = {k: v for k, v in row.items() if k.startswith("costs/")}
            for key, value in costs.items():
                parts = key.split("/")
                for depth in range(2, len(parts)):
                    parent = "/".join(parts[:depth])
                    row[parent] = row.get(parent, 0.0) + value
            if costs:
                row["costs/all"] = sum(costs.values())
            totals = self._shared.totals
            for key, value in list(row.items()):
                if key.split("/", 1)[0] in CUMULATIVE_SECTIONS:
                    total = cumulative_key(key)
                    totals[total] = row[total] = totals.get(total, 0.0) + value
            for key, total in self._shared.idle_totals.items():
                if key in row:
                    totals[total] = row[total] = totals.get(total, 0.0) + row[key]
            for key, (tokens, seconds) in self._shared.throughputs.items():
                if (tokens in row or seconds in row) and totals.get(seconds, 0.0) > 0 and tokens in totals:
                    row[key] = totals[tokens] / totals[seconds]
            if pending.scenario_ids:
                self._shared.scenario_ids |= pending.scenario_ids
                row["data/cum/num_unique_scenarios"] = float(len(self._shared.scenario_ids))
            self._shared.pending.pop(self.buffer_scope, None)
            return row

    # ---- contexts -----------------------------------------------------------------------------------------
    def for_cost_context(self, cost_context: str, *, buffer_scope: str | None = None) -> MetricsBuilder:
        """A builder charging ``costs/<cost_context>/...``, sharing this one's totals and prices."""
        context = cost_context.strip()
        scope = (buffer_scope if buffer_scope is not None else context).strip()
        if not context or not scope:
            raise ValueError("cost_context and buffer_scope must be non-empty")
        if (context, scope) == (self.cost_context, self.buffer_scope):
            return self
        return MetricsBuilder(context, buffer_scope=scope, _shared=self._shared)

    def activate(self) -> Token[CostRecorder]:
        """Make this the builder ``track_api_cost`` records into; ``token.var.reset(token)`` undoes it."""
        return ACTIVE_RECORDER.set(self)

    @contextmanager
    def activate_context(self) -> Iterator[MetricsBuilder]:
        token = self.activate()
        try:
            yield self
        finally:
            ACTIVE_RECORDER.reset(token)

    @staticmethod
    def get_active() -> MetricsBuilder:
        """The active builder; LookupError when none is (as a ContextVar says)."""
        active = ACTIVE_RECORDER.get()
        if not isinstance(active, MetricsBuilder):
            raise LookupError(f"the active cost recorder is a {type(active).__name__}, not a MetricsBuilder")
        return active

    # ---- prices -------------------------------------------------------------------------------------------
    def register_cost_extractor(self, provider: str, extractor: CostExtractor) -> None:
        if not provider.strip():
            raise ValueError("provider must be non-empty")
        self._shared.extractors[provider.strip().lower()] = extractor

    def register_model_pricing(
        self,
        model_name: str,
        *,
        prompt_per_million: float,
        completion_per_million: float,
        cached_prompt_per_million: float | None = None,
        cache_creation_per_million: float | None = None,
        cache_read_per_million: float | None = None,
    ) -> None:
        if not model_name.strip():
            raise ValueError("model_name must be non-empty")
        self._shared.pricing[model_name.strip()] = TokenPricing(
            prompt_per_million, completion_per_million, cached_prompt_per_million, cache_creation_per_million,
            cache_read_per_million,
        )  # fmt: skip

    # ---- resuming -----------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The running totals and unique scenarios, JSON-ready (pending numbers are not kept)."""
        return {
            "cum_state": dict(self._shared.totals),
            "unique_scenario_ids": sorted(self._shared.scenario_ids),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._shared.totals = {str(k): float(v) for k, v in state.get("cum_state", {}).items()}
        self._shared.scenario_ids = {str(s) for s in state.get("unique_scenario_ids", [])}
        self._shared.pending.clear()

    def _pending(self) -> _Pending:
        return self._shared.pending.setdefault(self.buffer_scope, _Pending())


__all__ = ["MetricsBuilder", "track_api_cost"]
