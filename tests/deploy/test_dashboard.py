"""The Grafana dashboard reads only metrics the workers export and shows every one of dgrpo's (its SDK metric
names are checked against a real worker's scrape in tests/workflows/test_training_run_real.py)."""

from __future__ import annotations

import copy

from tests.deploy import dashboard_checks as dash


def test_the_dashboard_reads_what_the_workers_export() -> None:
    dashboard = dash.load_dashboard()
    assert dash.check_dashboard(dashboard) == []
    assert {"temporal_activity_schedule_to_start_latency", "temporal_worker_task_slots_used"} <= (
        dash.dashboard_metrics(dashboard)
    )


def test_a_misspelt_metric_and_a_metric_without_a_panel_are_named() -> None:
    dashboard = copy.deepcopy(dash.load_dashboard())
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            target["expr"] = target["expr"].replace("dgrpo_oom_halvings_total", "dgrpo_oom_halving_total")
    problems = dash.check_dashboard(dashboard)
    assert "a panel reads dgrpo_oom_halving_total, which no worker exports" in problems
    assert "dgrpo_oom_halvings_total has no panel" in problems
