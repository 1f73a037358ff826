"""NVIDIA NeMo Agent Toolkit's ART trainer (``nvidia-nat-openpipe-art`` 1.9.0, from PyPI, unchanged) trains
SmolLM2-135M on dgrpo: ``nat finetune`` with a NAT user's YAML (tests/nat/config.yml), its ``RemoteBackend``
talking to ``dgrpo art-server`` as to ART's ``art run``, its agent's LLM calls going to the server's OpenAI
endpoint on port 8000 under the model's name, with ``art`` meaning ``dgrpo`` (tests/art_alias). Two epochs:
the steps advance, their checkpoints are published, NAT's reward history is written.

NAT runs in its own environment (``deploy/install.sh --nat-only``: ``.venv-nat``, or ``$DGRPO_NAT_VENV``), so this
is a lane of its own (marker ``nat``, deselected by default; .ci/run runs ``pytest -m nat tests/nat``).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from temporalio.client import Client

from dgrpo.client.attach import started_input
from dgrpo.client.model_base import run_id_of
from dgrpo.client.train_step import train_workflow_id
from schemas.run_state import TrainStepInput
from tests.dgrpo.art_server_process import ArtServer, art_model
from tests.examples.stored_run import stored_run
from workers.stack import EmbeddedStack

pytestmark = [pytest.mark.slow, pytest.mark.nat]
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
NAT_VENV = Path(os.environ.get("DGRPO_NAT_VENV", REPO / ".venv-nat"))
OPENAI_PORT = 8000
"""NAT's ART adapter checks the server's health at ``http://<ip>:8000/v1/models`` whatever its YAML says."""
NAT_TIMEOUT_S = 600
EPOCHS, WORDS, GENERATIONS = 2, 2, 3


def loopback_address_with_port_free(port: int) -> str:
    """A 127.x.y.z address whose ``port`` is free (127.0.0.0/8 is all loopback): the server's OpenAI endpoint
    must be on port 8000, which another program may hold on 127.0.0.1."""
    for _ in range(50):
        host = f"127.{random.randint(1, 254)}.{random.randint(0, 254)}.{random.randint(1, 254)}"
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        return host
    raise RuntimeError(f"no loopback address with port {port} free")


def user_plugin(root: Path) -> Path:
    """The NAT user's plugin (tests/nat/word_agent.py) as NAT finds one: a distribution whose
    ``nat.components`` entry point names its module (a ``.dist-info`` on the path, as ``pip install`` leaves)."""
    info = root / "nat_dgrpo_word_agent-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: nat-dgrpo-word-agent\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[nat.components]\nword_agent = word_agent\n")
    return root


async def test_nat_trains_two_steps_through_the_art_server(held_backend: Path, tmp_path: Path) -> None:
    assert (NAT_VENV / "bin" / "nat").exists(), (
        f"no NeMo Agent Toolkit environment at {NAT_VENV}: build it with `bash deploy/install.sh --nat-only`"
    )
    host = loopback_address_with_port_free(OPENAI_PORT)
    args = ["--path", str(held_backend), "--art-path", str(tmp_path / "art")]
    server = ArtServer(tmp_path / "art-server.log", args, host=host, openai_port=OPENAI_PORT).start()
    try:
        started = time.monotonic()
        nat = await asyncio.to_thread(run_nat, host, server.port, tmp_path)
        print(f"nat finetune: {time.monotonic() - started:.0f} s")
        assert nat.returncode == 0, nat.stdout[-4000:]
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            step = (await client.post("/_get_step", json=art_model("word", "nat-lane"))).json()
    finally:
        server.stop()
    # NAT logs a failed step and returns 0 (its trainer stops at the failed epoch)
    assert not re.search(r"Training \S+ failed|Error during epoch", nat.stdout), nat.stdout[-4000:]

    # the steps advanced and each step's checkpoint was published (manifest read back from the store)
    run_id = run_id_of("nat-lane", "word")
    assert step == EPOCHS
    assert stored_run(held_backend, run_id)[1] == list(range(1, EPOCHS + 1))
    # NAT's reward history: an epoch each, each of every word's generations
    history = json.loads((tmp_path / "out" / "finetuning" / "reward_history.json").read_text())
    assert [row["epoch"] for row in history] == list(range(EPOCHS))
    assert all(row["num_trajectories"] == WORDS * GENERATIONS for row in history), history
    # NAT's adapter reads its YAML's learning rate with getattr from a dict: each step trained at 5e-5, on ART too
    assert await learning_rates(held_backend, run_id) == [5e-5] * EPOCHS


def run_nat(host: str, port: int, out: Path) -> subprocess.CompletedProcess[str]:
    """``nat finetune --config_file tests/nat/config.yml`` in NAT's environment, ``art`` meaning ``dgrpo``."""
    path = [str(REPO), str(REPO / "tests" / "art_alias"), str(HERE), str(user_plugin(out / "plugins"))]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(path),
        "DGRPO_ART_SERVER_IP": host,
        "DGRPO_ART_SERVER_PORT": str(port),
        "NAT_OUTPUT_DIR": str(out / "out"),
        "NAT_DATASET": str(HERE / "words.json"),
    }
    # --log-level WARNING: NAT 1.9.0's `nat finetune` at its default INFO fails every evaluation run with a
    # RecursionError (its config holds itself; docs/art-server.md), on ART as here
    argv = [str(NAT_VENV / "bin" / "nat"), "--log-level", "WARNING", "finetune", "--config_file",
            str(HERE / "config.yml")]  # fmt: skip
    with open(out / "nat.log", "w") as log:
        done = subprocess.run(
            argv, env=env, cwd=out, stdout=log, stderr=subprocess.STDOUT, timeout=NAT_TIMEOUT_S, text=True
        )
    return subprocess.CompletedProcess(argv, done.returncode, (out / "nat.log").read_text(), "")


async def learning_rates(held_backend: Path, run_id: str) -> list[float]:
    """Each step's learning rate, from its ``TrainStep`` workflow's input."""
    client = await Client.connect(EmbeddedStack(held_backend).temporal_address)
    rates = []
    for step in range(1, EPOCHS + 1):
        data = await started_input(client.get_workflow_handle(train_workflow_id(run_id, step)))
        rates.append(TrainStepInput.model_validate(data).train.learning_rate)
    return rates
