"""A check of deploy/cluster/compose.yaml without Docker: rendered as compose would, then read like k8s_checks.

``check_compose(raw, documented)`` takes the file as parsed YAML (before ``${VAR}`` interpolation) and the
variable names env.example documents, and returns the problems found. It renders the file with only the
required secrets set, so every other setting is checked at its default, then checks: each variable is
documented; credentials come from variables, never literals; every port is published on 127.0.0.1; every
service has a health check whose command its image has (a setup step, which runs to its end, none), and waits
for what it depends on to be healthy (a setup step: to have completed);
each worker's command (its Dockerfile's ENTRYPOINT plus ``command``) parses with the real CLI, its env
names are the ones the code reads, GPU roles reserve a GPU no other service reserves, and SIGTERM gets its
grace; every worker serves metrics a Prometheus service scrapes, and Temporal turns fairness on.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from tests.deploy import worker_contract as contract

CLUSTER_DIR = contract.REPO / "deploy" / "cluster"
COMPOSE = CLUSTER_DIR / "compose.yaml"
ENV_EXAMPLE = CLUSTER_DIR / "env.example"

TOP_LEVEL = {"name", "services", "volumes", "networks", "secrets", "configs"}
VARIABLE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")
CREDENTIAL = re.compile(r"PASSWORD|PWD|SECRET|ACCESS_KEY|API_KEY|TOKEN|ROOT_USER")
FROM_VARIABLE = re.compile(r"^\$\{[A-Za-z_][A-Za-z0-9_]*(:?\?[^}]*|:?-)?\}$")
"""A whole value that is one variable, required or with an empty default: no literal credential."""


def load_compose(path: Path = COMPOSE) -> dict[str, Any]:
    return dict(yaml.safe_load(path.read_text()))


def documented_variables(path: Path = ENV_EXAMPLE) -> set[str]:
    lines = (line.strip() for line in path.read_text().splitlines())
    return {line.partition("=")[0] for line in lines if line and not line.startswith("#")}


def strings(node: Any) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for k, v in node.items() for s in strings(k) + strings(v)]
    if isinstance(node, list):
        return [s for item in node for s in strings(item)]
    return []


def variables(raw: dict[str, Any]) -> dict[str, bool]:
    """Every variable the file uses -> whether it is required (``${VAR:?...}``)."""
    used: dict[str, bool] = {}
    for text in strings(raw):
        for m in VARIABLE.finditer(text):
            name = m.group(1) or m.group(4)
            if name:
                used[name] = used.get(name, False) or (m.group(2) or "").endswith("?")
    return used


def interpolate(node: Any, env: dict[str, str], problems: list[str]) -> Any:
    """``node`` with ``${VAR}``, ``${VAR:-default}``, ``${VAR:?error}`` and ``$$`` replaced as compose does."""
    if isinstance(node, dict):
        return {interpolate(k, env, problems): interpolate(v, env, problems) for k, v in node.items()}
    if isinstance(node, list):
        return [interpolate(item, env, problems) for item in node]
    if not isinstance(node, str):
        return node

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name, op, arg = m.group(1) or m.group(4), m.group(2) or "", m.group(3) or ""
        value = env.get(name)
        unset = value is None or (op.startswith(":") and value == "")
        if op.endswith("-"):
            return arg if unset else str(value)
        if op.endswith("?"):
            if unset:
                problems.append(f"${{{name}}} is required: {arg}")
            return str(value or "")
        if op.endswith("+"):
            return "" if unset else arg
        return str(value or "")

    return VARIABLE.sub(one, node)


def dockerfile_argv(dockerfile: Path, instruction: str) -> list[str]:
    """The exec-form ``ENTRYPOINT`` or ``CMD`` of a Dockerfile (empty when it has none)."""
    found: list[str] = []
    for line in dockerfile.read_text().splitlines():
        if line.startswith(f"{instruction} "):
            found = list(json.loads(line.removeprefix(f"{instruction} ")))
    return found


def seconds(duration: str) -> float:
    """``1m30s`` -> 90."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    return sum(float(n) * units[u] for n, u in re.findall(r"([\d.]+)(ms|h|m|s)", duration))


