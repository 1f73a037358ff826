"""What a deployed worker container must agree with in the code: the env names it reads, the commands it runs.

Shared by the Kubernetes and compose checks (k8s_checks.py, compose_checks.py). Each function returns the
problems it finds as sentences naming where (``where``) and what to fix; an empty list means none.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from dgrpo.cli import build_parser
from schemas import settings
from schemas.errors import DgrpoError
from serving.options import is_loopback
from workers import health
from workers.telemetry import metrics_address

REPO = Path(__file__).resolve().parents[2]

OTHER_ENV = {"WANDB_API_KEY": "activities/metrics.py", "DGRPO_TRAINER_BACKEND": "activities/trainer.py"}
"""Variables a worker reads that schemas/settings.py does not name, and the module that reads each (W&B's
key is the library's name; the trainer backend's should move to schemas/settings.py)."""

REQUIRED_ENV = (
    settings.ENV_TEMPORAL_ADDRESS,  # unset, a worker dials 127.0.0.1, which in a container is itself
    settings.ENV_S3_ENDPOINT,
    settings.ENV_S3_ACCESS_KEY,
    settings.ENV_S3_SECRET_KEY,
)
"""What a worker in a cluster cannot start without (``S3Settings.from_env`` refuses to)."""

ADDRESS_ENV = (
    settings.ENV_TEMPORAL_ADDRESS,
    settings.ENV_S3_ENDPOINT,
    settings.ENV_INFERENCE_URL,
    "POSTGRES_SEEDS",
)
"""Variables whose value is ``host[:port]`` (or a URL) of another service of the cluster."""

WORKER_GRACE_S = 60
"""SIGTERM to SIGKILL a worker must get: stop polling, then let running activities finish or fail over."""

GPU_ROLES = ("inference", "trainer")

RESTARTS = ("always", "unless-stopped", "on-failure")
"""compose restart policies that start a worker again once it exited non-zero (75: its trainer was stuck)."""

IMAGE_TOOLS = {
    "postgres": {"pg_isready"},
    "temporalio/server": {"temporal-server", "nc", "sh"},  # Alpine: busybox's nc
    "temporalio/admin-tools": {"temporal", "temporal-sql-tool", "nc", "sh"},
    "minio/minio": {"mc"},
    "prom/prometheus": {"promtool", "wget"},  # busybox-based
}
"""Executables each third-party image ships (its health checks and stated commands may run only these)."""

TEMPORAL_SERVER = "temporalio/server"
TEMPORAL_IMAGES = (TEMPORAL_SERVER, "temporalio/admin-tools")
FAIRNESS_RELEASE = (1, 31)
"""The first Temporal release with fairness generally available (docs/fleet.md)."""

MODULE_PARSERS: dict[str, Callable[[], argparse.ArgumentParser]] = {"workers.health": health.build_parser}
"""``python -m MODULE`` commands a container may run, with the parser that reads their flags."""


def worker_env_names() -> set[str]:
    """Every variable name a worker reads: schemas/settings.py's ``ENV_*`` and the few others."""
    ours = {
        value for name, value in vars(settings).items() if name.startswith("ENV_") and isinstance(value, str)
    }
    return ours | set(OTHER_ENV)


def console_scripts() -> set[str]:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    return set(pyproject["project"]["scripts"])


def parse_with(parser: argparse.ArgumentParser, args: list[str]) -> tuple[argparse.Namespace | None, str]:
    """``parser``'s reading of ``args``, or None and argparse's complaint."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parser.parse_args(args), ""
    except SystemExit:
        return None, err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else "bad arguments"


@dataclass
class Command:
    """A container's command as the code reads it."""

    argv: list[str]
    program: str = ""
    """``dgrpo`` or the ``-m`` module."""
    args: argparse.Namespace | None = None


