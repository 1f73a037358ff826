"""The engine's ragged step computes what transformers' own forward computes, for every architecture it takes:
rows decoding one token, rows joining with a cached prefix and rows joining with none, in one forward."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache

from host.processes import free_port
from serving.kv_cache import GrowingLayer, restack
from serving.ragged import Feed, forward, unsupported

TINY = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 211,
    "max_position_embeddings": 128,
}


def tiny_model(model_type: str) -> torch.nn.Module:
    # Qwen3's shape: queries twice as wide as the hidden size (head_dim x heads), tied embeddings.
    extra = {"head_dim": 32, "tie_word_embeddings": True} if model_type == "qwen3" else {}
    config = AutoConfig.for_model(model_type, **TINY, **extra)
    if model_type == "mistral":
        config.sliding_window = None
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def keys_and_values(model: torch.nn.Module, tokens: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's keys and values of ``tokens`` (1 x heads x len x dim), by transformers' forward."""
    cache = DynamicCache(config=model.config)
    if tokens:
        model(input_ids=torch.tensor([tokens]), past_key_values=cache, use_cache=True)
        return [(layer.keys, layer.values) for layer in cache.layers]
    heads = model.config.num_key_value_heads
    dim = (
        getattr(model.config, "head_dim", None)
        or model.config.hidden_size // model.config.num_attention_heads
    )
    empty = torch.zeros((1, heads, 0, dim))
    return [(empty, empty) for _ in range(model.config.num_hidden_layers)]


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3"])
def test_a_ragged_step_gives_each_row_the_logits_and_cache_of_its_own_forward(model_type: str) -> None:
    model = tiny_model(model_type)
    assert unsupported(model.config) is None
    g = torch.Generator().manual_seed(1)
    # (cached tokens, new tokens): a decoding row, a row joining with a cached prefix, a fresh row, a row
    # whose context is longer than the rest.
    shapes = [(9, 1), (5, 4), (0, 6), (14, 3)]
    sequences = [torch.randint(0, TINY["vocab_size"], (p + n,), generator=g).tolist() for p, n in shapes]
    width = max(p + n - 1 for p, n in shapes)
    layers = [GrowingLayer() for _ in range(TINY["num_hidden_layers"])]
    per_row = [keys_and_values(model, seq[:p]) for seq, (p, _) in zip(sequences, shapes, strict=True)]
    for index, layer in enumerate(layers):
        blocks = []
        for row, (_, n) in enumerate(shapes):
            k, v = per_row[row][index]
            reserved = k.new_zeros((1, k.shape[1], n - 1, k.shape[3]))
            blocks.append((torch.cat([k, reserved], dim=2), torch.cat([v, reserved], dim=2)))
        restack(layer, blocks, width, capacity=len(shapes))
    mask = torch.zeros((len(shapes), width + 1), dtype=torch.bool)
    for row, (p, n) in enumerate(shapes):
        mask[row, width + 1 - p - n :] = True
    feed = Feed.build(
        [seq[p:] for seq, (p, _) in zip(sequences, shapes, strict=True)], [p for p, _ in shapes], mask, None
    )
    with torch.inference_mode():
        logits = forward(model, layers, feed)
        for row, seq in enumerate(sequences):
            want = model(input_ids=torch.tensor([seq])).logits[0, -1]
            torch.testing.assert_close(logits[row], want, rtol=1e-4, atol=1e-4)
            for index, (k, v) in enumerate(keys_and_values(model, seq)):
                length = len(seq)
                torch.testing.assert_close(layers[index].keys[row, :, -length:], k[0], rtol=1e-4, atol=1e-5)
                torch.testing.assert_close(layers[index].values[row, :, -length:], v[0], rtol=1e-4, atol=1e-5)


def test_models_it_cannot_run_are_named_with_the_reason() -> None:
    sliding = AutoConfig.for_model("mistral", **TINY)
    sliding.sliding_window = 32
    assert "sliding window" in str(unsupported(sliding))
    assert "gpt2" in str(unsupported(AutoConfig.for_model("gpt2")))


def test_the_server_refuses_a_model_it_cannot_run_naming_why_and_what_serves_it(tmp_path: Path) -> None:
    config = AutoConfig.for_model("gpt2", n_layer=1, n_embd=32, n_head=2, vocab_size=64)
    config.save_pretrained(tmp_path)  # the architecture is read before any weight or tokenizer is
    done = subprocess.run(
        [sys.executable, "-m", "serving.server", "--model", str(tmp_path), "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    assert "model type 'gpt2' is not one of llama" in done.stderr and "--engine vllm" in done.stderr
    assert "Traceback" not in done.stderr
