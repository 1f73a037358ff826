"""vLLM's own parallelism as the inference worker's operator settings: ``--tensor-parallel-size`` on vLLM's CPU
build (two ranks, a core each, on this 2-core machine), started by our launcher, serving adapters the reload
activity loads from the real store, with the logprobs the trainer computes on one device; and the refusals of what
cannot honour those flags (our CPU engine, a server the worker does not start)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import openai
import psutil
import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from serving_contract import RETURN_IDS, recorded_choice, teacher_forced
from temporalio.testing import ActivityEnvironment
from transformers import AutoModelForCausalLM

from activities.object_store import ObjectStore
from activities.serving import ServingActivities
from schemas.activities import ReloadInput
from schemas.config import ServingSpec
from schemas.settings import EngineSettings
from serving.launchers import VllmServerProcess

PARALLEL = EngineSettings(
    engine="vllm", tensor_parallel_size=2, max_lora_rank=8, max_loras=2, tool_call_parser=None
)
QUESTIONS = ["Count to five.", "Name a colour."]


def random_adapter(base: Path, out: Path, seed: int) -> Path:
    """A non-zero LoRA on ``base`` in PEFT format, as the trainer publishes one."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    lora = LoraConfig(
        r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False
    )
    get_peft_model(model, lora).save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def server(tiny_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServerProcess]:
    """vLLM over two tensor-parallel ranks, as ``dgrpo worker inference --engine vllm --tensor-parallel-size 2``
    starts it (the Qwen3 shape: its 4 attention heads split in two; SmolLM2's 9 do not)."""
    log = tmp_path_factory.mktemp("vllm-tp") / "serve.log"
    process = VllmServerProcess(str(tiny_qwen3), PARALLEL, log_path=log)
    process.start()
    try:
        yield process
    finally:
        process.stop()


def test_the_server_spans_two_tensor_parallel_ranks(server: VllmServerProcess) -> None:
    """vLLM got the flag, and runs a worker process per rank, each bound to a core of its own."""
    assert server.process is not None
    argv = psutil.Process(server.process.info.pid).cmdline()
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    text = Path(server.log_path).read_text()
    assert "world_size=2 rank=0" in text and "world_size=2 rank=1" in text
    assert "core ids=[0]" in text and "core ids=[1]" in text


async def test_reloaded_adapters_are_served_over_both_ranks_as_the_trainer_computes_them(
    server: VllmServerProcess, tiny_qwen3: Path, object_store: ObjectStore, tmp_path: Path
) -> None:
    """The reload activity loads each step's adapter onto the tensor-parallel server; what it samples through
    the adapter has the logprobs one device's forward gives (fp32), step after step."""
    run_id = f"run-tp-{uuid.uuid4().hex[:6]}"
    acts = ServingActivities([server.client.openai_base_url], store=object_store, adapter_root=tmp_path / "served",
                             engine=PARALLEL)  # fmt: skip
    sdk = openai.AsyncOpenAI(
        base_url=server.client.openai_base_url, api_key="unused", max_retries=1, timeout=120
    )
    base = AutoModelForCausalLM.from_pretrained(str(tiny_qwen3), dtype=torch.float32).eval()
    for step in (1, 2):
        adapter = random_adapter(tiny_qwen3, tmp_path / f"adapter-{step}", seed=step)
        ref = object_store.publish_checkpoint(adapter, run_id, step)
        served = await ActivityEnvironment().run(
            acts.reload, ReloadInput(model_name="agent", checkpoint=ref, serving=ServingSpec(keep_adapters=1))
        )
        assert served.adapter == f"{run_id}@{step}"
        policy = PeftModel.from_pretrained(base, str(adapter)).eval()
        gaps = []
        for question in QUESTIONS:
            response = await sdk.chat.completions.create(
                model=served.adapter, messages=[{"role": "user", "content": question}], max_tokens=8,
                logprobs=True, extra_body=RETURN_IDS,
            )  # fmt: skip
            choice = recorded_choice(response)
            assert choice.prompt_token_ids and choice.token_ids
            expected = teacher_forced(policy, choice.prompt_token_ids, choice.token_ids)
            gaps.append((torch.tensor(choice.sampled_logprobs()) - expected).abs())
        base = policy.unload()  # the bare base again for the next step's adapter
        worst = float(torch.cat(gaps).max())
        assert worst < 1e-3, f"step {step}: vLLM over 2 ranks differs from one device's forward by {worst}"
    assert set(await server.client.adapters()) == {f"{run_id}@2"}  # keep_adapters=1 unloaded step 1


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--engine", "cpu", "--tensor-parallel-size", "2"], "--tensor-parallel-size 2: our CPU engine"),
        (["--engine", "cpu", "--data-parallel-size", "2"], "--data-parallel-size 2: our CPU engine"),
        (
            ["--engine", "vllm", "--server-url", "http://127.0.0.1:9/v1", "--tensor-parallel-size", "2"],
            "with --server-url it starts none",
        ),
    ],
)
def test_parallelism_the_worker_cannot_give_is_refused_naming_the_flag(flags: list[str], says: str) -> None:
    """Before anything starts (no Temporal is reachable at the address given), with the error path's exit 2."""
    done = subprocess.run(
        [sys.executable, "-m", "dgrpo.cli", "worker", "inference", *flags],
        env={**os.environ, "DGRPO_TEMPORAL_ADDRESS": "127.0.0.1:9", "DGRPO_TEMPORAL_WAIT_S": "0"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert says in done.stderr