def read_command(argv: list[str], where: str, problems: list[str]) -> Command:
    """Resolve ``argv`` to a console script or module of this project and parse its flags."""
    cmd = Command(list(argv))
    if not argv:
        problems.append(f"{where}: empty command")
    elif argv[0] in console_scripts():
        cmd.program = argv[0]
        cmd.args, complaint = parse_with(build_parser(), argv[1:])
        if cmd.args is None:
            problems.append(f"{where}: `{' '.join(argv)}` is refused by the {argv[0]} CLI: {complaint}")
    elif argv[0] in ("python", "python3") and len(argv) >= 3 and argv[1] == "-m":
        cmd.program = argv[2]
        if argv[2] not in MODULE_PARSERS:
            problems.append(f"{where}: `python -m {argv[2]}` is not a module of this project's containers")
        else:
            cmd.args, complaint = parse_with(MODULE_PARSERS[argv[2]](), argv[3:])
            if cmd.args is None:
                problems.append(f"{where}: `{' '.join(argv)}` is refused by {argv[2]}: {complaint}")
    else:
        problems.append(f"{where}: `{' '.join(argv)}` runs nothing this project provides")
    return cmd


def worker_role(cmd: Command) -> str | None:
    """The role of a ``dgrpo worker ROLE`` command, else None."""
    if cmd.program == "dgrpo" and cmd.args is not None and cmd.args.command == "worker":
        return str(cmd.args.role)
    return None


def worker_queue(cmd: Command, role: str) -> str:
    """The queue a parsed ``dgrpo worker ROLE`` polls (its ``--ROLE-queue``)."""
    assert cmd.args is not None
    return str(vars(cmd.args)[f"{role}_queue"])


def check_worker_env(env: Mapping[str, str | None], where: str) -> list[str]:
    """Every name is one a worker reads (a judge key counts where the container allows it by name), and the
    ones it cannot start without are there. ``env``: name -> value (None: from a secret)."""
    pairs = settings.env_list(settings.ENV_JUDGE_KEY_ENVS, {k: v or "" for k, v in env.items()})
    known = worker_env_names() | {settings.judge_key_pair(pair)[1] for pair in pairs}
    given = set(env)
    problems = [
        f"{where}: sets {name}, which no worker reads (names live in schemas/settings.py)"
        for name in sorted(given - known)
    ]
    problems += [
        f"{where}: does not set {name}, which a worker needs" for name in REQUIRED_ENV if name not in given
    ]
    return problems


def check_probe(probe: list[str], worker: Command, image: str, where: str) -> list[str]:
    """An exec health check runs a real command; a worker's checks the worker's own role and queue."""
    problems: list[str] = []
    role = worker_role(worker)
    if probe and probe[0] in ("python", "python3"):
        cmd = read_command(probe, where, problems)
        if cmd.program == "workers.health" and cmd.args is not None:
            if role is None:
                problems.append(f"{where}: probes a worker, but the container runs no `dgrpo worker`")
            elif cmd.args.role != role:
                problems.append(f"{where}: probes role {cmd.args.role}, but the container is a {role} worker")
            elif (queue := cmd.args.queue or health.default_queue(role)) != worker_queue(worker, role):
                problems.append(
                    f"{where}: probes queue {queue}, but the worker polls {worker_queue(worker, role)}"
                )
        return problems
    tools = IMAGE_TOOLS.get(image_repo(image))
    if role is not None or tools is None:
        problems.append(f"{where}: `{' '.join(probe)}` is not a health check known to work in image {image}")
    elif not probe or probe[0] not in tools:
        problems.append(
            f"{where}: image {image} has no `{probe[0] if probe else ''}` (it has {sorted(tools)})"
        )
    return problems


def check_tool(argv: list[str], image: str, where: str) -> list[str]:
    """A third-party image's stated command runs an executable the image ships (none stated: its own)."""
    tools = IMAGE_TOOLS.get(image_repo(image))
    if not argv or tools is None:
        return []
    return [] if argv[0] in tools else [f"{where}: image {image} has no `{argv[0]}` (it has {sorted(tools)})"]


def temporal_release(image: str) -> tuple[int, ...] | None:
    """``temporalio/server:1.32.0`` -> (1, 32, 0); None for another image or a tag that is no release."""
    repo, _, tag = image.rpartition(":")
    if repo not in TEMPORAL_IMAGES or not re.fullmatch(r"\d+\.\d+\.\d+", tag):
        return None
    return tuple(int(n) for n in tag.split("."))