def check_compose(raw: dict[str, Any], documented: set[str]) -> list[str]:
    problems: list[str] = []
    used = variables(raw)
    problems += [
        f"${{{name}}} is used but env.example does not list it" for name in sorted(set(used) - documented)
    ]
    problems += check_credentials(raw)
    secrets_only = {name: "s3cr3t-value" for name, required in used.items() if required}
    rendered = interpolate(raw, secrets_only, problems)
    problems += [
        f"top-level key {k!r} is not compose's"
        for k in rendered
        if k not in TOP_LEVEL and not k.startswith("x-")
    ]
    services: dict[str, Any] = rendered.get("services") or {}
    ports = {name: published_ports(svc, name, problems) for name, svc in services.items()}
    gpus: dict[str, str] = {}
    metrics: dict[str, int] = {}
    for name, svc in services.items():
        problems += check_service(name, svc, rendered, ports, gpus, metrics)
    problems += check_scrapes(services, metrics)
    problems += check_temporal_config(services)
    problems += contract.temporal_release_problems([str(svc.get("image", "")) for svc in services.values()])
    return problems


def one_shot(svc: dict[str, Any]) -> bool:
    """A service that runs to its end (a setup step), restarted only if it fails: others wait for it to complete."""
    return str(svc.get("restart", "no")).startswith(("no", "on-failure")) and "build" not in svc


def mounted_file(svc: dict[str, Any], target: str) -> Path | None:
    """The file of this directory a service mounts at ``target`` (None: none)."""
    for volume in svc.get("volumes", []):
        source, _, rest = str(volume).partition(":")
        if rest.split(":")[0] == target and source.startswith("."):
            return CLUSTER_DIR / source
    return None


def check_scrapes(services: dict[str, Any], metrics: dict[str, int]) -> list[str]:
    """A Prometheus service scrapes every worker's metrics port (its config's static or DNS targets)."""
    targets: set[tuple[str, int]] = set()
    for name, svc in services.items():
        if contract.image_repo(str(svc.get("image", ""))) != "prom/prometheus":
            continue
        config = mounted_file(svc, "/etc/prometheus/prometheus.yml")
        if config is None or not config.is_file():
            return [
                f"service {name}: mounts no prometheus.yml of deploy/cluster at /etc/prometheus/prometheus.yml"
            ]
        for job in yaml.safe_load(config.read_text()).get("scrape_configs", []):
            for sd in job.get("dns_sd_configs", []):
                targets |= {(host, int(sd["port"])) for host in sd.get("names", [])}
            for static in job.get("static_configs", []):
                targets |= {
                    (t.rpartition(":")[0], int(t.rpartition(":")[2])) for t in static.get("targets", [])
                }
    return [
        f"service {name}: its metrics ({name}:{port}) are scraped by no Prometheus job"
        for name, port in sorted(metrics.items())
        if (name, port) not in targets
    ]


def check_temporal_config(services: dict[str, Any]) -> list[str]:
    """Temporal's server reads a dynamic config of this directory that turns priority and fairness on."""
    for name, svc in services.items():
        if contract.image_repo(str(svc.get("image", ""))) != contract.TEMPORAL_SERVER:
            continue
        path = (svc.get("environment") or {}).get("DYNAMIC_CONFIG_FILE_PATH")
        config = mounted_file(svc, f"/etc/temporal/{path}") if path else None
        if config is None or not config.is_file():
            return [f"service {name}: DYNAMIC_CONFIG_FILE_PATH must name a file of deploy/cluster it mounts"]
        return contract.dynamic_config_problems(yaml.safe_load(config.read_text()) or {}, f"service {name}")
    return ["no Temporal server here"]


def check_credentials(raw: dict[str, Any]) -> list[str]:
    problems = []
    for name, svc in (raw.get("services") or {}).items():
        if isinstance(svc.get("environment"), list):
            problems.append(f"service {name}: give environment as KEY: value, so it can be checked")
            continue
        for key, value in (svc.get("environment") or {}).items():
            if CREDENTIAL.search(key) and not FROM_VARIABLE.match(str(value)):
                problems.append(
                    f"service {name}: {key} is a literal; credentials come from .env (${{{key}:?...}})"
                )
    return problems


def published_ports(svc: dict[str, Any], name: str, problems: list[str]) -> set[int]:
    """The container ports a service publishes or exposes; a port published beyond 127.0.0.1 is a problem."""
    found = {int(p) for p in svc.get("expose", [])}
    for port in svc.get("ports", []):
        parts = str(port).split(":")
        if len(parts) != 3 or parts[0] != "127.0.0.1":
            problems.append(f"service {name}: port {port!r} must be published as 127.0.0.1:HOST:CONTAINER")
        found.add(int(parts[-1]))
    return found


