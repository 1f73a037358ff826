"""Where a ``TrainableModel`` trains and is served: the embedded stack on this machine, or a Temporal cluster.

Both backends give the client the same three things: a Temporal client (pydantic data converter), the
object store the workers use, and the inference server's OpenAI-compatible URL. ``LocalBackend`` starts
what is missing (the embedded stack, the three workers) and stops only what it started;
``TemporalBackend`` starts nothing. ``LocalBackend`` lives in dgrpo/local/, ``TemporalBackend`` in
dgrpo/client/temporal_backend.py; ART's ``backend.train`` and ``backend.train_sft``, and the seam a model asks
(``train_step``, ``_train_sft``, ``_get_step``), are added to both in dgrpo/client/training.py.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

from activities.object_store import ObjectStore
from dgrpo.errors import BackendError
from dgrpo.types import TrainSFTConfig
from schemas.config import TaskQueues, TrainConfig
from schemas.run_state import TrainStepResult
from schemas.settings import ENV_INFERENCE_URL, S3Settings, TemporalSettings
from schemas.trajectory import Trajectory, TrajectoryGroup
from serving.client import ServingClient
from workers.temporal import connect_client

log = logging.getLogger(__name__)


class ArtBackend(Protocol):
    """ART's ``art.Backend``: the hooks ART's model calls, and so dgrpo's models too (dgrpo/model.py). A backend
    of ART's own (NeMo Agent Toolkit's ``RemoteBackend``, a client of ART's ``art run`` server) has these and
    nothing more; dgrpo's backends implement them on the cluster (dgrpo/client/training.py). ``model`` is a
    ``Model`` or ``TrainableModel``, typed Any here as dgrpo/model.py is built on this module."""

    def _model_inference_name(self, model: Any, step: int | None = None) -> str:
        """The name the inference server answers the model's ``step`` (None: its newest) under."""
        ...

    async def close(self) -> None: ...

    async def register(self, model: Any) -> None:
        """Bind ``model`` to this backend (ART's ``model.register`` calls it first)."""
        ...

    async def _prepare_backend_for_training(
        self, model: Any, config: Mapping[str, Any] | None
    ) -> tuple[str, str]:
        """Make the model servable and trainable; its inference server's OpenAI base URL and API key.
        ``config`` is ART's ``dev.OpenAIServerConfig`` (``register(..., _openai_client_config=)``)."""
        ...

    async def _get_step(self, model: Any) -> int:
        """The model's current step."""
        ...

    async def _delete_checkpoint_files(self, model: Any, steps_to_keep: list[int]) -> Any:
        """Delete the model's checkpoints but ``steps_to_keep``."""
        ...

    def _train_model(
        self,
        model: Any,
        trajectory_groups: list[TrajectoryGroup],
        config: Any,
        dev_config: Mapping[str, Any],
        verbose: bool = False,
    ) -> AsyncIterator[dict[str, float]]:
        """Train the model's next RL step on the groups, yielding its metric rows (ART 0.5.17's hook of
        ``model.train``; ``config`` is the step's ``TrainConfig``, ``dev_config`` ART's ``dev.TrainConfig``)."""
        ...

    def _train_sft(
        self,
        model: Any,
        trajectories: Iterable[Trajectory],
        config: TrainSFTConfig,
        dev_config: Mapping[str, Any],
        verbose: bool = False,
    ) -> AsyncIterator[dict[str, float]]:
        """Fine-tune ``model`` on the trajectories as its next step, yielding each batch's numbers."""
        ...


@runtime_checkable
class Backend(ArtBackend, Protocol):
    """dgrpo's own backends (``LocalBackend``, ``TemporalBackend``): ART's hooks, and what a ``TrainableModel``
    needs to train durably on them (a ``model.train`` there is a ``TrainStep`` workflow, awaited across
    Temporal restarts). A model tells them from a backend of ART's own by this protocol."""

    task_queues: TaskQueues

    async def start(self) -> None:
        """Make the backend usable (idempotent); ``register`` calls it."""
        ...

    async def temporal_client(self) -> Client: ...

    def object_store(self) -> ObjectStore: ...

    def inference_url(self) -> str:
        """The OpenAI-compatible base URL (ending in ``/v1``) the model's requests go to."""
        ...

    # dgrpo's own: what ``model.train`` asks its backend for (ART 0.3's ``model.train``; ART 0.5 has only
    # ``backend.train``), returning the step's ``TrainStepResult``.
    async def train_step(
        self,
        model: Any,
        trajectory_groups: Iterable[TrajectoryGroup],
        config: TrainConfig,
        *,
        history: bool,
    ) -> TrainStepResult:
        """Train ``model``'s next GRPO step on the groups; returns once its adapter is served."""
        ...


