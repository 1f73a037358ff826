"""deploy/cluster/compose.yaml, checked without Docker: it passes compose_checks.py, and each check is shown to
fail on a copy with one planted defect."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from tests.deploy import compose_checks as compose

Raw = dict[str, Any]


def test_the_compose_cluster_passes_every_check() -> None:
    raw = compose.load_compose()
    assert compose.check_compose(raw, compose.documented_variables()) == []
    services = {"postgres", "temporal", "minio", "control", "inference-0", "inference-1", "trainer-0"}
    assert set(raw["services"]) >= services
    assert "start-dev" not in compose.COMPOSE.read_text()  # Temporal's real server, on PostgreSQL


def test_a_required_secret_left_unset_is_named() -> None:
    problems: list[str] = []
    compose.interpolate(compose.load_compose(), {}, problems)
    assert any("${POSTGRES_PASSWORD} is required" in p for p in problems), problems


def replace(raw: Raw, service: str, **fields: Any) -> None:
    """Give ``service`` new ``fields`` (a new dict: services share their anchors' objects)."""
    raw["services"][service] = {**raw["services"][service], **fields}


def set_env(raw: Raw, service: str, **env: str) -> None:
    replace(raw, service, environment={**raw["services"][service]["environment"], **env})


def unset_env(raw: Raw, service: str, name: str) -> None:
    env = dict(raw["services"][service]["environment"])
    env.pop(name)
    replace(raw, service, environment=env)


def set_gpus(raw: Raw, service: str, *devices: dict[str, Any]) -> None:
    replace(raw, service, deploy={"resources": {"reservations": {"devices": list(devices)}}})


def nvidia(**how: Any) -> dict[str, Any]:
    return {"driver": "nvidia", "capabilities": ["gpu"], **how}


COMPOSE_DEFECTS: dict[str, tuple[Callable[[Raw], Any], str]] = {
    "literal password": (
        lambda r: set_env(r, "postgres", POSTGRES_PASSWORD="hunter2"),
        "service postgres: POSTGRES_PASSWORD is a literal",
    ),
    "password with a default": (
        lambda r: set_env(r, "temporal", POSTGRES_PWD="${POSTGRES_PASSWORD:-temporal}"),
        "service temporal: POSTGRES_PWD is a literal",
    ),
    "environment as a list": (
        lambda r: replace(r, "postgres", environment=["POSTGRES_PASSWORD=hunter2"]),
        "service postgres: give environment as KEY: value",
    ),
    "undocumented variable": (
        lambda r: replace(r, "control", image="${DGRPO_REGISTRY}/dgrpo-cpu"),
        "${DGRPO_REGISTRY} is used but env.example does not list it",
    ),
    "port on every interface": (
        lambda r: replace(r, "temporal", ports=["7233:7233"]),
        "port '7233:7233' must be published as 127.0.0.1",
    ),
    "no healthcheck": (
        lambda r: r["services"]["postgres"].pop("healthcheck"),
        "service postgres: no healthcheck",
    ),
    "healthcheck tool the image lacks": (
        lambda r: replace(r, "minio", healthcheck={"test": ["CMD", "curl", "-f", "localhost:9000"]}),
        "image minio/minio:latest has no `curl`",
    ),
    "shell healthcheck": (
        lambda r: replace(r, "postgres", healthcheck={"test": ["CMD-SHELL", "pg_isready"]}),
        "must be the [CMD, ...] form",
    ),
    "start before healthy": (
        lambda r: replace(r, "temporal", depends_on={"postgres": {"condition": "service_started"}}),
        "must wait for postgres with condition service_healthy",
    ),
    "depends_on without condition": (
        lambda r: replace(r, "temporal", depends_on=["postgres"]),
        "depends_on must give each dependency condition",
    ),
    "depends on no service": (
        lambda r: replace(r, "temporal", depends_on={"db": {"condition": "service_healthy"}}),
        "depends on db, which is no service",
    ),
    "env name no worker reads": (
        lambda r: set_env(r, "control", DGRPO_TEMPORAL_HOST="temporal"),
        "service control: sets DGRPO_TEMPORAL_HOST, which no worker reads",
    ),
    "required env missing": (
        lambda r: unset_env(r, "control", "DGRPO_S3_ENDPOINT"),
        "service control: does not set DGRPO_S3_ENDPOINT",
    ),
    "address of no service": (
        lambda r: set_env(r, "control", DGRPO_S3_ENDPOINT="minio:9999"),
        "service minio serves ports [9000, 9001], not 9999",
    ),
    "unknown worker flag": (
        lambda r: replace(r, "inference-0", command=["--modle", "m"]),
        "unrecognized arguments: --modle m",
    ),
    "command that is no role": (
        lambda r: replace(r, "control", command=["scheduler"]),
        "invalid choice: 'scheduler'",
    ),
    "Dockerfile missing": (
        lambda r: replace(
            r, "control", build={"context": "../..", "dockerfile": "deploy/docker/control.Dockerfile"}
        ),
        "control.Dockerfile does not exist",
    ),
    "two workers on one GPU": (
        lambda r: set_gpus(r, "inference-1", nvidia(device_ids=["${DGRPO_INFERENCE_0_GPU:-0}"])),
        "GPU 0 is already reserved by service inference-0",
    ),
    "GPU by count": (
        lambda r: set_gpus(r, "trainer-0", nvidia(count=1)),
        "service trainer-0: a trainer worker reserves its GPU by device_ids",
    ),
    "inference without a GPU": (
        lambda r: set_gpus(r, "inference-1"),
        "service inference-1: a inference worker reserves its GPU",
    ),
    "grace shorter than the worker's": (
        lambda r: replace(r, "trainer-0", stop_grace_period="10s"),
        "service trainer-0: stop_grace_period must be at least 60s",
    ),
    "healthcheck of another role": (
        lambda r: replace(
            r, "trainer-0", healthcheck={"test": ["CMD", "python3", "-m", "workers.health", "control"]}
        ),
        "probes role control, but the container is a trainer worker",
    ),
    "undeclared volume": (
        lambda r: replace(r, "postgres", volumes=["pgdata:/var/lib/postgresql/data"]),
        "volume 'pgdata' is not declared",
    ),
    "inference server beyond loopback without its key": (
        lambda r: unset_env(r, "inference-0", "DGRPO_SERVE_API_KEY"),
        "service inference-0: DGRPO_SERVE_HOST=0.0.0.0 serves beyond the container without DGRPO_SERVE_API_KEY",
    ),
    "serve port not exposed": (
        lambda r: set_env(r, "inference-1", DGRPO_SERVE_PORT="9000"),
        "service inference-1: DGRPO_SERVE_PORT=9000 is not a port the container declares",
    ),
    "judge URL without the server's key": (
        lambda r: unset_env(r, "control", "DGRPO_SERVE_API_KEY"),
        "service control: sets DGRPO_INFERENCE_URL without DGRPO_SERVE_API_KEY",
    ),
    "judge URL of a port not exposed": (
        lambda r: set_env(r, "control", DGRPO_INFERENCE_URL="http://inference-0:8080/v1"),
        "service inference-0 serves ports [8000, 9464], not 8080",
    ),
    "unknown top-level key": (lambda r: r.update(service={}), "top-level key 'service'"),
    "metrics on loopback": (
        lambda r: set_env(r, "control", DGRPO_METRICS_BIND="127.0.0.1:9464"),
        "service control: DGRPO_METRICS_BIND=127.0.0.1:9464 binds loopback",
    ),
    "worker serving no metrics": (
        lambda r: unset_env(r, "trainer-0", "DGRPO_METRICS_BIND"),
        "service trainer-0: serves no metrics",
    ),
    "metrics port not exposed": (
        lambda r: replace(r, "control", expose=[]),
        "service control: DGRPO_METRICS_BIND port 9464 is not a port the container declares",
    ),
    "worker no one scrapes": (
        lambda r: (
            set_env(r, "inference-1", DGRPO_METRICS_BIND="0.0.0.0:9500")
            or replace(r, "inference-1", expose=["8000", "9500"])
        ),
        "service inference-1: its metrics (inference-1:9500) are scraped by no Prometheus job",
    ),
    "no Prometheus": (
        lambda r: r["services"].pop("prometheus"),
        "service control: its metrics (control:9464) are scraped by no Prometheus job",
    ),
    "Temporal reading no dynamic config": (
        lambda r: unset_env(r, "temporal", "DYNAMIC_CONFIG_FILE_PATH"),
        "service temporal: DYNAMIC_CONFIG_FILE_PATH must name a file of deploy/cluster it mounts",
    ),
    "Temporal of a release without fairness": (
        lambda r: replace(r, "temporal", image="temporalio/server:1.29.1"),
        "temporalio/server:1.29.1: fairness is generally available from Temporal 1.31",
    ),
    "Temporal as the auto-setup image": (
        lambda r: replace(r, "temporal", image="temporalio/auto-setup:1.29.1"),
        "no temporalio/server image runs Temporal here",
    ),
    "schema of another release": (
        lambda r: replace(r, "temporal-schema", image="temporalio/admin-tools:1.31.0"),
        "the Temporal images are of different releases",
    ),
    "setup step of a tool the image lacks": (
        lambda r: replace(r, "temporal-schema", entrypoint=["bash", "-ec"]),
        "service temporal-schema: image temporalio/admin-tools:1.32.0 has no `bash`",
    ),
    "server started before its schema": (
        lambda r: replace(r, "temporal", depends_on={"temporal-schema": {"condition": "service_started"}}),
        "service temporal: must wait for temporal-schema, a setup step, with condition service_completed_successfully",
    ),
    "worker that is not started again after it exits": (
        lambda r: replace(r, "trainer-0", restart="no"),
        "service trainer-0: a worker restarts after it exits",
    ),
}


@pytest.mark.parametrize("defect", sorted(COMPOSE_DEFECTS))
def test_each_compose_check_refuses_its_planted_defect(defect: str) -> None:
    plant, complaint = COMPOSE_DEFECTS[defect]
    raw = copy.deepcopy(compose.load_compose())
    plant(raw)
    problems = compose.check_compose(raw, compose.documented_variables())
    assert any(complaint in p for p in problems), problems
