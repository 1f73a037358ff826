"""Engine construction (CPU and vLLM command lines), ``dgrpo serve`` options, and an adapter dir as the model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from serving_adapters import random_adapter

from base_models.resolve import SMOLLM2_NAME, ensure_smollm2
from dgrpo.cli import build_parser
from schemas.errors import EngineSetupError
from schemas.settings import EngineSettings
from serving.launchers import (
    BUILD_VLLM,
    CpuServerProcess,
    VllmRuntime,
    VllmServerProcess,
    lora_rank_flag,
    probe_vllm_runtime,
    server_process,
    vllm_python,
)
from serving.options import ServerOptions, options_from_args
from serving.server import create_server

GPU_BUILD = VllmRuntime(python="/opt/vllm/bin/python", version="0.26.0", cuda=True)
CPU_BUILD = VllmRuntime(python="/opt/vllm-cpu/bin/python", version="0.32.0", cuda=False)


def test_server_process_follows_the_engine_settings() -> None:
    cpu = server_process(SMOLLM2_NAME, EngineSettings(engine="cpu"), port=8123)
    assert isinstance(cpu, CpuServerProcess)
    assert cpu.command()[:3] == [sys.executable, "-m", "serving.server"]
    assert cpu.command()[cpu.command().index("--port") + 1] == "8123"
    assert cpu.base_url == "http://127.0.0.1:8123" and cpu.client.openai_base_url.endswith(":8123/v1")
    vllm = server_process(
        SMOLLM2_NAME,
        EngineSettings(engine="vllm", max_lora_rank=12, max_loras=4),
        port=9000,
        runtime=GPU_BUILD,
    )
    assert isinstance(vllm, VllmServerProcess)
    argv = vllm.command()
    assert argv[:4] == [GPU_BUILD.python, "-m", "vllm.entrypoints.cli.main", "serve"]
    assert str(ensure_smollm2()) in argv and argv[argv.index("--dtype") + 1] == "bfloat16"
    assert argv[argv.index("--served-model-name") + 1] == SMOLLM2_NAME
    assert argv[argv.index("--max-lora-rank") + 1] == "16" and argv[argv.index("--max-loras") + 1] == "4"
    assert (
        "--enable-lora" in argv
        and "--return-tokens-as-token-ids" in argv
        and "--enable-sleep-mode" not in argv
    )
    assert vllm.environment()["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"


def test_vllm_command_for_a_starting_adapter_and_sleep_mode(tmp_path: Path) -> None:
    adapter = tmp_path / "warm"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": SMOLLM2_NAME}))
    engine = VllmServerProcess(
        str(adapter),
        EngineSettings(engine="vllm", sleep_mode=True, dtype="bf16"),
        start_adapter_name="agent@0",
        port=1,
        runtime=GPU_BUILD,
    )
    argv = engine.command()
    assert argv[argv.index("--served-model-name") + 1] == SMOLLM2_NAME
    assert argv[argv.index("--lora-modules") + 1] == f"agent@0={adapter.resolve()}"
    assert argv[argv.index("--dtype") + 1] == "bfloat16" and "--enable-sleep-mode" in argv
    assert engine.environment()["VLLM_SERVER_DEV_MODE"] == "1"
    assert [lora_rank_flag(r) for r in (1, 8, 9, 64, 300)] == [1, 8, 16, 64, 320]
    with pytest.raises(ValueError, match="largest"):
        lora_rank_flag(1000)


def test_vllms_cpu_build_serves_fp32_on_loopback_and_refuses_sleep_mode() -> None:
    cpu = VllmServerProcess(SMOLLM2_NAME, EngineSettings(engine="vllm"), port=9001, runtime=CPU_BUILD)
    argv = cpu.command()
    assert argv[:3] == [CPU_BUILD.python, "-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--model") + 1] == str(ensure_smollm2())
    assert argv[argv.index("--dtype") + 1] == "float32"
    env = cpu.environment()
    assert env["VLLM_HOST_IP"] == "127.0.0.1" and env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert "VLLM_SERVER_DEV_MODE" not in env  # development endpoints only when asked for (benches)
    assert argv[argv.index("--tool-call-parser") + 1] == "hermes" and "--enable-auto-tool-choice" in argv
    plain = VllmServerProcess(
        SMOLLM2_NAME, EngineSettings(engine="vllm", tool_call_parser=None), runtime=CPU_BUILD
    )
    assert "--enable-auto-tool-choice" not in plain.command()
    assert "--trust-request-chat-template" not in plain.command()
    trusting = EngineSettings(engine="vllm", trust_request_chat_template=True)
    assert (
        "--trust-request-chat-template"
        in VllmServerProcess(SMOLLM2_NAME, trusting, runtime=CPU_BUILD).command()
    )
    dev = VllmServerProcess(
        SMOLLM2_NAME, EngineSettings(engine="vllm"), runtime=CPU_BUILD, dev_endpoints=True
    )
    assert dev.environment()["VLLM_SERVER_DEV_MODE"] == "1"
    bf16 = VllmServerProcess(SMOLLM2_NAME, EngineSettings(engine="vllm", dtype="bf16"), runtime=CPU_BUILD)
    assert bf16.command()[bf16.command().index("--dtype") + 1] == "bfloat16"  # asked for, it is served
    asleep = VllmServerProcess(
        SMOLLM2_NAME, EngineSettings(engine="vllm", sleep_mode=True), runtime=CPU_BUILD
    )
    with pytest.raises(EngineSetupError, match=r"sleep mode is CUDA-only.*without --sleep-mode"):
        asleep.command()
    assert "VLLM_HOST_IP" not in VllmServerProcess(SMOLLM2_NAME, runtime=GPU_BUILD).environment()


def test_a_missing_or_broken_vllm_environment_is_refused_with_how_to_build_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DGRPO_VLLM_PYTHON", raising=False)
    named = EngineSettings(engine="vllm", vllm_python=str(tmp_path / "nowhere" / "python"))
    assert vllm_python(named) == named.vllm_python
    monkeypatch.setenv("DGRPO_VLLM_PYTHON", "/from/the/variable")
    assert vllm_python(EngineSettings(engine="vllm")) == "/from/the/variable"
    with pytest.raises(EngineSetupError, match=r"missing: no Python at .*nowhere") as missing:
        VllmServerProcess(SMOLLM2_NAME, named).command()
    assert "deploy/install.sh --vllm" in str(missing.value) and BUILD_VLLM in str(missing.value)
    with pytest.raises(EngineSetupError, match=r"does not import.*No module named 'vllm'.*install.sh --vllm"):
        probe_vllm_runtime(sys.executable)  # the project's environment: vLLM lives in its own


def test_the_worker_refuses_a_vllm_engine_it_cannot_start(tmp_path: Path) -> None:
    """``dgrpo worker inference --engine vllm`` without vLLM's environment: one line, exit 2, no traceback."""
    done = subprocess.run(
        [sys.executable, "-m", "dgrpo.cli", "worker", "inference", "--engine", "vllm",
         "--vllm-python", str(tmp_path / "absent"), "--temporal-wait-s", "0"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "DGRPO_HOME": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "vLLM's runtime environment is missing" in done.stderr and "install.sh --vllm" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_server_bound_beyond_loopback_needs_the_api_key_on_both_engines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``DGRPO_SERVE_HOST`` other than loopback without ``DGRPO_SERVE_API_KEY``: ``dgrpo worker inference``
    refuses to start (one line, exit 2); with the key each engine binds there and requires it, and the worker
    reaches a wildcard bind on loopback. vLLM's unguarded development endpoints (sleep mode) stay on loopback."""
    env = {k: v for k, v in os.environ.items() if k != "DGRPO_SERVE_API_KEY"}
    done = subprocess.run(
        [sys.executable, "-m", "dgrpo.cli", "worker", "inference", "--temporal-wait-s", "0"],
        capture_output=True, text=True, timeout=120,
        env={**env, "DGRPO_HOME": str(tmp_path), "DGRPO_SERVE_HOST": "0.0.0.0"},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "would bind 0.0.0.0, beyond this machine, without an API key" in done.stderr, done.stderr
    assert "DGRPO_SERVE_API_KEY" in done.stderr and "Traceback" not in done.stderr
    monkeypatch.delenv("DGRPO_SERVE_API_KEY", raising=False)
    for engine in ("cpu", "vllm"):
        with pytest.raises(EngineSetupError, match="without an API key"):
            server_process(SMOLLM2_NAME, EngineSettings(engine=engine), host="10.0.0.5")  # type: ignore[arg-type]
    monkeypatch.setenv("DGRPO_SERVE_API_KEY", "k3y")
    cpu = server_process(SMOLLM2_NAME, EngineSettings(engine="cpu"), host="0.0.0.0", port=8123)
    assert cpu.command()[cpu.command().index("--host") + 1] == "0.0.0.0"
    assert cpu.base_url == "http://127.0.0.1:8123"
    vllm = VllmServerProcess(SMOLLM2_NAME, host="10.0.0.5", port=8124, runtime=GPU_BUILD)
    assert vllm.base_url == "http://10.0.0.5:8124"
    assert vllm.environment()["VLLM_API_KEY"] == "k3y"
    with pytest.raises(EngineSetupError, match=r"development endpoints.*drop --sleep-mode"):
        VllmServerProcess(SMOLLM2_NAME, EngineSettings(sleep_mode=True), host="0.0.0.0", runtime=GPU_BUILD)


def test_dgrpo_engine_chooses_the_engine_a_worker_starts_when_no_flag_does(tmp_path: Path) -> None:
    """``DGRPO_ENGINE=vllm`` makes ``dgrpo worker`` (and so ``LocalBackend``'s workers) start vLLM; a value
    naming no engine is refused, not taken as ``cpu``."""

    def worker(engine: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "DGRPO_HOME": str(tmp_path), "DGRPO_ENGINE": engine,
               "DGRPO_VLLM_PYTHON": str(tmp_path / "absent")}  # fmt: skip
        return subprocess.run(
            [sys.executable, "-m", "dgrpo.cli", "worker", "inference", "--temporal-wait-s", "0"],
            capture_output=True, text=True, timeout=120, env=env,
        )  # fmt: skip

    chose_vllm = worker("vllm")
    assert chose_vllm.returncode == 2, chose_vllm.stderr
    assert "vLLM's runtime environment is missing" in chose_vllm.stderr, chose_vllm.stderr
    bogus = worker("tpu")
    assert bogus.returncode == 2 and "DGRPO_ENGINE='tpu' names no engine" in bogus.stderr, bogus.stderr
    assert "Traceback" not in bogus.stderr


def test_dgrpo_serve_options() -> None:
    args = build_parser().parse_args(
        [
            "serve",
            "--model",
            SMOLLM2_NAME,
            "--port",
            "8001",
            "--dtype",
            "bf16",
            "--max-batch",
            "8",
            "--lora-modules",
            "a@1=/x/a",
            "--served-name",
            "smol",
        ]
    )
    options = options_from_args(args)
    assert options == ServerOptions(
        model=SMOLLM2_NAME,
        port=8001,
        dtype="bf16",
        max_batch=8,
        lora_modules={"a@1": "/x/a"},
        served_name="smol",
    )
    assert args.func.__name__ == "_serve"


async def test_an_adapter_dir_as_the_model_starts_with_that_adapter(tmp_path: Path) -> None:
    adapter = random_adapter(tmp_path / "warm-start", seed=3)
    app, engine = create_server(ServerOptions(model=str(adapter)))
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://serve") as http:
            models = (await http.get("/v1/models")).json()["data"]
            assert [(m["id"], m["parent"]) for m in models] == [
                (SMOLLM2_NAME, None),
                ("warm-start@0", SMOLLM2_NAME),
            ]
            body = {"model": "warm-start@0", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
            response = (await http.post("/v1/chat/completions", json=body)).json()
            assert response["model"] == "warm-start@0" and len(response["choices"][0]["token_ids"]) <= 3
    finally:
        engine.close()