async def connect(address: str, namespace: str, tls: bool, api_key: str | None) -> Client:
    """``connect_client``, with a failure the client's user can act on."""
    try:
        return await connect_client(address=address, namespace=namespace, tls=tls, api_key=api_key)
    except RuntimeError as err:
        raise BackendError(
            f"cannot connect to Temporal at {address} (namespace {namespace!r}): {err}"
        ) from err


async def wait_for_workers(client: Client, queues: TaskQueues, within_s: float) -> None:
    """Wait until the control queue has a workflow poller and every queue an activity poller."""
    wanted = [
        (queues.control, TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW),
        (queues.control, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY),
        (queues.inference, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY),
        (queues.trainer, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY),
    ]
    deadline = time.monotonic() + within_s
    while True:
        missing = []
        for name, kind in wanted:
            request = DescribeTaskQueueRequest(
                namespace=client.namespace, task_queue=TaskQueue(name=name), task_queue_type=kind
            )
            response = await client.workflow_service.describe_task_queue(request)
            if not response.pollers:
                missing.append(name)
        if not missing:
            return
        if time.monotonic() > deadline:
            raise BackendError(
                f"no worker polls task queue(s) {sorted(set(missing))} after {within_s:.0f}s; start them with "
                "`dgrpo worker all` (or control/inference/trainer) where the stack or cluster runs"
            )
        await asyncio.sleep(1.0)


async def wait_for_server(url: str, within_s: float) -> None:
    """Wait until the inference server at ``url`` answers ``/health``."""
    try:
        await ServingClient(url).wait_healthy(within_s)
    except TimeoutError:
        raise BackendError(f"the inference server at {url} did not answer in {within_s:.0f}s") from None


class ClusterBackend:
    """An existing Temporal cluster with ``dgrpo worker`` processes running there (e.g. on a GPU box).

    S3 settings come from ``DGRPO_S3_*`` and the server URL from ``inference_url`` or ``DGRPO_INFERENCE_URL``,
    as the client reaches them (a tunnel or load balancer in front of the GPU box's vLLM).
    """

    def __init__(
        self,
        address: str | None = None,
        namespace: str | None = None,
        *,
        tls: bool = False,
        api_key: str | None = None,
        inference_url: str | None = None,
        s3: S3Settings | None = None,
        task_queues: TaskQueues | None = None,
        worker_timeout: float = 60.0,
    ) -> None:
        env = TemporalSettings.from_env()
        self.address = address or env.address
        self.namespace = namespace or env.namespace
        self.tls = tls
        self.api_key = api_key
        self.task_queues = task_queues or TaskQueues()
        self.worker_timeout = worker_timeout
        self._inference_url = inference_url
        self._s3 = s3
        self._client: Client | None = None
        self._store: ObjectStore | None = None

    async def start(self) -> None:
        client = await self.temporal_client()
        await wait_for_workers(client, self.task_queues, self.worker_timeout)
        await wait_for_server(self.inference_url(), self.worker_timeout)

    async def temporal_client(self) -> Client:
        if self._client is None:
            self._client = await connect(self.address, self.namespace, self.tls, self.api_key)
        return self._client

    def object_store(self) -> ObjectStore:
        if self._store is None:
            try:
                self._store = ObjectStore(self._s3 or S3Settings.from_env())
            except KeyError as err:
                raise BackendError(
                    f"TemporalBackend needs the workers' object store: {err.args[0]}"
                ) from None
        return self._store

    def inference_url(self) -> str:
        url = self._inference_url or os.environ.get(ENV_INFERENCE_URL)
        if not url:
            raise BackendError(
                f"TemporalBackend needs the inference server's URL: pass inference_url=... or set {ENV_INFERENCE_URL}"
            )
        return url

    async def close(self) -> None:
        self._client = None

    async def __aenter__(self) -> ClusterBackend:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
