"""The fleet flags of ``dgrpo worker`` (flags over environment, defaults unversioned and without metrics) and
``dgrpo runs``, read as the CLI reads them."""

from __future__ import annotations

import pytest

from dgrpo.cli import build_parser
from dgrpo.cli.fleet import cmd_runs
from dgrpo.cli.worker import worker_options
from schemas.errors import EngineSetupError
from schemas.settings import FleetBounds, WorkerDeployment
from workers.telemetry import metrics_address, next_port
from workers.worker import deployment_config


def options(monkeypatch: pytest.MonkeyPatch, *flags: str, **env: str):  # type: ignore[no-untyped-def]
    for name in (
        "DGRPO_DEPLOYMENT_NAME",
        "DGRPO_BUILD_ID",
        "DGRPO_HIGHEST_PRIORITY",
        "DGRPO_MAX_FAIRNESS_WEIGHT",
    ):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return worker_options(build_parser().parse_args(["worker", "control", *flags]))


def test_a_worker_is_unversioned_unscraped_and_bounded_to_an_equal_share_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    opts = options(monkeypatch)
    assert opts.deployment is None and deployment_config(opts.deployment) is None
    assert opts.metrics_bind is None
    assert opts.bounds == FleetBounds(highest_priority=3, max_fairness_weight=1.0)


def test_flags_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    opts = options(
        monkeypatch, "--build-id", "v2", "--max-fairness-weight", "4",
        DGRPO_DEPLOYMENT_NAME="fleet", DGRPO_BUILD_ID="v1", DGRPO_HIGHEST_PRIORITY="2",
    )  # fmt: skip
    assert opts.deployment == WorkerDeployment(name="fleet", build_id="v2")
    assert opts.bounds == FleetBounds(highest_priority=2, max_fairness_weight=4)
    config = deployment_config(opts.deployment)
    assert config is not None and config.use_worker_versioning
    assert (config.version.deployment_name, config.version.build_id) == ("fleet", "v2")


def test_a_deployment_without_a_build_id_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(EngineSetupError, match=r"set --build-id \(or DGRPO_BUILD_ID\) too"):
        options(monkeypatch, DGRPO_DEPLOYMENT_NAME="fleet")
    with pytest.raises(EngineSetupError, match=r"set --deployment-name"):
        options(monkeypatch, "--build-id", "v1")


@pytest.mark.parametrize("bind", ["9464", "localhost", "0.0.0.0:0", "0.0.0.0:http"])
def test_a_metrics_bind_without_a_port_prometheus_can_scrape_is_refused(bind: str) -> None:
    with pytest.raises(EngineSetupError, match="give HOST:PORT"):
        metrics_address(bind)


def test_a_worker_all_s_trainer_child_serves_its_metrics_on_the_next_port() -> None:
    assert metrics_address("[::1]:9464") == ("::1", 9464)
    assert next_port("0.0.0.0:9464") == "0.0.0.0:9465" and next_port("[::1]:9464") == "[::1]:9465"


def test_dgrpo_runs_is_a_command() -> None:
    args = build_parser().parse_args(["runs", "--all"])
    assert args.func is cmd_runs and args.all
