"""The CPU engine's decode speed-ups change nothing it samples: cache layers that grow in place (rows joining
and leaving them in place), and a single adapter folded into the base weights."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from serving_adapters import chat, random_adapter
from transformers import AutoTokenizer, DynamicCache, PreTrainedTokenizerBase

import serving.running_batch as running_batch
from base_models.resolve import ensure_smollm2
from serving.batcher import Completion, GenerationEngine, GenerationRequest
from serving.kv_cache import MARGIN, SPARE, GrowingLayer, hole_filling, restack
from serving.sampling import SamplingParams

QUESTIONS = ["What is 2+2?", "Name a colour.", "Who wrote Hamlet?", "Give me a number.", "Say hello."]


def test_a_growing_layer_holds_what_concatenation_holds_and_reallocates_rarely() -> None:
    layer = GrowingLayer()
    g = torch.Generator().manual_seed(0)
    want_k = want_v = None
    storages = set()
    for step in range(SPARE + 10):  # past the spare columns once
        k = torch.randn((2, 3, 5 if step == 0 else 1, 4), generator=g)
        v = torch.randn((2, 3, 5 if step == 0 else 1, 4), generator=g)
        keys, values = layer.update(k, v)
        want_k = k if want_k is None else torch.cat([want_k, k], dim=-2)
        want_v = v if want_v is None else torch.cat([want_v, v], dim=-2)
        assert torch.equal(keys, want_k) and torch.equal(values, want_v)
        assert layer.keys is not None and torch.equal(layer.keys, want_k)
        storages.add(keys.data_ptr())
    assert len(storages) == 2  # the first allocation and one regrow, not one per step
    assert layer.get_seq_length() == 5 + SPARE + 9

    # Replaced as the batcher replaces them (keys first, then values): each keeps its own columns.
    assert layer.keys is not None and layer.values is not None and want_k is not None and want_v is not None
    layer.keys = layer.keys[:, :, 3:]
    layer.values = layer.values[:, :, 3:]
    assert torch.equal(layer.values, want_v[:, :, 3:])
    k, v = torch.ones((2, 3, 1, 4)), torch.zeros((2, 3, 1, 4))
    keys, values = layer.update(k, v)
    assert torch.equal(keys, torch.cat([want_k[:, :, 3:], k], dim=-2))
    assert torch.equal(values, torch.cat([want_v[:, :, 3:], v], dim=-2))

    layer.batch_select_indices(torch.tensor([1]))
    keys, _ = layer.update(k[:1], v[:1])
    assert torch.equal(keys, torch.cat([want_k[1:, :, 3:], k[:1], k[:1]], dim=-2))


def test_rows_join_and_leave_a_growing_layer_in_place() -> None:
    g = torch.Generator().manual_seed(0)

    def kv(rows: int, columns: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn((rows, 3, columns, 4), generator=g), torch.randn(
            (rows, 3, columns, 4), generator=g
        )

    def pad(t: torch.Tensor, width: int) -> torch.Tensor:
        return torch.cat([t.new_zeros((t.shape[0], 3, width - t.shape[2], 4)), t], dim=2)

    layer = GrowingLayer()
    k, v = kv(2, 5)
    restack(layer, [(k, v)], 5, capacity=5)
    storage = layer._k.data_ptr() if layer._k is not None else None
    want_k, want_v = k, v

    k, v = kv(1, 3)  # a shorter row joins, then a longer one (into the left margin)
    assert layer.append_rows(k, v)
    want_k, want_v = torch.cat([want_k, pad(k, 5)]), torch.cat([want_v, pad(v, 5)])
    k, v = kv(1, 5 + MARGIN)
    assert layer.append_rows(k, v)
    want_k = torch.cat([pad(want_k, 5 + MARGIN), k])
    want_v = torch.cat([pad(want_v, 5 + MARGIN), v])
    assert layer.keys is not None and layer.values is not None
    assert torch.equal(layer.keys, want_k) and torch.equal(layer.values, want_v)

    k, v = kv(4, 1)  # a decode step
    keys, values = layer.update(k, v)
    want_k, want_v = torch.cat([want_k, k], dim=2), torch.cat([want_v, v], dim=2)
    assert torch.equal(keys, want_k) and torch.equal(values, want_v)

    keep = hole_filling(4, {0, 2})  # the last row moves into the first hole
    assert keep == [3, 1]
    layer.keep_rows(keep, drop_columns=MARGIN - 2)
    want_k, want_v = want_k[keep, :, MARGIN - 2 :], want_v[keep, :, MARGIN - 2 :]
    assert torch.equal(layer.keys, want_k) and torch.equal(layer.values, want_v)
    assert layer._k is not None and layer._k.data_ptr() == storage  # no row copied but the one that moved

    k, v = kv(2, 1)
    keys, _ = layer.update(k, v)
    assert torch.equal(keys, torch.cat([want_k, k], dim=2))
    assert not layer.append_rows(*kv(4, 3))  # more rows than the storage holds: nothing changed
    assert not layer.append_rows(*kv(1, 200))  # longer than the left margin allows
    assert torch.equal(layer.keys, torch.cat([want_k, k], dim=2))


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(str(ensure_smollm2()))


def prompt(tokenizer: PreTrainedTokenizerBase, question: str) -> list[int]:
    text = tokenizer.apply_chat_template(chat(question), add_generation_prompt=True, tokenize=False)  # type: ignore[attr-defined]
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])  # type: ignore[operator]


def staggered(
    engine: GenerationEngine, first: list[GenerationRequest], *later: list[GenerationRequest]
) -> list[Completion]:
    """``first`` admitted together, each of ``later`` once the running batch has produced a token more (so
    they merge into it); rows finish at different steps (so finished rows leave while others run)."""
    futures = engine.submit(first)
    for wave in later:
        deadline = time.monotonic() + 60
        batch = engine._batch
        produced = len(batch.rows[0].tokens) if batch and batch.rows else 0
        while time.monotonic() < deadline:
            batch = engine._batch
            if batch and batch.rows and len(batch.rows[0].tokens) > produced:
                break
            time.sleep(0.002)
        futures += engine.submit(wave)
    return [f.result(timeout=300) for f in futures]


def requests(
    tokenizer: PreTrainedTokenizerBase, adapter: str | None = None
) -> tuple[list[GenerationRequest], list[GenerationRequest]]:
    greedy = [
        SamplingParams(max_tokens=6 + 4 * i, temperature=0.0, ignore_eos=True) for i in range(len(QUESTIONS))
    ]
    made = [
        GenerationRequest(prompt(tokenizer, q), adapter, p) for q, p in zip(QUESTIONS, greedy, strict=True)
    ]
    return made[:3], made[3:]


def test_greedy_tokens_are_the_same_as_with_transformers_cache(
    tokenizer: PreTrainedTokenizerBase, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, later = requests(tokenizer)
    # Waves joining a running batch (into spare rows, one with a longer prompt than the batch's context),
    # rows leaving it (the last rows moving into their places).
    longer = GenerationRequest(
        prompt(tokenizer, " ".join(QUESTIONS * 3)),
        None,
        SamplingParams(max_tokens=9, temperature=0.0, ignore_eos=True),
    )
    waves = [first, later[:1], later[1:], [longer]]
    engine = GenerationEngine(str(ensure_smollm2()), max_batch=8)
    try:
        growing = staggered(engine, *waves)
    finally:
        engine.close()
    monkeypatch.setattr(running_batch, "new_cache", lambda config: DynamicCache(config=config))
    engine = GenerationEngine(str(ensure_smollm2()), max_batch=8)
    try:
        plain = staggered(engine, *waves)
    finally:
        engine.close()
    assert [c.token_ids for c in growing] == [c.token_ids for c in plain]
    assert [len(c.token_ids) for c in growing] == [r.params.max_tokens for wave in waves for r in wave]


def base_weights(engine: GenerationEngine) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in engine.base.named_parameters() if "lora_" not in n}


def test_a_folded_adapter_samples_as_peft_does_and_leaves_the_base_weights_untouched(
    tokenizer: PreTrainedTokenizerBase, tmp_path: Path
) -> None:
    one = random_adapter(tmp_path / "one", seed=1)
    two = random_adapter(tmp_path / "two", seed=2)
    folded = GenerationEngine(str(ensure_smollm2()), max_batch=8, fold_adapters=True)
    peft = GenerationEngine(str(ensure_smollm2()), max_batch=8, fold_adapters=False)
    try:
        for engine in (folded, peft):
            engine.command("load", "a", str(one)).result()
        before = base_weights(folded)
        base_first, base_later = requests(tokenizer, None)
        base_before = staggered(folded, base_first, base_later)

        first, later = requests(tokenizer, "a")
        got, want = staggered(folded, first, later), staggered(peft, first, later)
        assert [c.token_ids for c in got] == [c.token_ids for c in want]
        worst = max(
            abs(x - y)
            for g, w in zip(got, want, strict=True)
            for x, y in zip(g.logprobs, w.logprobs, strict=True)
        )
        assert worst < 1e-4
        assert [c.token_ids for c in got] != [c.token_ids for c in base_before]  # the adapter mattered

        after = base_weights(folded)
        assert all(torch.equal(before[n], after[n]) for n in before)  # bitwise: folding never wrote them
        assert [c.token_ids for c in staggered(folded, base_first, base_later)] == [
            c.token_ids for c in base_before
        ]
        mixed = [base_first[0], first[1], base_first[2]]
        assert [c.token_ids for c in staggered(folded, mixed, [])] == [
            c.token_ids for c in staggered(peft, mixed, [])
        ]

        # The same name loaded again with other weights: the folded copy of the old ones is not served.
        for engine in (folded, peft):
            engine.command("load", "a", str(two)).result()
        again, want_again = staggered(folded, first, later), staggered(peft, first, later)
        assert [c.token_ids for c in again] == [c.token_ids for c in want_again]
        assert [c.token_ids for c in again] != [c.token_ids for c in got]
        # "a" reloaded filled the peft adapter it had (serving/adapter_slots.py); "b", a new one peft injects,
        # holding the same weights, samples the same.
        peft.command("load", "b", str(two)).result()
        fresh = staggered(peft, *requests(tokenizer, "b"))
        assert [c.token_ids for c in fresh] == [c.token_ids for c in want_again]
        # Within the same float tolerance as folded against peft above: `staggered` merges the later wave at
        # whatever step the running batch has reached, so the two runs batch (and round) differently.
        for f, w in zip(fresh, want_again, strict=True):
            assert f.logprobs == pytest.approx(w.logprobs, abs=1e-4)
    finally:
        folded.close()
        peft.close()
