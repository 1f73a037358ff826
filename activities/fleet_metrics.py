"""dgrpo's own worker metrics, on the Temporal SDK's metric meter: one Prometheus endpoint per worker serves them
beside the SDK's (task slots, schedule-to-start latency, poll failures).

The worker sets the process's default Temporal runtime to one with a Prometheus exporter before anything here is
used (``workers/telemetry.py``); without one (a test, a client) the meter is the SDK's no-op. Counters end in
``_total``; a rate is Prometheus's ``rate()`` of a counter (generated and trained tokens per second).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from temporalio.common import MetricCounter, MetricGauge
from temporalio.runtime import Runtime

from schemas.trajectory import Choice, Trajectory


class FleetMetrics:
    """Every instrument dgrpo adds, named once."""

    def __init__(self) -> None:
        meter = Runtime.default().metric_meter
        self.steps_served: MetricCounter = meter.create_counter(
            "dgrpo_steps_served_total",
            "checkpoints loaded into this worker's inference servers (reloads done)",
        )
        self.rollouts_in_flight: MetricGauge = meter.create_gauge(
            "dgrpo_rollouts_in_flight", "rollouts (one trajectory each) running on this worker now"
        )
        self.rollouts: MetricCounter = meter.create_counter(
            "dgrpo_rollouts_total", "rollouts finished, by outcome (ok, error)"
        )
        self.generated_tokens: MetricCounter = meter.create_counter(
            "dgrpo_generated_tokens_total", "tokens the policy sampled in finished rollouts"
        )
        self.trained_tokens: MetricCounter = meter.create_counter(
            "dgrpo_trained_tokens_total", "trainable tokens of the steps this worker trained"
        )
        self.adapter_loads: MetricCounter = meter.create_counter(
            "dgrpo_adapter_loads_total", "LoRA adapters loaded into an inference server"
        )
        self.adapter_unloads: MetricCounter = meter.create_counter(
            "dgrpo_adapter_unloads_total", "LoRA adapters unloaded from an inference server"
        )
        self.engine_restarts: MetricCounter = meter.create_counter(
            "dgrpo_engine_restarts_total", "inference servers started again after dying or hanging"
        )
        self.oom_halvings: MetricCounter = meter.create_counter(
            "dgrpo_oom_halvings_total",
            "training attempts that halved the micro-batch after running out of memory",
        )
        self.stage_retries: MetricCounter = meter.create_counter(
            "dgrpo_stage_retries_total", "activity attempts after the first, by stage"
        )
        self.stages_in_flight: MetricGauge = meter.create_gauge(
            "dgrpo_stages_in_flight", "activities running on this worker now, by stage"
        )
        self._rollouts_running = 0
        self._stages_running: dict[str, int] = {}

    def rollout_started(self) -> None:
        self._rollouts_running += 1
        self.rollouts_in_flight.set(self._rollouts_running)

    def rollout_ended(self, trajectory: Trajectory | None) -> None:
        """One rollout done: its trajectory, or None when it failed."""
        self._rollouts_running -= 1
        self.rollouts_in_flight.set(self._rollouts_running)
        self.rollouts.add(1, {"outcome": "ok" if trajectory is not None else "error"})
        if trajectory is not None:
            self.generated_tokens.add(sampled_tokens(trajectory.messages_and_choices))

    def stage_started(self, stage: str, attempt: int) -> None:
        if attempt > 1:
            self.stage_retries.add(1, {"stage": stage})
        self._stages_running[stage] = self._stages_running.get(stage, 0) + 1
        self.stages_in_flight.set(self._stages_running[stage], {"stage": stage})

    def stage_ended(self, stage: str) -> None:
        self._stages_running[stage] -= 1
        self.stages_in_flight.set(self._stages_running[stage], {"stage": stage})


def sampled_tokens(items: Iterable[object]) -> int:
    """Tokens the policy sampled in a trajectory's choices (their token ids, else their logprobs)."""
    total = 0
    for item in items:
        if isinstance(item, Choice):
            logprobs = item.sampled_logprobs()
            total += len(item.token_ids) if item.token_ids is not None else len(logprobs or ())
    return total


@functools.cache
def fleet_metrics() -> FleetMetrics:
    """The process's instruments, made on first use from the default runtime's meter."""
    return FleetMetrics()
