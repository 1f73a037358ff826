"""The dgrpo fleet on a test cluster (tests/cluster/netns.py): the stack host, workers started as
deploy/cluster/compose.yaml starts them (``dgrpo worker ROLE``), ready when their own health probe (deploy/k8s's
readiness probe) says so. Used by test_cluster.py and test_cluster_faults.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from netns import Cluster, Host, ip, wait_for

from base_models.resolve import ensure_smollm2
from schemas.settings import dgrpo_cache

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PYTHON = sys.executable


def image_cache() -> Path:
    """The machine's converted-model cache, filled once here as an image build would: every host mounts it
    read-only (``Host.image_cache``), so a host started fresh mid-test does not convert the GGUF again."""
    ensure_smollm2()
    return Path(dgrpo_cache())


def start_stack(c: Cluster, s3_address: str | None = None) -> dict[str, str]:
    """Temporal and S3 on host ``stack``; the environment that points a worker at them. ``s3_address``: a
    second address of the stack host that serves S3 alone (a host can then lose S3 and keep Temporal)."""
    stack = c["stack"]
    argv = [PYTHON, str(HERE / "stack_host.py"), stack.address, str(stack.root / "stack-env.json")]
    if s3_address is not None:
        ip("-n", stack.netns, "addr", "add", f"{s3_address}/24", "dev", "eth0")
        argv.append(s3_address)
    log = stack.root / "stack.log"
    proc = stack.spawn(argv, {}, log)
    env_file = Path(argv[3])
    wait_for(env_file.exists, "the stack host's Temporal and S3 answering", log=log, proc=proc)
    env = json.loads(env_file.read_text())
    env["PYTHONPATH"] = str(REPO)
    return env


def start_worker(
    host: Host, role: str, env: dict[str, str], flags: tuple[str, ...] = ()
) -> subprocess.Popen[bytes]:
    """``dgrpo worker ROLE [FLAGS]`` on ``host`` (a host whose directories were removed gets fresh ones)."""
    host.root.mkdir(parents=True, exist_ok=True)
    argv = [PYTHON, "-m", "dgrpo.cli", "worker", role, *flags]
    return host.spawn(argv, env, host.root / "worker.log", cwd=REPO)


def healthy(host: Host, role: str, env: dict[str, str], queue: str | None = None) -> bool:
    """The worker's own health probe (deploy/k8s's readiness probe), run on its host."""
    try:
        host.run([PYTHON, "-m", "workers.health", role, *(["--queue", queue] if queue else [])], env, timeout=30,
                 cwd=REPO)  # fmt: skip
    except (RuntimeError, subprocess.TimeoutExpired):
        return False
    return True


def wait_healthy(host: Host, role: str, env: dict[str, str], queue: str | None = None) -> None:
    wait_for(
        lambda: healthy(host, role, env, queue), f"the {role} worker on {host.name} polling Temporal", 300
    )


def logs(c: Cluster) -> str:
    """The tail of every log of every host, for a failure's message."""
    out = []
    for host in c.hosts.values():
        for log in host.root.glob("*.log"):
            out.append(f"--- {host.name}: {log.name}\n" + log.read_text(errors="replace")[-3000:])
    return "\n".join(out)
