"""deploy/grafana/dgrpo.json against what the workers export: every metric a panel asks for is one of dgrpo's
(``activities/fleet_metrics.py``) or of the Temporal SDK's, and every one of dgrpo's has a panel."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tests.deploy import worker_contract as contract

DASHBOARD = contract.REPO / "deploy" / "grafana" / "dgrpo.json"
FLEET_METRICS = contract.REPO / "activities" / "fleet_metrics.py"
METRIC = re.compile(r"\b((?:dgrpo|temporal)_[a-z0-9_]+)")
HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")

SDK_FAILURE_COUNTERS = {"temporal_long_request_failure", "temporal_request_failure"}
"""SDK counters that appear on an endpoint with their first failure (a healthy run's scrape lacks them)."""


def load_dashboard(path: Path = DASHBOARD) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def expressions(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def dashboard_metrics(dashboard: dict[str, Any]) -> set[str]:
    """The metric names the panels' expressions read, histograms by their base name."""
    names = {m for e in expressions(dashboard) for m in METRIC.findall(e)}
    return {next((n.removesuffix(s) for s in HISTOGRAM_SUFFIXES if n.endswith(s)), n) for n in names}


def dgrpo_metrics() -> set[str]:
    """The names ``FleetMetrics`` creates."""
    return set(re.findall(r'"(dgrpo_[a-z0-9_]+)"', FLEET_METRICS.read_text()))


def check_dashboard(dashboard: dict[str, Any]) -> list[str]:
    shown = dashboard_metrics(dashboard)
    ours = dgrpo_metrics()
    problems = [f"a panel reads {name}, which no worker exports" for name in sorted(
        n for n in shown if n.startswith("dgrpo_") and n not in ours
    )]  # fmt: skip
    problems += [f"{name} has no panel" for name in sorted(ours - shown)]
    for panel in dashboard["panels"]:
        if panel["type"] != "row" and panel.get("datasource", {}).get("uid") != "${datasource}":
            problems.append(
                f"panel {panel['title']!r}: its datasource is not the dashboard's ${{datasource}}"
            )
    return problems
