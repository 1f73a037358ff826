"""Fixtures for activity tests: the real CPU inference server, and a CPU trainer with a non-trivial adapter."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from activities.trainer import Trainer
from schemas.config import LoraConfig, ModelSpec
from schemas.settings import ENV_ADAPTER_ROOT
from serving.launchers import CpuServerProcess

SERVED_MODEL = "smollm2-135m-instruct"
TRAINED_MODEL = ModelSpec(name="m", base_model=SERVED_MODEL, lora=LoraConfig(rank=8, alpha=16))


@pytest.fixture(scope="session")
def cpu_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``dgrpo serve --model smollm2-135m-instruct`` on a free port; yields its ``/v1`` base URL."""
    log_path = tmp_path_factory.mktemp("serve-logs") / "serve.log"
    server = CpuServerProcess(SERVED_MODEL, log_path=log_path)
    with pytest.MonkeyPatch.context() as mp:  # tests download adapters under their own tmp_path
        mp.setenv(ENV_ADAPTER_ROOT, str(tmp_path_factory.getbasetemp()))
        server.start()
    try:
        yield server.client.openai_base_url
    finally:
        server.stop()


@pytest.fixture(scope="module")
def trainer() -> Trainer:
    """SmolLM2 with a LoRA whose B matrices are random, so the adapter path shapes every logprob."""
    t = Trainer(TRAINED_MODEL)
    t.init_adapter(seed=0)
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for name, p in t.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    return t
