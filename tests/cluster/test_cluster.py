"""A run on a cluster whose hosts share nothing but Temporal and S3 (tests/cluster/netns.py): host 1 runs the
stack, hosts 2-4 a control, an inference and a trainer worker started as ``dgrpo worker ROLE`` (what
deploy/cluster/compose.yaml runs), host 5 the client. Each host has its own address, hostname, /tmp and
directories, and cannot see another's files. The inference host's server binds every interface
(``DGRPO_SERVE_HOST=0.0.0.0``, with ``DGRPO_SERVE_API_KEY``): the control host's RULER judge and the client host's
ART program reach it at the inference host's address."""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fleet import HERE, PYTHON, REPO, image_cache, logs, start_stack, start_worker, wait_healthy
from netns import Cluster

from schemas.settings import ENV_INFERENCE_URL, ENV_SERVE_API_KEY, ENV_SERVE_HOST, ENV_SERVE_PORT

pytestmark = pytest.mark.slow
ROLES = ("control", "inference", "trainer")
STEPS = 2
PROJECT = "cluster"
SERVE_PORT = 8000
"""The inference server's port, as deploy/cluster/compose.yaml and deploy/k8s/inference.yaml set it."""


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[Cluster, dict[str, str]]]:
    """The cluster and the client host's environment: Temporal, S3, and the inference server's URL and key."""
    with Cluster(["stack", *ROLES, "client"], image_cache=image_cache()) as c:
        env = start_stack(c)
        # as deploy/cluster/compose.yaml: the server's key goes to whoever talks to the server, its URL to
        # whoever reaches it from another host
        key = {ENV_SERVE_API_KEY: secrets.token_hex(16)}
        url = {ENV_INFERENCE_URL: f"http://{c['inference'].address}:{SERVE_PORT}/v1"}
        own = {
            "control": {**key, **url},
            "inference": {**key, ENV_SERVE_HOST: "0.0.0.0", ENV_SERVE_PORT: str(SERVE_PORT)},
            "trainer": {},
        }
        for role in ROLES:
            start_worker(c[role], role, {**env, **own[role]})
        for role in ROLES:
            wait_healthy(c[role], role, env)
        yield c, {**env, **key, **url}


@pytest.fixture(scope="module")
def trained(cluster: tuple[Cluster, dict[str, str]]) -> tuple[str, dict[str, Any]]:
    """A run of STEPS steps started from the client host, judged by RULER on the inference host's server:
    the model's name and the client's report."""
    c, env = cluster
    name = uuid.uuid4().hex[:6]
    try:
        out = c["client"].run(
            [PYTHON, str(HERE / "client.py"), PROJECT, name, str(STEPS)], env, timeout=900, cwd=REPO
        )
    except (RuntimeError, TimeoutError) as err:
        raise AssertionError(f"{err}\n{logs(c)}") from err
    return name, json.loads(out.strip().splitlines()[-1])


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
    cluster: tuple[Cluster, dict[str, str]], trained: tuple[str, dict[str, Any]]
) -> None:
    c, _ = cluster
    _, report = trained
    assert report["phase"] == "done" and report["step"] == STEPS, logs(c)
    assert [h["step"] for h in report["history"]] == list(range(1, STEPS + 1))
    assert all(h["n_trajectories"] == 8 for h in report["history"])
    assert report["trajectories"] == [True] * STEPS
    assert report["manifests"] == [True] * (STEPS + 1)
    for role in ROLES:
        assert all(p.poll() is None for p in c[role].processes), f"{role} worker died:\n{logs(c)}"
    # the control host's judge scored every trajectory through the inference host's server (a reply it
    # could not read still counts: judge_fallback 1); a judge it could not reach fails the run instead
    assert [len(j) for j in report["judged"]] == [8] * STEPS, report["judged"]
    assert all("judge_fallback" in t for j in report["judged"] for t in j)
    fallbacks = [sum(t["judge_fallback"] for t in j) for j in report["judged"]]
    print(f"\nRULER from the control host: trajectories it could not score, per step: {fallbacks} of 8")


def test_an_art_client_on_another_host_chats_with_the_served_adapter(
    cluster: tuple[Cluster, dict[str, str]], trained: tuple[str, dict[str, Any]]
) -> None:
    """``TemporalBackend`` from the client host, and ``model.openai_client()`` through the inference host's
    routable address: the answer comes from the run's newest adapter, ``<run id>@<step>``."""
    c, env = cluster
    name, _ = trained
    try:
        out = c["client"].run(
            [PYTHON, str(HERE / "art_client.py"), PROJECT, name], env, timeout=300, cwd=REPO
        )
    except (RuntimeError, TimeoutError) as err:
        raise AssertionError(f"{err}\n{logs(c)}") from err
    seen = json.loads(out.strip().splitlines()[-1])
    adapter = f"{PROJECT}-{name}@{STEPS}"
    assert seen["step"] == STEPS and seen["inference_name"] == adapter
    assert seen["base_url"] == env[ENV_INFERENCE_URL]
    assert adapter in seen["served"] and seen["answered_by"] == adapter
    assert seen["content"] and seen["logprobs"] > 0
