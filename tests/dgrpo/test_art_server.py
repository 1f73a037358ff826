"""``dgrpo art-server``, a real one in front of the tests' shared ``LocalBackend`` (``held_backend``), called as ART's
clients call ART's ``art run`` server: a model registered and served under its own name, trained through
``/_train_model`` (each call one durable ``TrainStep`` on SmolLM2-135M), and a call made again (the same request
repeated, a client that lost its connection mid-train, a server killed mid-train and started again) answered with
the same step, never a second training."""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from openai import AsyncOpenAI
from temporalio.client import Client, WorkflowExecutionStatus

from activities.object_store import ObjectStore
from dgrpo.art_server.models import ServedModels
from dgrpo.art_server.openai_api import openai_app
from dgrpo.client.attach import workflow_status
from dgrpo.client.model_base import run_id_of
from dgrpo.client.temporal_backend import TemporalBackend
from dgrpo.client.train_step import train_workflow_id
from host.processes import HOST
from schemas.settings import ENV_ART_SERVER_API_KEY, ENV_TEMPORAL_ADDRESS
from tests.dgrpo.art_server_process import (
    REPO,
    ArtProtocolClient,
    ArtServer,
    answering_model,
    art_model,
    sampled_groups,
)
from tests.examples.stored_run import stored_run
from workers.stack import EmbeddedStack

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def art_server(held_backend: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ArtServer]:
    base = tmp_path_factory.mktemp("art-server")
    args = ["--path", str(held_backend), "--art-path", str(base / "art")]
    server = ArtServer(base / "server.log", args, env={**os.environ, "BACKUP_BUCKET": "art-server-backups"})
    try:
        yield server.start()
    finally:
        server.stop()


@pytest_asyncio.fixture(loop_scope="session")
async def temporal(held_backend: Path) -> AsyncIterator[Client]:
    yield await Client.connect(EmbeddedStack(held_backend).temporal_address)


async def runs_of(temporal: Client, workflow_id: str) -> int:
    """How many runs of ``workflow_id`` Temporal has (a second training of a step would be a second run)."""
    return len([w async for w in temporal.list_workflows(f"WorkflowId = '{workflow_id}'")])


async def test_a_model_is_served_under_its_name_and_trains_through_the_server(
    art_server: ArtServer, held_backend: Path, temporal: Client
) -> None:
    name, project = "served-word", "art-server"
    run_id, model = run_id_of(project, name), art_model(name, project)
    client = ArtProtocolClient(art_server.url)
    assert await client.post("/register", model) is None
    # ART's register asks where the model's requests go: this server's OpenAI endpoint, the address it reached
    assert await client.post("/_prepare_backend_for_training", {"model": model, "config": None}) == [
        art_server.openai_url,
        "default",
    ]
    assert await client.post("/_get_step", model) == 0
    base = await answering_model(art_server.openai_url, name)  # step 0 of a fresh LoRA: the base model
    assert base != name and "@" not in base

    groups = await sampled_groups(art_server.openai_url, name)
    rows = await client.train(model, groups, learning_rate=2e-4)
    assert len(rows) == 1 and rows[0]["data/step_skipped"] == 0.0 and "loss/train" in rows[0], rows
    assert await client.post("/_get_step", model) == 1
    # the newest step under the model's own name, each step under <name>@<step>, as ART's server names them
    assert await answering_model(art_server.openai_url, name) == f"{run_id}@1"
    assert await answering_model(art_server.openai_url, f"{name}@0") == base
    cards = (await httpx.AsyncClient().get(f"{art_server.openai_url}/models")).json()["data"]
    assert {c["id"]: c["parent"] for c in cards if c["id"].startswith(name)} == {
        name: f"{run_id}@1",
        f"{name}@1": f"{run_id}@1",
    }

    # the same request again is the same step: its rows, no second training
    assert await client.train(model, groups, learning_rate=2e-4) == rows
    assert await client.post("/_get_step", model) == 1
    handle = temporal.get_workflow_handle(train_workflow_id(run_id, 2))
    assert await workflow_status(handle) is None
    assert stored_run(held_backend, run_id)[1] == [1]
    # ART's delete_checkpoints keeps the newest and the best; the step served is kept whatever it is told
    await client.post("/_delete_checkpoint_files", {"model": model, "steps_to_keep": []})
    assert stored_run(held_backend, run_id)[1] == [1]
    await client.aclose()


async def train_step_started(temporal: Client, run_id: str, step: int) -> None:
    handle = temporal.get_workflow_handle(train_workflow_id(run_id, step))
    while True:
        if await workflow_status(handle) == WorkflowExecutionStatus.RUNNING:
            return
        await asyncio.sleep(0.2)