def temporal_release_problems(images: list[str]) -> list[str]:
    """The Temporal server runs a pinned release with fairness, and its admin tools (the schema it sets up) are
    of that same release."""
    ours = [
        i
        for i in images
        if i.rpartition(":")[0] in TEMPORAL_IMAGES or image_repo(i).startswith("temporalio/")
    ]
    servers = [i for i in ours if image_repo(i) == TEMPORAL_SERVER]
    if not servers:
        return [f"no {TEMPORAL_SERVER} image runs Temporal here (found {sorted(ours)})"]
    problems = []
    for image in ours:
        release = temporal_release(image)
        if release is None:
            problems.append(f"{image}: pin a Temporal release (x.y.z) of {' or '.join(TEMPORAL_IMAGES)}")
        elif release[:2] < FAIRNESS_RELEASE:
            problems.append(
                f"{image}: fairness is generally available from Temporal {'.'.join(map(str, FAIRNESS_RELEASE))}"
            )
    if len({temporal_release(i) for i in ours}) > 1:
        problems.append(f"the Temporal images are of different releases: {sorted(ours)}")
    return problems


def image_repo(image: str) -> str:
    """``minio/minio:latest`` -> ``minio/minio``."""
    return re.sub(r"(@sha256)?:[^/]+$", "", image)


def check_address(name: str, value: str, services: Mapping[str, set[int]], where: str) -> list[str]:
    """A ``host[:port]`` variable names a service of the cluster, and a port it serves."""
    if name not in ADDRESS_ENV:
        return []
    host, _, port = value.removeprefix("http://").removeprefix("https://").partition("/")[0].partition(":")
    if host not in services:
        return [f"{where}: {name}={value} names {host}, which is no service here ({sorted(services)})"]
    if port and int(port) not in services[host]:
        return [f"{where}: {name}={value}: service {host} serves ports {sorted(services[host])}, not {port}"]
    return []


def check_serving_env(env: Mapping[str, str | None], ports: set[int], where: str) -> list[str]:
    """A server bound beyond loopback has its key (the worker refuses to start without) and a port the
    container declares; whoever is given the server's URL is given its key too. ``ports``: the container's."""
    problems = []
    host = env.get(settings.ENV_SERVE_HOST)
    keyed = settings.ENV_SERVE_API_KEY in env
    if host is not None and not is_loopback(host) and not keyed:
        problems.append(
            f"{where}: {settings.ENV_SERVE_HOST}={host} serves beyond the container without "
            f"{settings.ENV_SERVE_API_KEY}: the worker refuses to start"
        )
    if host is not None and not is_loopback(host):
        port = env.get(settings.ENV_SERVE_PORT)
        if port is None or int(port) not in ports:
            problems.append(
                f"{where}: {settings.ENV_SERVE_PORT}={port} is not a port the container declares ({sorted(ports)})"
            )
    if settings.ENV_INFERENCE_URL in env and not keyed:
        problems.append(
            f"{where}: sets {settings.ENV_INFERENCE_URL} without {settings.ENV_SERVE_API_KEY}: the server it "
            "names requires its key"
        )
    return problems


def check_metrics(env: Mapping[str, str | None], ports: set[int], where: str) -> tuple[list[str], int | None]:
    """A worker serves Prometheus metrics a scraper in another container reaches: ``DGRPO_METRICS_BIND`` set,
    beyond loopback, on a port the container declares. The problems, and the port it serves (None: none)."""
    bind = env.get(settings.ENV_METRICS_BIND)
    if bind is None:
        return [
            f"{where}: serves no metrics: set {settings.ENV_METRICS_BIND} (0.0.0.0:9464) so it is scraped"
        ], None
    try:
        host, port = metrics_address(bind)
    except DgrpoError as err:
        return [f"{where}: {err}"], None
    problems = []
    if is_loopback(host):
        problems.append(
            f"{where}: {settings.ENV_METRICS_BIND}={bind} binds loopback: no scraper outside the container reaches it"
        )
    if port not in ports:
        problems.append(
            f"{where}: {settings.ENV_METRICS_BIND} port {port} is not a port the container declares ({sorted(ports)})"
        )
    return problems, port


def dynamic_config_problems(config: Mapping[str, object], where: str) -> list[str]:
    """Temporal's dynamic config turns on what runs sharing a fleet need (docs/fleet.md)."""
    problems = []
    for key in ("matching.useNewMatcher", "matching.enableFairness"):
        values = config.get(key)
        if not (isinstance(values, list) and values and all(v.get("value") is True for v in values)):
            problems.append(
                f"{where}: Temporal's dynamic config must set {key} to true (priority and fairness)"
            )
    return problems
