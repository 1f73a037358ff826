"""The newest step under the model's own name on vLLM too: ``dgrpo art-server`` in front of the session's
``dgrpo worker all --engine vllm`` (a cluster's, reached as ``TemporalBackend`` reaches one), one step trained
through ``/_train_model``, then ``<name>`` answered by that step's adapter on vLLM and ``<name>@0`` by the base."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from dgrpo.client.model_base import run_id_of
from schemas.config import TaskQueues
from schemas.settings import ENV_INFERENCE_URL, ENV_SERVE_API_KEY
from tests.dgrpo.art_server_process import (
    ArtProtocolClient,
    ArtServer,
    answering_model,
    art_model,
    sampled_groups,
)
from workers.launcher import WorkerProcess

pytestmark = pytest.mark.slow


@pytest.fixture
def art_server_on_vllm(
    vllm_worker: WorkerProcess, vllm_queues: TaskQueues, vllm_api_key: str, tmp_path: Path
) -> Iterator[ArtServer]:
    queues = ["--control-queue", vllm_queues.control, "--inference-queue", vllm_queues.inference,
              "--trainer-queue", vllm_queues.trainer]  # fmt: skip
    env = {**os.environ, ENV_INFERENCE_URL: vllm_worker.server_urls[0], ENV_SERVE_API_KEY: vllm_api_key}
    args = ["--backend", "temporal", *queues, "--art-path", str(tmp_path / "art")]
    server = ArtServer(tmp_path / "server.log", args, env=env)
    try:
        yield server.start()
    finally:
        server.stop()


async def test_vllm_serves_the_newest_step_under_the_models_name(art_server_on_vllm: ArtServer) -> None:
    server = art_server_on_vllm
    name, project = "vllm-word", "art-server"
    # rank 8: the session's vLLM worker takes adapters up to --max-lora-rank 8
    model = art_model(name, project, _internal_config={"peft_args": {"r": 8, "lora_alpha": 16}})
    client = ArtProtocolClient(server.url)
    await client.post("/register", model)
    base = await answering_model(server.openai_url, name)
    assert "@" not in base
    rows = await client.train(model, await sampled_groups(server.openai_url, name), learning_rate=2e-4)
    assert rows[0]["data/step_skipped"] == 0.0, rows
    assert await client.post("/_get_step", model) == 1
    assert await answering_model(server.openai_url, name) == f"{run_id_of(project, name)}@1"
    assert await answering_model(server.openai_url, f"{name}@0") == base
    await client.aclose()
