"""A cluster of "hosts" on this machine: each a Linux network namespace with its own address and its own
directories, joined by a bridge that lives in a namespace of its own (the root namespace's network is never
touched). Hosts share nothing but what they reach over that bridge; every process and namespace the cluster
made is removed on exit, also when a test fails.

    with Cluster(["stack", "control", "inference", "trainer", "client"]) as cluster:
        proc = cluster["control"].spawn([python, "-m", "dgrpo.cli", "worker", "control"], env={...})
        cluster.partition("trainer")   # cut one host off the bridge; cluster.heal("trainer")

Needs root (``ip netns``, ``ip link``), as the project's machines and CI have.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import TracebackType

SUBNET = "10.213.{}.{}"
"""Addresses only these namespaces hold; nothing outside them is ever addressed."""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def tc(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Traffic control (``tc -n NETNS qdisc ...``): ``ip`` has no qdisc object."""
    return subprocess.run(["tc", *args], check=check, capture_output=True, text=True)


class Host:
    """One namespace: its address on the bridge, its private HOME / TMPDIR / DGRPO_HOME / DGRPO_CACHE."""

    def __init__(self, name: str, netns: str, address: str, root: Path) -> None:
        self.name, self.netns, self.address, self.root = name, netns, address, root
        self.processes: list[subprocess.Popen[bytes]] = []
        self.hidden: list[Path] = []
        """Other hosts' directories, covered by an empty tmpfs in this host's mount namespace."""
        self.kept: list[Path] = []
        """Directories under /tmp that stay visible on the host's private /tmp: the code and its Python."""
        self.image_cache: Path | None = None
        """Converted models mounted read-only as this host's DGRPO_CACHE: what a container image carries, so a
        rescheduled host does not convert the model again. Nothing a worker writes can land there."""

    def env(self) -> dict[str, str]:
        """A fresh environment for this host: the machine's PATH and Python only, private directories."""
        keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "PYTHONUNBUFFERED")}
        dirs = {name: self.root / name.lower() for name in ("HOME", "TMPDIR", "DGRPO_HOME", "DGRPO_CACHE")}
        for path in dirs.values():
            path.mkdir(parents=True, exist_ok=True)
        return {**keep, **{k: str(v) for k, v in dirs.items()}, "DGRPO_CPU_SHARE_DIR": "off"}

    def inside(self, argv: list[str]) -> list[str]:
        """``argv`` run as on a host of its own: this network namespace; a hostname of its own (a UTS
        namespace: Temporal names pollers ``<pid>@<hostname>``, and the health probe reads that); a mount
        namespace where /tmp is empty and private and every other host's directory is an empty tmpfs, so no
        file another host wrote can be read. Each step execs the next: the pid is the program's."""
        steps = []
        for i, kept in enumerate(self.kept):  # set aside, then moved back onto the empty /tmp
            stash = self.root / f".kept{i}"
            stash.mkdir(exist_ok=True)
            steps.append(f"mount --bind {shlex.quote(str(kept))} {shlex.quote(str(stash))}")
        steps.append("mount -t tmpfs tmpfs /tmp")
        for i, kept in enumerate(self.kept):
            where = shlex.quote(str(kept))
            steps.append(
                f"mkdir -p {where} && mount --move {shlex.quote(str(self.root / f'.kept{i}'))} {where}"
            )
        steps += [f"mount -t tmpfs tmpfs {shlex.quote(str(p))}" for p in self.hidden]
        if self.image_cache is not None:
            cache = shlex.quote(str(self.root / "dgrpo_cache"))
            steps.append(f"mkdir -p {cache} && mount --bind {shlex.quote(str(self.image_cache))} {cache}")
            steps.append(f"mount -o remount,bind,ro {cache}")
        script = f'hostname "$0" && {" && ".join(steps)} && exec "$@"'
        unshare = ["unshare", "--uts", "--mount", "--propagation", "private", "--", "sh", "-c", script]
        return ["ip", "netns", "exec", self.netns, *unshare, f"{self.name}-{self.netns}", *argv]

    def spawn(
        self, argv: list[str], env: dict[str, str], log: Path, cwd: Path | None = None
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside this host."""
        with log.open("ab") as out:
            proc = subprocess.Popen(
                self.inside(argv), env={**self.env(), **env}, cwd=cwd,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.processes.append(proc)
        return proc

    def run(self, argv: list[str], env: dict[str, str], timeout: float, cwd: Path | None = None) -> str:
        """Run ``argv`` inside this host to the end; its standard output (raises with stderr on failure)."""
        done = subprocess.run(
            self.inside(argv), env={**self.env(), **env}, cwd=cwd,
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"{self.name}: {argv[:4]} exited {done.returncode}:\n{done.stderr[-4000:]}")
        return done.stdout

    def pids(self) -> list[int]:
        """Every process in this host's namespace, whoever started it."""
        out = ip("netns", "pids", self.netns, check=False).stdout
        return [int(p) for p in out.split()]

    def kill_all(self) -> None:
        """Every process in the namespace, at once (SIGCONT first: a stopped one must die too)."""
        for sig in (signal.SIGCONT, signal.SIGKILL):
            for pid in self.pids():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        for proc in self.processes:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def code_under_tmp() -> list[Path]:
    """The repository and the Python running it, where they lie under /tmp (a CI clone, say): every host's
    private /tmp keeps them, or no host could start a program."""
    candidates = [
        Path(__file__).resolve().parents[2],
        Path(sys.prefix),
        Path(sys.executable).resolve().parent,
    ]
    under = sorted({c for c in candidates if c.is_relative_to("/tmp")}, key=lambda c: len(c.parts))
    return [c for i, c in enumerate(under) if not any(c.is_relative_to(o) for o in under[:i])]


class Cluster:
    """Hosts named in ``names``, each with an address 10.213.<net>.<i>; torn down on exit. ``image_cache``: see
    ``Host.image_cache``."""

    def __init__(self, names: list[str], root: Path | None = None, image_cache: Path | None = None) -> None:
        tag = uuid.uuid4().hex[:6]
        self.tag = tag
        self.net = int(tag[:2], 16) % 250 + 1  # a /24 of its own, so clusters of parallel runs don't meet
        self.switch = f"dg{tag}sw"
        # Not under /tmp: each host mounts a private /tmp of its own.
        self.root = root or Path(tempfile.mkdtemp(prefix=f"dgrpo-cluster-{tag}-", dir="/var/tmp"))
        self.hosts = {
            name: Host(name, f"dg{tag}h{i}", SUBNET.format(self.net, i), self.root / name)
            for i, name in enumerate(names, start=1)
        }
        kept = code_under_tmp()
        for host in self.hosts.values():
            host.root.mkdir(parents=True, exist_ok=True)
            host.hidden = [other.root for other in self.hosts.values() if other is not host]
            host.kept = kept
            host.image_cache = image_cache

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def veth(self, host: Host) -> str:
        """The switch-side end of a host's link (host-side: eth0)."""
        return f"v{self.tag}{host.netns[-1]}"

    def __enter__(self) -> Cluster:
        try:
            ip("netns", "add", self.switch)
            ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            ip("-n", self.switch, "link", "set", "br0", "up")
            for host in self.hosts.values():
                ip("netns", "add", host.netns)
                ip("-n", host.netns, "link", "set", "lo", "up")
                peer = self.veth(host)
                ip(
                    "-n",
                    self.switch,
                    "link",
                    "add",
                    peer,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    "eth0",
                    "netns",
                    host.netns,
                )
                ip("-n", self.switch, "link", "set", peer, "master", "br0", "up")
                ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
                ip("-n", host.netns, "link", "set", "eth0", "up")
        except BaseException:
            self.close()
            raise
        return self

    def partition(self, name: str) -> None:
        """Cut ``name`` off every other host (its processes keep running, its packets go nowhere)."""
        ip("-n", self.switch, "link", "set", self.veth(self.hosts[name]), "down")

    def heal(self, name: str) -> None:
        ip("-n", self.switch, "link", "set", self.veth(self.hosts[name]), "up")

    def kill_host(self, name: str) -> None:
        """The host dies whole: every process in it, and its directories with it."""
        host = self.hosts[name]
        host.kill_all()
        shutil.rmtree(host.root, ignore_errors=True)

    def close(self) -> None:
        for host in self.hosts.values():
            host.kill_all()
            ip("netns", "del", host.netns, check=False)
        ip("netns", "del", self.switch, check=False)  # deleting a namespace removes its links
        shutil.rmtree(self.root, ignore_errors=True)

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def wait_for(
    check: object,
    what: str,
    timeout: float = 300.0,
    log: Path | None = None,
    proc: subprocess.Popen[bytes] | None = None,
) -> None:
    """Poll ``check()`` until it is true; raise, with ``log``'s tail, once ``timeout`` passes or ``proc``
    (the program that should make it true) has ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (proc is None or proc.poll() is None):
        if check():  # type: ignore[operator]
            return
        time.sleep(0.5)
    tail = log.read_text(errors="replace")[-3000:] if log is not None and log.exists() else ""
    why = (
        f"within {timeout:.0f} s" if proc is None or proc.poll() is None else f"(exit code {proc.returncode})"
    )
    raise TimeoutError(f"{what}: not seen {why}" + (f"; {log}:\n{tail}" if tail else ""))