def check_service(
    name: str,
    svc: dict[str, Any],
    rendered: dict[str, Any],
    ports: dict[str, set[int]],
    gpus: dict[str, str],
    metrics: dict[str, int],
) -> list[str]:
    """``metrics``: each worker's metrics port, filled in."""
    where = f"service {name}"
    problems: list[str] = []
    services = rendered["services"]
    if "image" not in svc and "build" not in svc:
        problems.append(f"{where}: neither image nor build")
    depends = svc.get("depends_on") or {}
    if isinstance(depends, list):
        problems.append(f"{where}: depends_on must give each dependency condition: service_healthy")
        depends = {}
    for dep, how in depends.items():
        if dep not in services:
            problems.append(f"{where}: depends on {dep}, which is no service")
        elif one_shot(services[dep]):
            if how.get("condition") != "service_completed_successfully":
                problems.append(
                    f"{where}: must wait for {dep}, a setup step, with condition service_completed_successfully"
                )
        elif how.get("condition") != "service_healthy" or "healthcheck" not in services[dep]:
            problems.append(
                f"{where}: must wait for {dep} with condition service_healthy (and {dep} needs a healthcheck)"
            )
    for volume in svc.get("volumes", []):
        source = str(volume).split(":")[0]
        if not source.startswith(("/", ".")) and source not in (rendered.get("volumes") or {}):
            problems.append(f"{where}: volume {source!r} is not declared under top-level volumes")
    environment = svc.get("environment") or {}
    env = {str(k): str(v) for k, v in environment.items()} if isinstance(environment, dict) else {}
    for key, value in env.items():
        problems += contract.check_address(key, value, ports, where)
    worker = contract.Command([])
    if "build" in svc:
        dockerfile = CLUSTER_DIR / svc["build"]["context"] / svc["build"]["dockerfile"]
        if not dockerfile.is_file():
            problems.append(f"{where}: build.dockerfile {dockerfile} does not exist")
            return problems
        argv = svc.get("entrypoint") or dockerfile_argv(dockerfile, "ENTRYPOINT")
        argv = list(argv) + list(svc.get("command") or dockerfile_argv(dockerfile, "CMD"))
        worker = contract.read_command(argv, where, problems)
    else:
        problems += contract.check_tool(
            list(svc.get("entrypoint") or []),
            str(svc.get("image", "")),
            where,  # command: the entrypoint's args
        )
    if not one_shot(svc):
        problems += check_healthcheck(svc, worker, where)
    elif "healthcheck" in svc:
        problems.append(
            f"{where}: a setup step (restart: on-failure) has no healthcheck; others wait for it to complete"
        )
    role = contract.worker_role(worker)
    if role is not None:
        problems += contract.check_worker_env(env, where)
        problems += contract.check_serving_env(env, ports[name], where)
        if str(svc.get("restart", "no")) not in contract.RESTARTS:
            problems.append(
                f"{where}: a worker restarts after it exits (one whose trainer was stuck exits 75 for a fresh "
                f"process): restart: unless-stopped"
            )
        if seconds(str(svc.get("stop_grace_period", "10s"))) < contract.WORKER_GRACE_S:
            problems.append(f"{where}: stop_grace_period must be at least {contract.WORKER_GRACE_S}s")
        problems += check_gpu(svc, role, where, gpus)
        found, port = contract.check_metrics(env, ports[name], where)
        problems += found
        if port is not None:
            metrics[name] = port
    return problems


def check_healthcheck(svc: dict[str, Any], worker: contract.Command, where: str) -> list[str]:
    test = (svc.get("healthcheck") or {}).get("test")
    if not test:
        return [f"{where}: no healthcheck (every service has one, so others can wait for it)"]
    if not isinstance(test, list) or test[0] != "CMD":
        return [f"{where}: healthcheck test must be the [CMD, ...] form, so its command can be checked"]
    image = str(svc.get("image", ""))
    return contract.check_probe([str(t) for t in test[1:]], worker, image, f"{where} healthcheck")


def check_gpu(svc: dict[str, Any], role: str, where: str, gpus: dict[str, str]) -> list[str]:
    devices = (((svc.get("deploy") or {}).get("resources") or {}).get("reservations") or {}).get(
        "devices"
    ) or []
    gpu_devices = [d for d in devices if "gpu" in d.get("capabilities", [])]
    if role not in contract.GPU_ROLES:
        return []
    if not gpu_devices or any("device_ids" not in d for d in gpu_devices):
        return [f"{where}: a {role} worker reserves its GPU by device_ids (count: 1 is always GPU 0)"]
    problems = []
    for device in (str(i) for d in gpu_devices for i in d["device_ids"]):
        if device in gpus:
            problems.append(f"{where}: GPU {device} is already reserved by {gpus[device]}")
        gpus[device] = where
    return problems
