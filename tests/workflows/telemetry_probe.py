"""What an operator's Prometheus and OpenTelemetry collector would see of a worker: a scraper of its metrics
endpoint that keeps every sample, and an OTLP/HTTP receiver that keeps every span the workers export."""

from __future__ import annotations

import asyncio
import http.server
import re
import threading
import urllib.request
from dataclasses import dataclass, field

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from temporalio.client import Client
from temporalio.contrib.opentelemetry import TracingInterceptor

from host.processes import HOST, free_port, port_is_free
from workers.temporal import DATA_CONVERTER

SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)")


def two_free_ports() -> int:
    """A port P with P + 1 free too (a ``worker all`` serves its metrics on P, its trainer child on P + 1)."""
    while True:
        port = free_port()
        if port < 65535 and port_is_free(port + 1):
            return port


def scrape(port: int) -> dict[str, dict[str, float]]:
    """``/metrics`` of ``HOST:port``: metric name -> its label set (as written) -> value."""
    text = urllib.request.urlopen(f"http://{HOST}:{port}/metrics", timeout=10).read().decode()
    out: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match and not line.startswith("#"):
            out.setdefault(match.group(1), {})[match.group(2) or ""] = float(match.group(3))
    return out


def total(sample: dict[str, dict[str, float]], name: str, label: str = "") -> float:
    """The sum of ``name`` over the label sets containing ``label``."""
    return sum(value for labels, value in sample.get(name, {}).items() if label in labels)


def moved(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]], name: str, label: str = ""
) -> float:
    """How far ``name`` (summed over the label sets containing ``label``) went up between two samples."""
    return total(after, name, label) - total(before, name, label)


@dataclass
class Scraper:
    """Scrapes ``port`` every ``every_s`` while running; ``samples`` in order."""

    port: int
    every_s: float = 0.5
    samples: list[dict[str, dict[str, float]]] = field(default_factory=list)

    async def run(self) -> None:
        while True:
            self.samples.append(await asyncio.to_thread(scrape, self.port))
            await asyncio.sleep(self.every_s)

    def most(self, name: str) -> float:
        return max(total(s, name) for s in self.samples)


class TraceCollector:
    """An OTLP/HTTP endpoint on loopback keeping the spans posted to it: (name, trace id) pairs."""

    def __init__(self) -> None:
        spans = self.spans = list[tuple[str, str]]()

        class Receive(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                request = ExportTraceServiceRequest()
                request.ParseFromString(self.rfile.read(int(self.headers["Content-Length"])))
                for resource in request.resource_spans:
                    for scope in resource.scope_spans:
                        spans.extend((s.name, s.trace_id.hex()) for s in scope.spans)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((HOST, 0), Receive)
        self.url = f"http://{HOST}:{self.server.server_port}/v1/traces"

    def traces(self) -> dict[str, list[str]]:
        """Trace id -> the names of its spans."""
        out: dict[str, list[str]] = {}
        for name, trace in self.spans:
            out.setdefault(trace, []).append(name)
        return out

    def traces_with(self, *names: str) -> set[str]:
        """The trace ids holding a span of each of ``names``."""
        ids = [{trace for span, trace in self.spans if span == name} for name in names]
        return set.intersection(*ids)

    def start(self) -> None:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


async def traced_client(address: str, collector: TraceCollector) -> Client:
    """A client whose workflow starts are spans sent to ``collector`` (as ``dgrpo train`` with an OTLP endpoint
    set): each run it starts is one trace, its workflow's and activities' spans on every worker included."""
    provider = TracerProvider()  # its own, not the process's global one
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=collector.url)))
    interceptor = TracingInterceptor(provider.get_tracer("dgrpo-tests"))
    return await Client.connect(address, data_converter=DATA_CONVERTER, interceptors=[interceptor])
