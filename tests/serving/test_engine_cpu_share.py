"""The CPU engine marks itself busy on the host while it generates, takes its share of the cores then, and
gives the mark back when it goes idle (host/cpu_share.py)."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from base_models.resolve import ensure_smollm2
from host.cpu_share import CpuShare
from serving.batcher import GenerationEngine, GenerationRequest
from serving.sampling import SamplingParams
from tests.cpu_neighbour import Neighbour


def marked_busy(path: Path) -> bool:
    """Whether the share file's owner holds its busy mark (a lock it takes while it works)."""
    with open(path) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


def test_the_engine_is_busy_with_half_the_cores_while_it_generates_and_idle_after(tmp_path: Path) -> None:
    model = str(ensure_smollm2())
    tokenizer = AutoTokenizer.from_pretrained(model)
    prompt = list(tokenizer("Count to ten:", add_special_tokens=False)["input_ids"])  # type: ignore[operator]
    neighbour = Neighbour(tmp_path)
    engine = GenerationEngine(model, max_batch=4, cpu_share=CpuShare(tmp_path, cores=2))
    mark = tmp_path / f"{os.getpid()}.busy"
    seen: list[tuple[int, bool]] = []  # (torch threads, marked busy) at each step, on the engine thread
    engine.base.model.layers[0].input_layernorm.register_forward_pre_hook(
        lambda *_: seen.append((torch.get_num_threads(), marked_busy(mark)))
    )
    try:
        neighbour.say("busy")
        params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
        engine.submit([GenerationRequest(prompt, None, params)])[0].result(timeout=300)
        assert seen == [(1, True)] * 4  # the prompt's step and three decode steps
        deadline = time.monotonic() + 30
        while marked_busy(mark) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not marked_busy(mark)

        neighbour.say("idle")
        seen.clear()
        engine.submit([GenerationRequest(prompt, None, params)])[0].result(timeout=300)
        assert [threads for threads, _ in seen] == [2] * 4
    finally:
        engine.close()
        neighbour.kill()