async def test_a_client_that_lost_its_connection_mid_train_gets_the_same_step(
    art_server: ArtServer, held_backend: Path, temporal: Client
) -> None:
    name, project = f"cut-{uuid.uuid4().hex[:6]}", "art-server"
    run_id, model = run_id_of(project, name), art_model(name, project)
    client = ArtProtocolClient(art_server.url)
    await client.post("/register", model)
    groups = await sampled_groups(art_server.openai_url, name)
    first = asyncio.create_task(client.train(model, groups, learning_rate=2e-4))
    await asyncio.wait_for(train_step_started(temporal, run_id, 1), timeout=120)
    first.cancel()  # the client's connection goes while the step trains
    with pytest.raises(asyncio.CancelledError):
        await first
    await client.aclose()

    again = ArtProtocolClient(art_server.url)
    rows = await again.train(model, groups, learning_rate=2e-4)
    assert len(rows) == 1 and rows[0]["data/step_skipped"] == 0.0
    assert await again.post("/_get_step", model) == 1
    assert await runs_of(temporal, train_workflow_id(run_id, 1)) == 1
    assert await workflow_status(temporal.get_workflow_handle(train_workflow_id(run_id, 2))) is None
    assert stored_run(held_backend, run_id)[1] == [1]
    await again.aclose()


async def test_a_server_killed_mid_train_and_started_again_gives_the_same_step(
    held_backend: Path, temporal: Client, tmp_path: Path
) -> None:
    name, project = f"killed-{uuid.uuid4().hex[:6]}", "art-server"
    run_id, model = run_id_of(project, name), art_model(name, project)
    args = ["--path", str(held_backend), "--art-path", str(tmp_path / "art")]
    server = ArtServer(tmp_path / "first.log", args).start()
    client = ArtProtocolClient(server.url)
    try:
        await client.post("/register", model)
        groups = await sampled_groups(server.openai_url, name)
        first = asyncio.create_task(client.train(model, groups, learning_rate=2e-4))
        await asyncio.wait_for(train_step_started(temporal, run_id, 1), timeout=120)
        server.kill()  # SIGKILL: the server's state is gone, the TrainStep runs on in the workers
        with pytest.raises(httpx.HTTPError):
            await first
    finally:
        server.kill()
        await client.aclose()

    restarted = ArtServer(tmp_path / "second.log", args).start()
    again = ArtProtocolClient(restarted.url)
    try:
        rows = await again.train(model, groups, learning_rate=2e-4)
        assert len(rows) == 1 and rows[0]["data/step_skipped"] == 0.0
        assert await again.post("/_get_step", model) == 1
        assert await answering_model(restarted.openai_url, name) == f"{run_id}@1"
    finally:
        await again.aclose()
        restarted.stop()
    assert await runs_of(temporal, train_workflow_id(run_id, 1)) == 1
    assert await workflow_status(temporal.get_workflow_handle(train_workflow_id(run_id, 2))) is None
    assert stored_run(held_backend, run_id)[1] == [1]


async def test_bad_requests_are_refused_saying_why_and_store_nothing(
    art_server: ArtServer, held_backend: Path, temporal: Client
) -> None:
    async with httpx.AsyncClient(base_url=art_server.url, timeout=60) as http:
        refused = await http.post("/register", json=art_model("../etc", "art-server"))
        assert refused.status_code == 400 and "cannot name a run" in refused.json()["detail"]

        name, project = "bad-input", "art-server"
        model, run_id = art_model(name, project), run_id_of(project, name)
        asked = {"role": "user", "content": "Hi"}
        typo = {"trajectories": [{"messages_and_choices": [asked], "reward": 1.0, "rewrad": 0.5}]}
        body = {"model": model, "trajectory_groups": [typo], "config": {}, "dev_config": {}}
        refused = await http.post("/_train_model", json=body)
        assert refused.status_code == 400 and "rewrad" in refused.json()["detail"]
        # an ART option dgrpo has no equivalent for changes what is trained: refused, naming it
        good = {"trajectories": [{"messages_and_choices": [asked], "reward": 1.0}]}
        body = {**body, "trajectory_groups": [good], "dev_config": {"plot_tensors": True}}
        refused = await http.post("/_train_model", json=body)
        assert refused.status_code == 400 and "plot_tensors" in refused.json()["detail"]
        # ART 0.5.23's KL-penalized advantage, which dgrpo does not have, likewise
        body = {**body, "config": {"learning_rate": 1e-5, "kl_penalty_coef": 0.5}, "dev_config": {}}
        refused = await http.post("/_train_model", json=body)
        assert refused.status_code == 400 and "kl_penalty_coef" in refused.json()["detail"]
        # backups go to the server operator's bucket only, reached with the operator's credentials
        body = {"model": model, "s3_bucket": "someone-elses-bucket"}
        refused = await http.post("/_experimental_push_to_s3", json=body)
        assert refused.status_code == 400 and "BACKUP_BUCKET" in refused.json()["detail"]
        # a model's local files are the server's: a name that is a path is refused, trainable or not
        for path in ("/_experimental_push_to_s3", "/_experimental_pull_from_s3"):
            escaping = {**art_model("../../../tmp", project), "trainable": False}
            refused = await http.post(path, json={"model": escaping})
            assert refused.status_code == 400 and "cannot name a run" in refused.json()["detail"]
    # nothing of the refused calls is in the store (no step's record, input or checkpoint), nor in Temporal
    store = ObjectStore(EmbeddedStack(held_backend).s3_settings)
    assert store.list(f"runs/{run_id}/") == []
    assert await workflow_status(temporal.get_workflow_handle(train_workflow_id(run_id, 1))) is None


