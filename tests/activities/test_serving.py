"""The reload and serving-control activities against the real S3 store and the real CPU server."""

from __future__ import annotations

import asyncio
import shutil
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import openai
import pytest
import rollout_stubs
import torch
from peft import LoraConfig, get_peft_model
from temporalio import workflow
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker
from transformers import AutoModelForCausalLM

from activities.checkpoints import publish_adapter
from activities.object_store import ObjectStore
from activities.rollouts import RolloutActivities
from activities.serving import ServingActivities
from activities.trajectory_store import download_groups, download_table
from base_models.resolve import SMOLLM2_NAME, ensure_smollm2
from schemas import layout
from schemas.activities import ReloadInput, ReloadResult, RolloutsInput, ServingControlInput
from schemas.config import Scheduling, ServingSpec, TaskSpec
from schemas.errors import CONFIG_ERROR, CORRUPT_CHECKPOINT
from schemas.refs import CheckpointRef
from schemas.settings import EngineSettings
from serving.client import ServingClient
from workers.stack import EmbeddedStack
from workers.temporal import connect_client
from workflows.stages import RELOAD, SERVING_CONTROL, run_stage


@pytest.fixture(scope="module")
def adapter_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random (non-zero) LoRA in PEFT format, as the trainer publishes one."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(ensure_smollm2()), dtype=torch.float32)
    peft = get_peft_model(
        model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    out = tmp_path_factory.mktemp("adapter")
    peft.save_pretrained(str(out))
    (out / "trainer_state.json").write_text("{}")  # checkpoints hold more than the adapter
    return out


def publish(store: ObjectStore, adapter: Path, run_id: str, step: int) -> CheckpointRef:
    return store.publish_checkpoint(adapter, run_id, step)


async def reload(
    acts: ServingActivities, model: str, ref: CheckpointRef, keep: int = 2, beats: list[Any] | None = None
) -> Any:
    env = ActivityEnvironment()
    if beats is not None:
        env.on_heartbeat = lambda *details: beats.append(details)
    spec = ServingSpec(keep_adapters=keep)
    return await env.run(acts.reload, ReloadInput(model_name=model, checkpoint=ref, serving=spec))


async def test_reload_serves_each_step_and_keeps_the_newest_and_the_leased(
    cpu_server: str, object_store: ObjectStore, adapter_dir: Path, tmp_path: Path
) -> None:
    model, run_id = "agent", f"run-reload-{uuid.uuid4().hex[:6]}"
    acts = ServingActivities([cpu_server], store=object_store, adapter_root=tmp_path)
    client = ServingClient(cpu_server)
    beats: list[Any] = []
    results = []
    for step in (1, 2, 3):
        ref = publish(object_store, adapter_dir, run_id, step)
        results.append(await reload(acts, model, ref, keep=2, beats=beats))
    assert [r.adapter for r in results] == [f"{run_id}@1", f"{run_id}@2", f"{run_id}@3"]
    assert results[0].servers == [client.base_url]
    assert results[2].unloaded == [f"{run_id}@1"]
    assert {n for n in await client.adapters() if n.startswith(f"{run_id}@")} == {
        f"{run_id}@2",
        f"{run_id}@3",
    }
    assert (
        not (tmp_path / run_id / "000001").exists()
        and (tmp_path / run_id / "000003" / "adapter_config.json").is_file()
    )
    assert any(b[0] == "load" for b in beats)
    # a retried reload is a no-op
    again = await reload(acts, model, publish(object_store, adapter_dir, run_id, 3), keep=2)
    assert again.adapter == f"{run_id}@3" and again.unloaded == []
    # keep=1: step 4 evicts step 3 but not the leased step 2
    with acts.leases.hold(f"{run_id}@2"):
        fourth = await reload(acts, model, publish(object_store, adapter_dir, run_id, 4), keep=1)
    assert fourth.unloaded == [f"{run_id}@3"]
    assert {n for n in await client.adapters() if n.startswith(f"{run_id}@")} == {
        f"{run_id}@2",
        f"{run_id}@4",
    }
    sdk = openai.AsyncOpenAI(base_url=client.openai_base_url, api_key="unused", max_retries=0)
    response = await sdk.chat.completions.create(
        model=f"{run_id}@4", messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert response.choices[0].message.content is not None
    for name in (f"{run_id}@2", f"{run_id}@4"):
        await client.unload_adapter(name)


async def test_two_runs_of_one_model_name_serve_their_own_adapters(
    cpu_server: str, object_store: ObjectStore, adapter_dir: Path, tmp_path: Path
) -> None:
    """Adapters are named by the run: two runs that share a model name on one server never serve, nor
    evict, each other's."""
    model, suffix = "agent", uuid.uuid4().hex[:6]
    acts = ServingActivities([cpu_server], store=object_store, adapter_root=tmp_path)
    client = ServingClient(cpu_server)
    first = await reload(acts, model, publish(object_store, adapter_dir, f"run-a-{suffix}", 1), keep=1)
    second = await reload(acts, model, publish(object_store, adapter_dir, f"run-b-{suffix}", 1), keep=1)
    assert (first.adapter, second.adapter) == (f"run-a-{suffix}@1", f"run-b-{suffix}@1")
    loaded = await client.adapters()
    assert loaded[first.adapter] == str(tmp_path / f"run-a-{suffix}" / "000001")
    assert loaded[second.adapter] == str(tmp_path / f"run-b-{suffix}" / "000001")
    assert second.unloaded == []
    for name in (first.adapter, second.adapter):
        await client.unload_adapter(name)


async def test_max_loras_counts_every_runs_adapters_and_unloads_the_least_recently_used_unheld(
    cpu_server: str, object_store: ObjectStore, adapter_dir: Path, tmp_path: Path
) -> None:
    """``--max-loras`` caps a server's adapters for all runs together: a load beyond it unloads the adapter
    least recently loaded or used that nothing holds, whichever run it is, never a held one; a rollout that
    needs an unloaded adapter again loads it back, and the cap holds then too."""
    suffix = uuid.uuid4().hex[:6]
    a, b, c = (f"run-cap{x}-{suffix}" for x in "abc")
    acts = ServingActivities(
        [cpu_server], store=object_store, adapter_root=tmp_path, engine=EngineSettings(max_loras=2)
    )
    client = ServingClient(cpu_server)
    ours = {f"{run}@1" for run in (a, b, c)}

    async def served() -> set[str]:
        loaded = await client.adapters()
        assert len(loaded) <= 2, sorted(loaded)  # the cap, whatever else the server held before
        return ours & loaded.keys()

    for run in (a, b):
        await reload(acts, "agent", publish(object_store, adapter_dir, run, 1), keep=1)
    assert await served() == {f"{a}@1", f"{b}@1"}
    publish(object_store, adapter_dir, c, 1)
    with acts.leases.hold(f"{a}@1"):  # a rollout of run a between two requests: a@1 is older, but held
        third = await reload(acts, "agent", publish(object_store, adapter_dir, c, 1), keep=1)
        assert f"{b}@1" in third.unloaded and await served() == {f"{a}@1", f"{c}@1"}
        assert not (tmp_path / b / "000001").exists()  # its local copy went with it
    # Run b rolls out again: its adapter comes back, and c@1 (used before a@1's lease ended) makes room.
    with acts.leases.hold(f"{b}@1"):
        assert await acts.ensure_adapter(b, 1) == f"{b}@1"
    assert await served() == {f"{a}@1", f"{b}@1"}
    assert f"{c}@1" not in acts.served
    for name in await served():
        await client.unload_adapter(name)


async def test_evicting_an_adapter_named_to_leave_the_adapter_root_deletes_nothing_outside_it(
    cpu_server: str, object_store: ObjectStore, adapter_dir: Path, tmp_path: Path
) -> None:
    """An adapter another client of the server loaded under a name that reads as a path out of the worker's adapter
    root (``../outside@1``): when a reload's cap unloads it, the worker drops only its own local copies."""
    client = ServingClient(cpu_server)
    hostile = "../outside@1"
    victim = tmp_path / "outside" / "000001" / "keep.txt"
    victim.parent.mkdir(parents=True)
    victim.write_text("not the worker's")
    await client.load_adapter(hostile, str(adapter_dir))
    acts = ServingActivities(
        [cpu_server],
        store=object_store,
        adapter_root=tmp_path / "adapters",
        engine=EngineSettings(max_loras=2),
    )
    runs = [f"run-evict{n}-{uuid.uuid4().hex[:6]}" for n in range(3)]
    unloaded: list[str] = []
    for run in runs:  # each load beyond the cap unloads the least recently used: the hostile one first
        unloaded += (await reload(acts, "agent", publish(object_store, adapter_dir, run, 1), keep=1)).unloaded
    assert hostile in unloaded
    assert victim.read_text() == "not the worker's"
    for name in set(await client.adapters()) & {f"{run}@1" for run in runs}:
        await client.unload_adapter(name)


async def test_running_rollouts_hold_their_adapter_through_other_runs_loads(
    cpu_server: str, object_store: ObjectStore, adapter_dir: Path, tmp_path: Path
) -> None:
    """The rollouts activity holds its adapter while its rollouts run: other runs' reloads on a worker at its
    ``--max-loras`` unload a newer adapter that nothing holds instead, and the hold ends with the rollouts."""
    suffix = uuid.uuid4().hex[:6]
    mine, other, third = (f"run-held{x}-{suffix}" for x in "abc")
    acts = ServingActivities(
        [cpu_server], store=object_store, adapter_root=tmp_path, engine=EngineSettings(max_loras=2)
    )
    rollouts = RolloutActivities(cpu_server, object_store, serving=acts, task_modules=("rollout_stubs",))
    client = ServingClient(cpu_server)
    publish(object_store, adapter_dir, mine, 1)
    rollout_stubs.GATE.update(started=asyncio.Event(), open=asyncio.Event())
    inp = RolloutsInput(
        run_id=mine, step=2, model_name="agent", adapter=f"{mine}@1", policy_step=1,
        task=TaskSpec(rollout="rollout_stubs:gated", scenarios="rollout_stubs:scenarios"),
        groups_per_step=1, group_size=2,
    )  # fmt: skip
    running = asyncio.ensure_future(ActivityEnvironment().run(rollouts.rollouts, inp))
    await asyncio.wait_for(rollout_stubs.GATE["started"].wait(), 120)  # its adapter loaded, rollouts running
    await reload(acts, "agent", publish(object_store, adapter_dir, other, 1), keep=1)
    last = await reload(acts, "agent", publish(object_store, adapter_dir, third, 1), keep=1)
    assert last.unloaded == [f"{other}@1"]  # the least recently used that nothing holds
    assert {f"{mine}@1", f"{third}@1"} <= (await client.adapters()).keys()
    rollout_stubs.GATE["open"].set()
    assert (await asyncio.wait_for(running, 120)).n_trajectories == 2
    assert acts.leases.held() == set()
    for name in (f"{mine}@1", f"{third}@1"):
        await client.unload_adapter(name)


async def test_reload_refuses_corrupt_checkpoints(
    cpu_server: str, object_store: ObjectStore, adapter_dir: Path, tmp_path: Path
) -> None:
    model, run_id = "agent", f"run-corrupt-{uuid.uuid4().hex[:6]}"
    acts = ServingActivities([cpu_server], store=object_store, adapter_root=tmp_path)
    ref = publish(object_store, adapter_dir, run_id, 1)
    wrong_manifest = ref.model_copy(update={"manifest_sha256": "0" * 64})
    with pytest.raises(ApplicationError) as stale:
        await reload(acts, model, wrong_manifest)
    assert stale.value.type == CORRUPT_CHECKPOINT and stale.value.non_retryable
    object_store.put_bytes(
        object_store.key(ref.uri) + "adapter_model.safetensors", b"not the published bytes"
    )
    with pytest.raises(ApplicationError) as corrupt:
        await reload(acts, model, ref)
    assert corrupt.value.type == CORRUPT_CHECKPOINT and corrupt.value.non_retryable
    assert "does not match its manifest" in corrupt.value.message
    assert not [n for n in await ServingClient(cpu_server).adapters() if n.startswith(f"{run_id}@")]


async def test_reload_reports_an_adapter_the_server_cannot_load(
    cpu_server: str, object_store: ObjectStore, tmp_path: Path
) -> None:
    not_an_adapter = tmp_path / "src"
    not_an_adapter.mkdir()
    (not_an_adapter / "weights.bin").write_bytes(b"x")
    ref = publish(object_store, not_an_adapter, "run-bad", 1)
    acts = ServingActivities([cpu_server], store=object_store, adapter_root=tmp_path / "adapters")
    with pytest.raises(ApplicationError) as refused:
        await reload(acts, "agent-bad", ref)
    assert refused.value.type == CONFIG_ERROR and refused.value.non_retryable
    assert "adapter_config.json" in refused.value.message


async def test_serving_control_puts_the_servers_to_sleep_and_wakes_them(cpu_server: str) -> None:
    acts = ServingActivities([cpu_server])
    client = ServingClient(cpu_server)
    env = ActivityEnvironment()
    await env.run(acts.serving_control, ServingControlInput(action="sleep"))
    try:
        assert await client.is_sleeping()
    finally:
        await env.run(acts.serving_control, ServingControlInput(action="wake_up"))
    assert not await client.is_sleeping()
    assert SMOLLM2_NAME == await client.base_model()


@workflow.defn(sandboxed=False)
class ReloadThenNap:
    """Reload, then sleep and wake the servers: the calls TrainStep makes, with its stage options."""

    @workflow.run
    async def run(self, queue: str, inp: ReloadInput) -> ReloadResult:
        step = inp.checkpoint.step
        result = await run_stage(
            RELOAD, inp, task_queue=queue, step=step, scheduling=Scheduling(), result_type=ReloadResult
        )
        for action in ("sleep", "wake_up"):
            await run_stage(
                SERVING_CONTROL,
                ServingControlInput(action=action),
                task_queue=queue,
                step=step,
                scheduling=Scheduling(),
            )
        return result


async def test_reload_on_a_real_temporal_worker(
    stack: EmbeddedStack,
    cpu_server: str,
    object_store: ObjectStore,
    adapter_dir: Path,
    tmp_path: Path,
    task_queue: str,
) -> None:
    client = await connect_client(address=stack.temporal_address)
    acts = ServingActivities([cpu_server], store=object_store, adapter_root=tmp_path)
    model = f"agent-{uuid.uuid4().hex[:6]}"
    run_id = f"run-temporal-{uuid.uuid4().hex[:6]}"
    good = publish(object_store, adapter_dir, run_id, 1)
    bad = good.model_copy(update={"manifest_sha256": "f" * 64})
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[ReloadThenNap],
        activities=acts.all(),
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        result = await client.execute_workflow(
            ReloadThenNap.run,
            args=[task_queue, ReloadInput(model_name=model, checkpoint=good)],
            id=f"reload-{uuid.uuid4().hex[:8]}",
            task_queue=task_queue,
            result_type=ReloadResult,
            execution_timeout=timedelta(minutes=5),
        )
        assert result.adapter == f"{run_id}@1"
        with pytest.raises(WorkflowFailureError) as failed:  # corrupt: not retried, fails at once
            await client.execute_workflow(
                ReloadThenNap.run,
                args=[task_queue, ReloadInput(model_name=model, checkpoint=bad)],
                id=f"reload-bad-{uuid.uuid4().hex[:8]}",
                task_queue=task_queue,
                result_type=ReloadResult,
                execution_timeout=timedelta(minutes=2),
            )
    assert "reload failed" in str(failed.value.cause) and CORRUPT_CHECKPOINT in repr(failed.value.cause)
    served = ServingClient(cpu_server)
    assert f"{run_id}@1" in await served.adapters() and not await served.is_sleeping()
    await served.unload_adapter(f"{run_id}@1")


@pytest.mark.parametrize(
    ("engine", "overrides", "named"),
    [
        (EngineSettings(max_lora_rank=8), {"lora_rank": 16}, "--max-lora-rank"),
        (EngineSettings(), {"serving": ServingSpec(engine="vllm")}, "serving.engine"),
        (EngineSettings(max_loras=2), {"serving": ServingSpec(keep_adapters=3)}, "--max-loras"),
        (EngineSettings(engine="vllm"), {"shared": True}, "--sleep-mode"),
        (EngineSettings(), {"bucket": "another-bucket"}, "storage.bucket"),
        (EngineSettings(), {"chat_template": True}, "--trust-request-chat-template"),
    ],
)
async def test_reload_refuses_a_run_its_engine_cannot_serve(
    cpu_server: str,
    object_store: ObjectStore,
    adapter_dir: Path,
    tmp_path: Path,
    engine: EngineSettings,
    overrides: dict[str, Any],
    named: str,
) -> None:
    model = f"refused-{uuid.uuid4().hex[:6]}"
    acts = ServingActivities([cpu_server], store=object_store, adapter_root=tmp_path, engine=engine)
    ref = publish(object_store, adapter_dir, "run-refused", 1)
    with pytest.raises(ApplicationError) as caught:
        await ActivityEnvironment().run(
            acts.reload, ReloadInput(model_name=model, checkpoint=ref, **overrides)
        )
    assert caught.value.type == CONFIG_ERROR and caught.value.non_retryable
    assert "cannot serve the run" in caught.value.message and named in caught.value.message
    assert not [n for n in await ServingClient(cpu_server).adapters() if n.startswith("run-refused@")]
    assert not (tmp_path / "run-refused").exists()  # refused before downloading anything


async def test_reload_serves_a_run_within_the_engine_settings(
    cpu_server: str, object_store: ObjectStore, adapter_dir: Path, tmp_path: Path
) -> None:
    model = f"fits-{uuid.uuid4().hex[:6]}"
    engine = EngineSettings(max_lora_rank=16, max_loras=3)
    acts = ServingActivities([cpu_server], store=object_store, adapter_root=tmp_path, engine=engine)
    run_id = f"run-fits-{uuid.uuid4().hex[:6]}"
    ref = publish(object_store, adapter_dir, run_id, 1)
    inp = ReloadInput(
        model_name=model,
        checkpoint=ref,
        serving=ServingSpec(engine="cpu", keep_adapters=2),
        lora_rank=16,
        shared=True,
        bucket=object_store.bucket,
    )
    result = await ActivityEnvironment().run(acts.reload, inp)
    assert result.adapter == f"{run_id}@1"
    await ServingClient(cpu_server).unload_adapter(result.adapter)


async def test_ensure_adapter_loads_a_published_step_its_server_lacks(
    cpu_server: str, object_store: ObjectStore, adapter_dir: Path, tmp_path: Path
) -> None:
    """What rollouts pinned to a step do on an inference worker whose server never ran that step's reload."""
    run_id = f"run-ensure-{uuid.uuid4().hex[:6]}"
    publish(object_store, adapter_dir, run_id, 2)
    acts = ServingActivities([cpu_server], store=object_store, adapter_root=tmp_path)
    client = ServingClient(cpu_server)
    assert f"{run_id}@2" not in await client.adapters()
    # Two shards of the step on this worker at once: one downloads and loads, the other finds it loaded.
    name, same = await asyncio.gather(acts.ensure_adapter(run_id, 2), acts.ensure_adapter(run_id, 2))
    assert name == same == f"{run_id}@2"
    assert (await client.adapters())[name] == str(tmp_path / run_id / "000002")
    assert acts.served == {name: tmp_path / run_id / "000002"}  # restored too if this server restarts
    assert await acts.ensure_adapter(run_id, 2) == name  # served already: nothing loaded again
    await client.unload_adapter(name)


async def test_a_step_published_again_with_other_weights_is_served_with_them(
    cpu_server: str, object_store: ObjectStore, adapter_dir: Path, tmp_path: Path
) -> None:
    """A run id reused after its checkpoints were deleted: step 1 again, the same adapter name and local path,
    other weights. The reload decides by the checkpoint's content (its manifest), not by the path; so does a
    rollout's ``ensure_adapter`` on a second inference worker, which never ran the reload and had loaded the
    old weights under that name."""
    run_id = f"run-again-{uuid.uuid4().hex[:6]}"
    acts = ServingActivities([cpu_server], store=object_store, adapter_root=tmp_path / "first")
    client = ServingClient(cpu_server)
    sdk = openai.AsyncOpenAI(base_url=client.openai_base_url, api_key="unused", max_retries=0)

    async def answer(name: str) -> list[float]:
        r = await sdk.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "Name a colour."}], max_tokens=6, temperature=0,
            logprobs=True,
        )  # fmt: skip
        return [t.logprob for t in r.choices[0].logprobs.content]  # type: ignore[union-attr]

    def same(a: list[float], b: list[float]) -> bool:  # a prefix-cache hit may differ in the 6th digit
        return len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-3

    first = await reload(acts, "agent", publish(object_store, adapter_dir, run_id, 1))
    before = await answer(first.adapter)
    torch.manual_seed(7)
    base = AutoModelForCausalLM.from_pretrained(str(ensure_smollm2()), dtype=torch.float32)
    other = get_peft_model(
        base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    other_dir = tmp_path / "other-weights"
    other.save_pretrained(str(other_dir))
    assert await client.load_adapter("reference@1", str(other_dir))
    expected = await answer("reference@1")
    assert not same(expected, before)

    object_store.delete_prefix(f"runs/{run_id}/")
    again = publish(object_store, other_dir, run_id, 1)
    second = await reload(acts, "agent", again)
    assert second.adapter == first.adapter
    assert same(await answer(second.adapter), expected)  # not the weights first loaded under that name

    # A second worker (its own adapter root) whose rollouts loaded step 1 by ensure_adapter, then the run id
    # was reused again with the first weights, reloaded elsewhere: its next rollouts serve the new content.
    rollouts_worker = ServingActivities([cpu_server], store=object_store, adapter_root=tmp_path / "second")
    assert await rollouts_worker.ensure_adapter(run_id, 1) == first.adapter
    assert same(await answer(first.adapter), expected)
    object_store.delete_prefix(f"runs/{run_id}/")
    publish(object_store, adapter_dir, run_id, 1)
    assert await rollouts_worker.ensure_adapter(run_id, 1) == first.adapter
    assert same(await answer(first.adapter), before)  # not the weights it loaded under that name before
    for name in (first.adapter, "reference@1"):
        await client.unload_adapter(name)


async def test_a_servable_checkpoint_is_reloaded_and_ensured_and_labels_the_rollouts_it_samples(
    cpu_server: str,
    object_store: ObjectStore,
    adapter_dir: Path,
    tmp_path: Path,
) -> None:
    run = f"run-servable-{uuid.uuid4().hex[:6]}"
    staged = tmp_path / "staged"  # as a trainer stages a step: the adapter, the optimizer and trainer state
    shutil.copytree(adapter_dir, staged)
    (staged / "optimizer.safetensors").write_bytes(b"moments")
    servable, _ = publish_adapter(object_store, staged, run, 1)
    assert not object_store.is_complete(layout.checkpoint_prefix(run, 1))

    acts = ServingActivities([cpu_server], store=object_store, adapter_root=tmp_path / "first")
    inp = ReloadInput(model_name="agent", checkpoint=servable)
    reloaded = await ActivityEnvironment().run(acts.reload, inp)
    assert (reloaded.adapter, reloaded.adapter_sha256) == (f"{run}@1", servable.adapter_sha256)
    local = tmp_path / "first" / run / "000001"
    assert sorted(p.name for p in local.iterdir() if not p.name.startswith(".")) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]  # fmt: skip  (never the optimizer state)

    # Another inference worker whose server lacks it: its rollouts load it (servable is enough) and say so.
    other = ServingActivities([cpu_server], store=object_store, adapter_root=tmp_path / "second")
    await ServingClient(cpu_server).unload_adapter(reloaded.adapter)
    rollouts = RolloutActivities(cpu_server, object_store, serving=other, task_modules=("rollout_stubs",))
    sampled = await ActivityEnvironment().run(
        rollouts.rollouts,
        RolloutsInput(
            run_id=run, step=2, model_name="agent", adapter=reloaded.adapter, policy_step=1,
            task=TaskSpec(rollout="rollout_stubs:ok", scenarios="rollout_stubs:scenarios"),
            groups_per_step=2, group_size=2,
        ),
    )  # fmt: skip
    assert sampled.policy_adapters == [servable.adapter_sha256]
    table = download_table(object_store, sampled.ref.uri)
    assert table.column("policy_sha256").to_pylist() == [servable.adapter_sha256] * 4
    groups = download_groups(object_store, sampled.ref.uri)
    assert {t.policy_sha256 for g in groups for t in g.trajectories} == {servable.adapter_sha256}

    # Trained again (its trainer lost): the first adapter's ref no longer reloads; the new one replaces it.
    again = tmp_path / "again"
    shutil.copytree(staged, again)
    (again / "adapter_model.safetensors").write_bytes(
        (staged / "adapter_model.safetensors").read_bytes()[::-1]
    )
    with pytest.raises(ApplicationError) as lost:
        publish_adapter(object_store, again, run, 1)
        await ActivityEnvironment().run(acts.reload, inp)
    assert lost.value.type == CORRUPT_CHECKPOINT and "its adapter changed" in lost.value.message
    await ServingClient(cpu_server).unload_adapter(reloaded.adapter)
