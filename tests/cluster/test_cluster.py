"""A run on a cluster whose hosts share nothing but Temporal and S3 (tests/cluster/netns.py): host 1 runs the
stack, hosts 2-4 a control, an inference and a trainer worker started as ``dgrpo worker ROLE`` (what
deploy/cluster/compose.yaml runs), host 5 the client. Each host has its own address, hostname, /tmp and
directories, and cannot see another's files."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from fleet import HERE, PYTHON, REPO, image_cache, logs, start_stack, start_worker, wait_healthy
from netns import Cluster

pytestmark = pytest.mark.slow
ROLES = ("control", "inference", "trainer")
STEPS = 2


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[Cluster, dict[str, str]]]:
    with Cluster(["stack", *ROLES, "client"], image_cache=image_cache()) as c:
        env = start_stack(c)
        for role in ROLES:
            start_worker(c[role], role, env)
        for role in ROLES:
            wait_healthy(c[role], role, env)
        yield c, env


def test_hosts_see_neither_each_others_files_nor_the_machines_tmp(
    cluster: tuple[Cluster, dict[str, str]],
) -> None:
    c, env = cluster
    (c["trainer"].root / "written-by-trainer").write_text("x")
    look = ["sh", "-c", f"ls -A {c['trainer'].root} /tmp"]
    assert "written-by-trainer" in c["trainer"].run(look, env, timeout=30)
    # /tmp is empty but for the way to the code, where the repository lies under /tmp (a CI clone)
    kept = sorted({k.relative_to("/tmp").parts[0] for k in c["inference"].kept})
    assert c["inference"].run(look, env, timeout=30).split() == ["/tmp:", *kept, f"{c['trainer'].root}:"]


def test_a_run_completes_on_workers_that_share_nothing_but_temporal_and_s3(
    cluster: tuple[Cluster, dict[str, str]],
) -> None:
    c, env = cluster
    run_id = f"cluster-{uuid.uuid4().hex[:6]}"
    try:
        out = c["client"].run(
            [PYTHON, str(HERE / "client.py"), run_id, str(STEPS)], env, timeout=900, cwd=REPO
        )
    except (RuntimeError, TimeoutError) as err:
        raise AssertionError(f"{err}\n{logs(c)}") from err
    report = json.loads(out.strip().splitlines()[-1])
    assert report["phase"] == "done" and report["step"] == STEPS, logs(c)
    assert [h["step"] for h in report["history"]] == list(range(1, STEPS + 1))
    assert all(h["n_trajectories"] == 8 for h in report["history"])
    assert report["trajectories"] == [True] * STEPS
    assert report["manifests"] == [True] * (STEPS + 1)
    for role in ROLES:
        assert all(p.poll() is None for p in c[role].processes), f"{role} worker died:\n{logs(c)}"