async def test_a_name_two_projects_registered_names_neither(art_server: ArtServer) -> None:
    client = ArtProtocolClient(art_server.url)
    for project in ("team-a", "team-b"):
        await client.post("/register", art_model("twin", project))
    await client.aclose()
    async with httpx.AsyncClient(timeout=60) as http:
        body = {"model": "twin", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        answer = await http.post(f"{art_server.openai_url}/chat/completions", json=body)
    assert answer.status_code == 409, answer.text
    message = answer.json()["error"]["message"]
    assert run_id_of("team-a", "twin") in message and run_id_of("team-b", "twin") in message


async def test_the_server_wants_its_api_key(held_backend: Path, tmp_path: Path) -> None:
    key = secrets.token_hex(8)
    args = ["--path", str(held_backend), "--art-path", str(tmp_path / "art")]
    server = ArtServer(tmp_path / "server.log", args, env={**os.environ, ENV_ART_SERVER_API_KEY: key}).start()
    model = art_model("keyed", "art-server")
    try:
        async with httpx.AsyncClient(timeout=60) as http:
            assert (await http.get(f"{server.url}/healthcheck")).status_code == 200
            assert (await http.get(f"{server.openai_url.removesuffix('/v1')}/health")).status_code == 200
            for headers in ({}, {"Authorization": "Bearer wrong"}):
                assert (
                    await http.post(f"{server.url}/register", json=model, headers=headers)
                ).status_code == 401
                assert (await http.get(f"{server.openai_url}/models", headers=headers)).status_code == 401
        client = ArtProtocolClient(server.url, api_key=key)
        await client.post("/register", model)
        prepared = await client.post("/_prepare_backend_for_training", {"model": model, "config": None})
        assert prepared == [
            server.openai_url,
            key,
        ]  # the key the endpoint wants, as ART's server returns its own
        await client.aclose()
        sdk = AsyncOpenAI(base_url=server.openai_url, api_key=key, max_retries=0)
        reply = await sdk.chat.completions.create(
            model="keyed", messages=[{"role": "user", "content": "Hi"}], max_tokens=2
        )
        assert reply.choices[0].message.content is not None
        await sdk.close()
    finally:
        server.stop()


def test_the_command_refuses_an_exposed_server_without_a_key_and_a_taken_port() -> None:
    # Refused before any backend starts; were it not, this cluster's Temporal refuses the connection at once.
    env = {k: v for k, v in os.environ.items() if k != ENV_ART_SERVER_API_KEY}
    env[ENV_TEMPORAL_ADDRESS] = f"{HOST}:9"
    command = [sys.executable, "-m", "dgrpo.cli", "art-server", "--backend", "temporal"]
    done = subprocess.run([*command, "--host", "0.0.0.0"], env=env, capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 2 and "--api-key" in done.stderr, done.stderr
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        done = subprocess.run(
            [*command, "--openai-port", port], env=env, capture_output=True, text=True, cwd=REPO
        )
    assert done.returncode == 2 and f"cannot listen on {HOST}:{port}" in done.stderr, done.stderr


async def test_the_endpoint_says_when_its_inference_server_does_not_answer(tmp_path: Path) -> None:
    with socket.socket() as gone:  # a port nothing listens on once closed
        gone.bind((HOST, 0))
        url = f"http://{HOST}:{gone.getsockname()[1]}"
    models = ServedModels(TemporalBackend(inference_url=url), str(tmp_path))
    transport = httpx.ASGITransport(app=openai_app(models, upstream_key=None, api_key=None))
    async with httpx.AsyncClient(transport=transport, base_url="http://art-server") as http:
        body = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Hi"}]}
        answer = await http.post("/v1/chat/completions", json=body)
    assert answer.status_code == 503
    assert "did not answer" in answer.json()["error"]["message"]
