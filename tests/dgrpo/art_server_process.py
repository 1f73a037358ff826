"""``dgrpo art-server`` as a process for tests, a client of ART's protocol that sends what ART's clients send
(ART 0.4's ``art.Backend``, NeMo Agent Toolkit's ``RemoteBackend``: the model as ``safe_model_dump()``, groups as
``model_dump()``), each call one HTTP request, and rollouts through the server's OpenAI endpoint."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import httpx
from openai import AsyncOpenAI

from examples.shaping import closeness
from host.processes import HOST, ChildProcess, free_port
from schemas.trajectory import Trajectory, TrajectoryGroup

REPO = Path(__file__).resolve().parents[2]
WORDS = ("apple", "river")


class ArtServer:
    """One ``dgrpo art-server`` on free loopback ports (``host`` another loopback address, ``openai_port`` a given
    port, when given)."""

    def __init__(
        self,
        log: Path,
        args: list[str],
        env: dict[str, str] | None = None,
        host: str = HOST,
        openai_port: int | None = None,
    ) -> None:
        self.host = host
        self.port, self.openai_port = free_port(), openai_port or free_port()
        argv = [sys.executable, "-m", "dgrpo.cli", "art-server", "--host", host, "--port", str(self.port),
                "--openai-port", str(self.openai_port), *args]  # fmt: skip
        self.process = ChildProcess(
            argv, log, name="dgrpo art-server", env=env, cwd=REPO, tied_to_parent=True
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def openai_url(self) -> str:
        return f"http://{self.host}:{self.openai_port}/v1"

    def start(self, timeout_s: float = 300.0) -> ArtServer:
        self.process.spawn()
        self.process.wait_until(self.answers, timeout_s)
        return self

    def answers(self) -> bool:
        try:
            return httpx.get(f"{self.url}/healthcheck", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        self.process.stop(timeout_s=30)

    def kill(self) -> None:
        self.process.kill()


def art_model(
    name: str, project: str, base_model: str = "smollm2-135m-instruct", **fields: Any
) -> dict[str, Any]:
    """A ``TrainableModel`` as ART 0.5.17's ``safe_model_dump(mode="json")`` has it."""
    return {
        "name": name, "project": project, "entity": None, "id": None, "run_id": None, "config": None,
        "trainable": True, "inference_api_key": None, "inference_base_url": None, "inference_model_name": None,
        "base_path": "/somewhere/on/the/client", "report_metrics": None, "base_model": base_model,
        "_internal_config": None, **fields,
    }  # fmt: skip


class ArtProtocolClient:
    """ART's backend calls over HTTP, as ART's clients make them."""

    def __init__(self, url: str, api_key: str | None = None) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.AsyncClient(base_url=url, headers=headers, timeout=httpx.Timeout(30.0, read=None))

    async def post(self, path: str, body: Any) -> Any:
        response = await self.http.post(path, json=body)
        response.raise_for_status()
        return response.json()

    async def train(self, model: dict[str, Any], groups: list[dict[str, Any]], **config: Any) -> list[Any]:
        """``/_train_model``: the NDJSON rows."""
        body = {
            "model": model,
            "trajectory_groups": groups,
            "config": config,
            "dev_config": {},
            "verbose": False,
        }
        rows = []
        async with self.http.stream("POST", "/_train_model", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                response.raise_for_status()
            async for line in response.aiter_lines():
                if line:
                    rows.append(json.loads(line))
        return rows

    async def aclose(self) -> None:
        await self.http.aclose()


async def sampled_groups(openai_url: str, name: str, size: int = 3) -> list[dict[str, Any]]:
    """A group per word: ``size`` replies of the served model, asked for by the model's name, each a
    trajectory rewarded by how close it came to the word; as ART's clients send them (``model_dump``)."""
    sdk = AsyncOpenAI(base_url=openai_url, api_key="default", max_retries=0)
    groups = []
    for word in WORDS:
        asked = {"role": "user", "content": f"Reply with the single word '{word}' and nothing else."}
        trajectories = []
        for _ in range(size):
            reply = await sdk.chat.completions.create(
                model=name,
                messages=[asked],
                max_tokens=6,
                temperature=1.0,  # type: ignore[list-item]
            )
            reward = closeness(reply.choices[0].message.content or "", [word])
            trajectories.append(Trajectory(messages_and_choices=[asked, reply.choices[0]], reward=reward))
        groups.append(TrajectoryGroup(trajectories).model_dump(mode="json"))
    await sdk.close()
    return groups


async def answering_model(openai_url: str, name: str) -> str:
    """The served model that answers a request for ``name`` (the response's ``model``)."""
    sdk = AsyncOpenAI(base_url=openai_url, api_key="default", max_retries=0)
    reply = await sdk.chat.completions.create(
        model=name, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
    )
    await sdk.close()
    return reply.model
