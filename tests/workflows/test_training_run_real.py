"""TrainingRun end to end: real Temporal, real S3, real `dgrpo worker all` (CPU server + trainer), real SmolLM2."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load
from telemetry_probe import Scraper, TraceCollector, moved, total, traced_client, two_free_ports
from temporalio.client import Client, WorkflowFailureError
from transformers import AutoModelForCausalLM

import dgrpo
from activities.object_store import ObjectStore
from base_models.resolve import ensure_smollm2
from dgrpo.client import run_control
from host.processes import HOST
from schemas.config import RunSpec, TaskQueues
from schemas.layout import MANIFEST_NAME, checkpoint_prefix, spec_key, trajectories_key
from schemas.run_state import RunStatus
from schemas.settings import ENV_HOME, EngineSettings, S3Settings
from serving.client import ServingClient
from tests.deploy.dashboard_checks import (
    HISTOGRAM_SUFFIXES,
    SDK_FAILURE_COUNTERS,
    dashboard_metrics,
    load_dashboard,
)
from workers.launcher import WorkerProcess
from workers.stack import EmbeddedStack
from workflows.training_run import TrainingRun

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
TEMPORAL = str(Path(sys.executable).parent / "temporal")


@pytest.fixture(scope="module")
def queues() -> TaskQueues:
    suffix = uuid.uuid4().hex[:8]
    return TaskQueues(
        control=f"it-control-{suffix}", inference=f"it-inference-{suffix}", trainer=f"it-trainer-{suffix}"
    )


@pytest.fixture(scope="module")
def traces() -> Iterator[TraceCollector]:
    collector = TraceCollector()
    collector.start()
    yield collector
    collector.stop()


@pytest.fixture(scope="module")
def metrics_port() -> int:
    """The worker's Prometheus endpoint (its trainer child's: the next port)."""
    return two_free_ports()


@pytest.fixture(scope="module")
def workers(
    stack: EmbeddedStack,
    queues: TaskQueues,
    tmp_path_factory: pytest.TempPathFactory,
    traces: TraceCollector,
    metrics_port: int,
) -> Iterator[WorkerProcess]:
    """``dgrpo worker all``, its metrics served and its traces exported (both processes)."""
    home = tmp_path_factory.mktemp("worker-home")
    env = {
        ENV_HOME: str(home),
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": traces.url,
        "OTEL_BSP_SCHEDULE_DELAY": "500",
    }
    proc = WorkerProcess(
        "all", home / "worker.log", task_queues=queues, env=env, cwd=REPO,
        extra_args=["--metrics-bind", f"{HOST}:{metrics_port}"],
    )  # fmt: skip
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def small_spec(run_id: str, queues: TaskQueues, **overrides: Any) -> RunSpec:
    data = json.loads((REPO / "examples" / "run.json").read_text())
    data.update(run_id=run_id, task_queues=queues.model_dump(), metrics={"wandb": False})
    data["model"]["name"] = run_id
    data["train"] = {"learning_rate": 2e-4}
    data.update(overrides)
    return RunSpec.model_validate(data)


def assert_steps_in_store(store: ObjectStore, run_id: str, steps: int) -> None:
    for step in range(1, steps + 1):
        assert store.exists(trajectories_key(run_id, step)), f"no trajectories for step {step}"
    for step in range(steps + 1):
        assert store.exists(checkpoint_prefix(run_id, step) + MANIFEST_NAME), (
            f"no manifested checkpoint {step}"
        )
    ref = store.latest_checkpoint(run_id)
    assert ref is not None and ref.step == steps


async def run_and_watch(client: Client, spec: RunSpec) -> tuple[RunStatus, list[RunStatus]]:
    handle = await run_control.start_run(client, spec)
    seen: list[RunStatus] = []
    final = await asyncio.wait_for(run_control.watch(handle, seen.append, interval=0.5), 900)
    return final, seen


async def test_a_real_sync_run_terminated_after_step_1_restarts_from_its_checkpoint_and_completes(
    client: Client, workers: WorkerProcess, queues: TaskQueues, s3_settings: S3Settings
) -> None:
    spec = small_spec(f"real-sync-{uuid.uuid4().hex[:6]}", queues)
    handle = await run_control.start_run(client, spec)
    store = ObjectStore(s3_settings)
    for _ in range(
        1800
    ):  # step 1 served, and resumable (its optimizer state goes up beside step 2's rollouts)
        newest = store.latest_checkpoint(spec.run_id)
        if (await handle.query(TrainingRun.status)).step >= 1 and newest is not None and newest.step >= 1:
            break
        await asyncio.sleep(0.5)
    await handle.terminate("simulated crash after step 1")
    newest = store.latest_checkpoint(spec.run_id)
    assert newest is not None and newest.step == 1

    final, seen = await run_and_watch(client, spec)  # the same run id again: resume
    assert final.phase == "done" and final.step == 3 and final.adapter == f"{spec.run_id}@3"
    assert [h.step for h in final.history] == [2, 3]  # step 1 not redone, none skipped
    assert all(h.n_trajectories == 8 and h.reward_mean is not None for h in final.history)
    running = [s for s in seen if s.phase not in ("done", "stopped")]
    assert {s.phase for s in running} & {"rollouts", "train", "publish", "reload"}  # status answered mid-run
    assert_steps_in_store(store, spec.run_id, 3)
    assert store.exists(spec_key(spec.run_id))


async def test_a_real_pipelined_run_completes_and_leaks_no_secret(
    client: Client, workers: WorkerProcess, queues: TaskQueues, s3_settings: S3Settings
) -> None:
    spec = small_spec(f"real-pipe-{uuid.uuid4().hex[:6]}", queues, mode="pipelined")
    final, _ = await run_and_watch(client, spec)
    assert final.step == 3 and final.dropped_stale_groups == 0
    assert [h.policy_step for h in final.history] == [0, 0, 1]  # step n+1 rolled out while step n trained
    store = ObjectStore(s3_settings)
    assert_steps_in_store(store, spec.run_id, 3)

    # The workers hold the S3 keys; none may reach the history, their logs or anything the run wrote.
    secrets = [s3_settings.secret_key.get_secret_value(), s3_settings.access_key]
    history = (await client.get_workflow_handle(spec.run_id).fetch_history()).to_json()
    logs = sorted(workers.log_path.parent.rglob("*.log"))  # the worker's, its trainer child's, the server's
    assert len(logs) >= 3, logs
    places = {"the workflow history": history.encode(), **{str(p): p.read_bytes() for p in logs}}
    keys = store.list(f"runs/{spec.run_id}/")
    assert any(k.endswith(".parquet") for k in keys) and any(k.endswith(".safetensors") for k in keys)
    for key in keys:
        data = store.get_bytes(key)
        if key.endswith(".parquet"):  # compressed: look at the values, not the bytes
            data = str(pq.read_table(pa.BufferReader(data)).to_pylist()).encode()
        places[key] = data
    leaks = [
        (where, secret[:4]) for where, data in places.items() for secret in secrets if secret.encode() in data
    ]
    assert not leaks, f"secrets found in: {leaks}"


async def test_a_run_started_with_the_temporal_cli_completes(
    client: Client, workers: WorkerProcess, queues: TaskQueues, stack: EmbeddedStack, tmp_path: Path
) -> None:
    run_id = f"real-cli-{uuid.uuid4().hex[:6]}"
    data = json.loads((REPO / "examples" / "run.json").read_text())
    data.update(run_id=run_id, steps=1, task_queues=queues.model_dump(), metrics={"wandb": False})
    data["model"]["name"] = run_id
    run_file = tmp_path / "run.json"
    run_file.write_text(json.dumps(data))
    cmd = [TEMPORAL, "workflow", "start", "--type", "TrainingRun", "--task-queue", queues.control]
    cmd += ["--workflow-id", run_id, "--input-file", str(run_file), "--address", stack.temporal_address]
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await proc.communicate()
    assert proc.returncode == 0, out.decode()
    handle = client.get_workflow_handle_for(TrainingRun.run, run_id)
    final = await asyncio.wait_for(handle.result(), 900)
    assert final.step == 1 and [h.step for h in final.history] == [1]


async def test_register_serves_a_warm_start_adapter_at_step_0(
    workers: WorkerProcess, queues: TaskQueues, stack: EmbeddedStack, tmp_path: Path
) -> None:
    """A LoRA dir as base_model: register publishes it as checkpoint 0 and serves it (not the base model)."""
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(str(ensure_smollm2()), dtype=torch.float32)
    lora = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    adapter = tmp_path / "warm"
    lora.save_pretrained(str(adapter))
    name = f"warm-{uuid.uuid4().hex[:6]}"
    model = dgrpo.TrainableModel(name=name, project="it", base_model=str(adapter))
    backend = dgrpo.TemporalBackend(
        address=stack.temporal_address,
        inference_url=workers.server_urls[0],
        s3=stack.s3_settings,
        task_queues=queues,
    )
    await model.register(backend)
    assert (await model.get_step(), model.get_inference_name()) == (0, f"{model.run_id}@0")
    store = backend.object_store()
    served = load(store.get_bytes(checkpoint_prefix(model.run_id, 0) + "adapter_model.safetensors"))
    warm = load((adapter / "adapter_model.safetensors").read_bytes())
    assert served.keys() == warm.keys() and all(torch.equal(served[k], warm[k]) for k in warm)
    reply = await model.openai_client().chat.completions.create(
        model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert reply.model == f"{model.run_id}@0"
    # Registering again (another client, same server) finds it served and runs nothing more.
    again = dgrpo.TrainableModel(name=name, project="it", base_model=str(adapter))
    await again.register(backend)
    assert again.get_inference_name() == f"{model.run_id}@0"


async def test_runs_sharing_one_fleet_each_complete_with_their_own_adapters(
    client: Client,
    workers: WorkerProcess,
    queues: TaskQueues,
    s3_settings: S3Settings,
    stack: EmbeddedStack,
    metrics_port: int,
    traces: TraceCollector,
) -> None:
    """Three runs (sync and pipelined, LoRA ranks 4, 8 and 16) on one inference server and one trainer, and a
    fourth terminated mid-rollout: each of the three completes with its own checkpoints and every row of every
    step (no rollout lost its adapter to another run's load), no run waits for the others to finish (every run
    has trained step 1 before any has trained its last), and the server holds at most the worker's
    ``--max-loras`` adapters of all the runs together. Meanwhile an operator's Prometheus scrapes the worker
    and its trainer child, and their traces join each run's workflow to its activities in both processes."""
    worker, trainer = Scraper(metrics_port), Scraper(metrics_port + 1)
    scraping = [asyncio.ensure_future(s.run()) for s in (worker, trainer)]
    await asyncio.sleep(1)  # a first sample before the runs
    tag = uuid.uuid4().hex[:6]
    specs = [
        small_spec(f"fleet-a-{tag}", queues, steps=2),
        small_spec(f"fleet-b-{tag}", queues, steps=2, mode="pipelined"),
        small_spec(f"fleet-c-{tag}", queues, steps=2),
    ]
    for spec, rank in zip(specs, (4, 8, 16), strict=True):
        spec.model.lora.rank = rank
    doomed = small_spec(f"fleet-d-{tag}", queues, steps=2)
    reached: dict[str, dict[int, float]] = {spec.run_id: {} for spec in specs}

    def seen(status: RunStatus) -> None:
        now = asyncio.get_running_loop().time()
        for step in range(1, status.step + 1):  # a step between two polls was reached by now too
            reached[status.run_id].setdefault(step, now)

    starter = await traced_client(stack.temporal_address, traces)  # each run one trace across the workers
    handles = [await run_control.start_run(starter, spec) for spec in specs]
    doomed_handle = await run_control.start_run(starter, doomed)
    watches = [asyncio.ensure_future(run_control.watch(h, seen, interval=0.5)) for h in handles]
    rolling_out = asyncio.Event()

    def doomed_seen(status: RunStatus) -> None:
        if status.phase == "rollouts":
            rolling_out.set()

    doomed_watch = asyncio.ensure_future(run_control.watch(doomed_handle, doomed_seen, interval=0.3))
    await asyncio.wait_for(rolling_out.wait(), 300)
    await doomed_handle.terminate("a run failing beside the others")
    with pytest.raises(WorkflowFailureError):
        await doomed_watch

    finals = await asyncio.wait_for(asyncio.gather(*watches), 900)
    store = ObjectStore(s3_settings)
    for spec, final in zip(specs, finals, strict=True):
        assert (final.phase, final.step) == ("done", 2), (spec.run_id, final.error)
        assert all(h.n_trajectories == 8 for h in final.history), (spec.run_id, final.history)
        assert_steps_in_store(store, spec.run_id, 2)
    first_step = max(steps[1] for steps in reached.values())
    last_step = min(steps[2] for steps in reached.values())
    assert first_step < last_step, reached
    served = await ServingClient(workers.server_urls[0]).adapters()
    ours = [name for name in served if name.startswith("fleet-") and name.split("@")[0].endswith(tag)]
    assert 0 < len(ours) <= len(served) <= EngineSettings().max_loras, sorted(served)

    await asyncio.sleep(1.5)  # a last sample, and the last spans exported
    for task in scraping:
        task.cancel()
    before, after = worker.samples[0], worker.samples[-1]

    assert moved(before, after, "dgrpo_steps_served_total") >= 6  # 3 runs x 2 steps reloaded
    assert moved(before, after, "dgrpo_rollouts_total", 'outcome="ok"') >= 3 * 2 * 8
    assert moved(before, after, "dgrpo_generated_tokens_total") > 0
    assert moved(before, after, "dgrpo_adapter_loads_total") >= 6
    assert moved(before, after, "dgrpo_adapter_unloads_total") >= 1  # --max-loras held by 4 runs
    assert worker.most("dgrpo_rollouts_in_flight") > 0  # seen during the runs
    assert moved(before, after, "temporal_activity_schedule_to_start_latency_count", queues.inference) >= 6
    assert total(after, "temporal_worker_task_slots_available", queues.control) > 0
    assert moved(trainer.samples[0], trainer.samples[-1], "dgrpo_trained_tokens_total") > 0
    exported = {
        name.removesuffix(suffix) for name in after for suffix in HISTOGRAM_SUFFIXES if name.endswith(suffix)
    }
    exported |= set(after)
    on_dashboard = {name for name in dashboard_metrics(load_dashboard()) if name.startswith("temporal_")}
    assert on_dashboard - SDK_FAILURE_COUNTERS <= exported, on_dashboard - exported
    # one trace per run: its workflow's spans, its rollouts (this process) and its training (the child's)
    step_spans = ("RunWorkflow:TrainingRun", "RunActivity:rollouts", "RunActivity:train")
    for _ in range(30):  # each process sends its spans in batches
        if len(traces.traces_with(*step_spans)) >= 3:
            break
        await asyncio.sleep(0.5)
    assert len(traces.traces_with(*step_spans)) >= 3, {
        t: sorted(set(n)) for t, n in traces.traces().items() if set(n) & set(step_spans[1:])
    }
