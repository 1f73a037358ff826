"""An inference worker whose server dies starts it again and serves the adapters it had loaded: a real worker,
a real CPU server killed with SIGKILL, a real reload through Temporal."""

from __future__ import annotations

import asyncio
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import psutil
from temporalio import workflow
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities.object_store import ObjectStore
from host.processes import free_port
from schemas.activities import ReloadInput, ReloadResult
from schemas.config import Scheduling, TaskQueues
from schemas.settings import S3Settings
from serving.client import ServingClient
from workers.stack import EmbeddedStack
from workers.temporal import connect_client
from workers.worker import WorkerOptions, run_workers
from workflows.stages import RELOAD, run_stage

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serving"))
from serving_adapters import random_adapter


@workflow.defn(sandboxed=False)
class Reload:
    @workflow.run
    async def run(self, queue: str, inp: ReloadInput) -> ReloadResult:
        return await run_stage(
            RELOAD,
            inp,
            task_queue=queue,
            step=inp.checkpoint.step,
            scheduling=Scheduling(),
            result_type=ReloadResult,
        )


def server_pid(port: int) -> int:
    for conn in psutil.net_connections("tcp"):
        if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
            return conn.pid
    raise AssertionError(f"nothing listens on port {port}")


async def test_a_dead_server_is_restarted_with_its_adapters(
    stack: EmbeddedStack, s3_settings: S3Settings, task_queue: str, tmp_path: Path
) -> None:
    client = await connect_client(address=stack.temporal_address)
    queues = TaskQueues(control=f"{task_queue}-c", inference=f"{task_queue}-i", trainer=f"{task_queue}-t")
    port, stop = free_port(), asyncio.Event()
    opts = WorkerOptions(role="inference", task_queues=queues, serve_port=port)
    worker = asyncio.create_task(run_workers(opts, client, stop))
    served = ServingClient(f"http://127.0.0.1:{port}")
    try:
        for _ in range(600):
            if await served.health():
                break
            await asyncio.sleep(0.5)
        run_id, model = f"restart-{uuid.uuid4().hex[:6]}", "kept"
        ref = ObjectStore(s3_settings).publish_checkpoint(random_adapter(tmp_path / "a", seed=2), run_id, 1)
        async with Worker(
            client,
            task_queue=f"{task_queue}-wf",
            workflows=[Reload],
            workflow_runner=UnsandboxedWorkflowRunner(),
        ):
            result = await client.execute_workflow(
                Reload.run,
                args=[queues.inference, ReloadInput(model_name=model, checkpoint=ref)],
                id=f"reload-{uuid.uuid4().hex[:8]}",
                task_queue=f"{task_queue}-wf",
                result_type=ReloadResult,
                execution_timeout=timedelta(minutes=5),
            )
        assert result.adapter in await served.adapters()

        dead = server_pid(port)
        psutil.Process(dead).kill()  # a crash: the worker gets no word of it
        for _ in range(600):
            if await served.health() and result.adapter in await served.adapters():
                break
            await asyncio.sleep(0.5)
        assert server_pid(port) != dead
        assert result.adapter in await served.adapters()
        assert not worker.done()
    finally:
        stop.set()
        await asyncio.wait_for(worker, 60)
