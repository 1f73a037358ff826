"""What an operator watches of a worker: a Prometheus endpoint and OpenTelemetry traces.

``serve_metrics``: the process's Temporal runtime exports its metrics in Prometheus's format on ``--metrics-bind``
(``DGRPO_METRICS_BIND``; off unless given): the SDK's own (task slots, schedule-to-start latency, poll
failures, ...) and dgrpo's (``activities/fleet_metrics.py``) on one endpoint. Call it first, before anything
connects to Temporal. ``StageMetrics``: the interceptor counting each stage's retries and running activities.

``tracing_interceptors``: the SDK's ``TracingInterceptor`` on every client and worker when an OTLP endpoint is
configured (``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, read by the OTLP
exporter as usual), so a step's workflow and its activities on every worker are spans of one trace; none
otherwise (no exporter, no cost).
"""

from __future__ import annotations

import functools
import logging
import os
from typing import TYPE_CHECKING, Any

from temporalio import activity
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from activities.fleet_metrics import fleet_metrics
from schemas.errors import EngineSetupError
from schemas.settings import ENV_METRICS_BIND

if TYPE_CHECKING:
    from temporalio.contrib.opentelemetry import TracingInterceptor

log = logging.getLogger(__name__)

OTLP_ENDPOINT_ENV = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
"""The OpenTelemetry variables that turn tracing on (their exporter reads them)."""
SERVICE_NAME_ENV = "OTEL_SERVICE_NAME"
DEFAULT_SERVICE_NAME = "dgrpo-worker"


def metrics_address(bind: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``) split; a bind without a port, or port 0, is refused (Prometheus scrapes a
    known port)."""
    host, sep, port = bind.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise EngineSetupError(
            f"--metrics-bind / {ENV_METRICS_BIND} {bind!r}: give HOST:PORT with a port Prometheus can scrape, "
            "e.g. 127.0.0.1:9464 (0.0.0.0:9464 in a container)"
        )
    return host, int(port)


def serve_metrics(bind: str) -> None:
    """Make the process's default Temporal runtime one that serves Prometheus metrics on ``bind``; before any
    client connects (the runtime a client uses is fixed when it connects)."""
    host, port = metrics_address(bind)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        runtime = Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=address)))
    except Exception as err:  # the SDK's bridge: the address is taken, or not this host's
        raise EngineSetupError(f"cannot serve metrics on {address} (--metrics-bind): {err}") from err
    Runtime.set_default(runtime, error_if_already_set=True)
    log.info("Prometheus metrics on http://%s/metrics", address)


def next_port(bind: str) -> str:
    """``bind`` with the next port: where a ``worker all``'s trainer child serves its own metrics."""
    host, port = metrics_address(bind)
    return f"[{host}]:{port + 1}" if ":" in host else f"{host}:{port + 1}"


class StageMetrics(Interceptor):
    """Register on every ``Worker``: each activity's retries and the activities running, by stage."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Counting(next)


class _Counting(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        info, metrics = activity.info(), fleet_metrics()
        metrics.stage_started(info.activity_type, info.attempt)
        try:
            return await self.next.execute_activity(input)
        finally:
            metrics.stage_ended(info.activity_type)


def tracing_configured(env: dict[str, str] | None = None) -> bool:
    e = os.environ if env is None else env
    return any(e.get(name) for name in OTLP_ENDPOINT_ENV)


def tracing_interceptors() -> list[TracingInterceptor]:
    """``[TracingInterceptor()]`` exporting over OTLP/HTTP when an endpoint is configured, else ``[]``."""
    if not tracing_configured():
        return []
    from temporalio.contrib.opentelemetry import TracingInterceptor

    _install_tracer_provider()
    return [TracingInterceptor(always_create_workflow_spans=True)]  # a run started untraced is traced too


@functools.cache
def _install_tracer_provider() -> None:
    """The process's OpenTelemetry tracer provider: batches of spans to the OTLP endpoint (once)."""
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    name = os.environ.get(SERVICE_NAME_ENV) or DEFAULT_SERVICE_NAME
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    log.info("OpenTelemetry traces of service %s go to the OTLP endpoint", name)


def flush_traces() -> None:
    """Send the spans still batched (a worker about to exit; its process ends without atexit handlers)."""
    if not tracing_configured():
        return
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider):
        provider.shutdown()
