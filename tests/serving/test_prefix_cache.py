"""Prefix caching in the CPU engine: the same tokens as without it, less to forward, bounded memory."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import torch
from transformers import AutoTokenizer

from base_models.resolve import ensure_smollm2
from serving import batcher, sampling
from serving.batcher import GenerationEngine, GenerationRequest
from serving.prefix_cache import BLOCK, CachedSequence, PrefixCache
from serving.sampling import RowSampler, SamplingParams, StepSample

GREEDY = SamplingParams(max_tokens=12, temperature=0.0)


def sequence(tokens: list[int], adapter: str | None = None, width: int = 4) -> CachedSequence:
    """A kept sequence whose key at position p holds p (so a test can see which columns it got)."""
    keys = [torch.arange(len(tokens), dtype=torch.float32).reshape(1, -1, 1).expand(2, -1, width).clone()]
    return CachedSequence(adapter, tokens, keys, [k.clone() for k in keys])


def test_the_longest_kept_prefix_is_found_and_never_the_whole_prompt() -> None:
    cache = PrefixCache(max_bytes=1 << 20)
    turn1 = list(range(100, 140))
    cache.insert(sequence(turn1))
    turn2 = [*turn1, 7, 8, 9]
    hit = cache.lookup(None, turn2)
    assert hit is not None and hit[1] == len(turn1) and hit[0].tokens == turn1
    assert cache.lookup(None, turn1)[1] == len(turn1) - 1  # type: ignore[index]  # the last token is forwarded
    diverged = [*turn1[:20], 999, *turn1[21:]]
    assert cache.lookup(None, diverged)[1] == 20  # type: ignore[index]  # found at a block, cut at the change
    assert cache.lookup(None, [999, *turn1]) is None
    assert cache.lookup("an-adapter", turn2) is None  # another adapter's KV is not this one's


def test_a_longer_turn_replaces_the_one_it_extends_and_unloading_an_adapter_forgets_it() -> None:
    cache = PrefixCache(max_bytes=1 << 20)
    first = list(range(2 * BLOCK))
    cache.insert(sequence(first, "a@1"))
    cache.insert(sequence([*first, *range(500, 520)], "a@1"))
    cache.insert(sequence(first, "b@1"))
    assert len(cache) == 2
    cache.drop_adapter("a@1")
    assert len(cache) == 1 and cache.lookup("a@1", [*first, 1]) is None and cache.lookup("b@1", [*first, 1])


def test_memory_stays_under_the_byte_limit_least_recently_used_first() -> None:
    one = sequence(list(range(BLOCK * 4))).nbytes
    cache = PrefixCache(max_bytes=3 * one)
    prompts = [[p, *range(BLOCK * 4 - 1)] for p in range(5)]
    for prompt in prompts[:3]:
        cache.insert(sequence(prompt))
    assert cache.lookup(None, [*prompts[0], 1]) is not None  # used: now the most recent
    for prompt in prompts[3:]:
        cache.insert(sequence(prompt))
    assert cache.nbytes <= 3 * one and len(cache) == 3
    kept = [cache.lookup(None, [*p, 1]) is not None for p in prompts]
    assert kept == [True, False, False, True, True]


@pytest.fixture(scope="module")
def tokenizer() -> object:
    return AutoTokenizer.from_pretrained(str(ensure_smollm2()))


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[GenerationEngine, GenerationEngine]]:
    plain = GenerationEngine(str(ensure_smollm2()))
    cached = GenerationEngine(str(ensure_smollm2()), prefix_cache_bytes=256 << 20)
    try:
        yield plain, cached
    finally:
        plain.close()
        cached.close()


def chat_ids(tokenizer: object, messages: list[dict[str, str]]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)  # type: ignore[attr-defined]
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])  # type: ignore[operator]


def text_ids(tokenizer: object, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])  # type: ignore[operator]


async def conversation(engine: GenerationEngine, tokenizer: object, turns: int) -> list[list[int]]:
    """A multi-turn chat: each turn sends the whole conversation so far, as an agent does."""
    messages = [{"role": "user", "content": "Count the letters in 'banana', then tell me a fun fact."}]
    outputs = []
    for turn in range(turns):
        [done] = await engine.generate([GenerationRequest(chat_ids(tokenizer, messages), None, GREEDY)])
        outputs.append(done.token_ids)
        messages += [{"role": "assistant", "content": done.text}, {"role": "user", "content": f"And {turn}?"}]
    return outputs


async def test_a_multi_turn_conversation_samples_the_same_tokens_with_and_without_the_cache(
    engines: tuple[GenerationEngine, GenerationEngine], tokenizer: object
) -> None:
    plain, cached = engines
    assert cached.prefix_cache is not None
    before = cached.prefix_cache.reused_tokens
    assert await conversation(cached, tokenizer, 3) == await conversation(plain, tokenizer, 3)
    assert cached.prefix_cache.reused_tokens - before > 60  # turns 2 and 3 reused the turns before them


async def test_a_groups_shared_prompt_is_prefilled_once_with_the_same_distribution(
    engines: tuple[GenerationEngine, GenerationEngine], tokenizer: object
) -> None:
    plain, cached = engines
    assert cached.prefix_cache is not None
    prompt = chat_ids(
        tokenizer, [{"role": "user", "content": "Name a color and a fruit, in one short line."}]
    )
    hits = cached.prefix_cache.hits
    greedy = [GenerationRequest(prompt, None, GREEDY) for _ in range(4)]
    assert [c.token_ids for c in await cached.generate(greedy)] == [
        c.token_ids for c in await plain.generate(greedy)
    ]
    assert cached.prefix_cache.hits - hits >= 4  # every row found the shared prompt
    # Sampled rows: until two rows first differ (a draw from the tail can flip on a 1e-5 difference in the
    # logits, as it can between two batch shapes without any cache), every logprob agrees.
    sampled = [GenerationRequest(prompt, None, SamplingParams(max_tokens=10, seed=s)) for s in range(4)]
    for a, b in zip(await cached.generate(sampled), await plain.generate(sampled), strict=True):
        same = next(
            (i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids, strict=False)) if x != y),
            len(a.token_ids),
        )
        assert same >= 1
        assert max(abs(x - y) for x, y in zip(a.logprobs[:same], b.logprobs[:same], strict=False)) < 1e-4


async def test_groups_with_one_system_prompt_forward_it_once(
    engines: tuple[GenerationEngine, GenerationEngine], tokenizer: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The groups of one step share a long system prompt and differ in their question: the first group's
    prompt is forwarded whole, the second's past the system prompt only."""
    plain, cached = engines
    assert cached.prefix_cache is not None
    cached.prefix_cache.clear()
    system = {"role": "system", "content": "You answer in one short line. " * 12 + "Be kind and precise."}
    first, second = (
        chat_ids(tokenizer, [system, {"role": "user", "content": question}])
        for question in ("Name a fruit.", "Name a colour of the sky at dusk.")
    )
    common = next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
    assert common > 4 * BLOCK
    forwarded = record_forwards(cached, monkeypatch)
    greedy = [GenerationRequest(p, None, GREEDY) for p in (first, first, second, second)]
    assert [c.token_ids for c in await cached.generate(greedy)] == [
        c.token_ids for c in await plain.generate(greedy)
    ]
    # the two prompts but their last token, the second past the system prompt it shares with the first,
    # then each row's last prompt token (one step) and the decode steps (one token a row)
    assert forwarded[:3] == [[len(first) - 1], [len(second) - 1 - common], [1, 1, 1, 1]]
    assert all(set(step) == {1} for step in forwarded[3:])


async def test_a_request_arriving_while_its_prompt_decodes_finds_it_kept(
    engines: tuple[GenerationEngine, GenerationEngine], tokenizer: object
) -> None:
    """A group's rollouts reach the server one HTTP request at a time: the first one's prompt is kept as
    soon as it is prefilled, so the next forwards only its last token while the first is still decoding."""
    plain, cached = engines
    assert cached.prefix_cache is not None
    cached.prefix_cache.clear()
    prompt = chat_ids(
        tokenizer, [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
    )
    long = GenerationRequest(prompt, None, SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True))
    [first] = cached.submit([long])
    while len(cached.prefix_cache) == 0:  # noqa: ASYNC110 (the engine thread sets no event to await)
        await asyncio.sleep(0.005)
    reused = cached.prefix_cache.reused_tokens
    [second] = await cached.generate([GenerationRequest(prompt, None, GREEDY)])
    assert not first.done()  # still decoding: what the second request found is the first one's prompt
    assert cached.prefix_cache.reused_tokens - reused == len(prompt) - 1
    [expected] = await plain.generate([GenerationRequest(prompt, None, GREEDY)])
    assert second.token_ids == expected.token_ids
    first.result(timeout=600)


async def test_a_cache_hit_and_a_miss_join_in_one_step_each_forwarding_only_its_own_tokens(
    engines: tuple[GenerationEngine, GenerationEngine], tokenizer: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row that forwards one token is not padded to the width of a row that forwards its whole prompt: both
    go through the same step, each with its own tokens, and sample what they sample on their own."""
    plain, cached = engines
    assert cached.prefix_cache is not None
    known = text_ids(tokenizer, "The moon has phases because, as it goes round the Earth, the sunlit half")
    [alone] = await cached.generate([GenerationRequest(known, None, GREEDY)])  # now kept
    new = text_ids(tokenizer, "A prime number is a whole number greater than one whose only divisors")
    forwarded = record_forwards(cached, monkeypatch)
    both = await cached.generate(
        [GenerationRequest(known, None, GREEDY), GenerationRequest(new, None, GREEDY)]
    )
    assert forwarded[0] == [1, len(new)]
    assert [c.token_ids for c in both] == [
        alone.token_ids,
        (await plain.generate([GenerationRequest(new, None, GREEDY)]))[0].token_ids,
    ]


def record_forwards(engine: GenerationEngine, monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """Each step's tokens per row, as ``engine`` forwards them from now on."""
    forwarded: list[list[int]] = []
    forward = engine._forward

    def recording(rows: object, layers: object, pending: list[list[int]], *rest: object) -> torch.Tensor:
        forwarded.append([len(p) for p in pending])
        return forward(rows, layers, pending, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(engine, "_forward", recording)
    return forwarded


async def test_a_forward_that_fails_while_rows_join_fails_those_requests_and_the_engine_serves_on(
    engines: tuple[GenerationEngine, GenerationEngine], tokenizer: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group's shared prompt is forwarded while its rows join (taken from the queue, in no batch yet). When
    that forward fails (as oneDNN's bf16 linear did on a CPU without AVX512), each of those requests must get
    the error; they used to wait forever, their HTTP requests with them."""
    _, cached = engines
    prompt = chat_ids(
        tokenizer, [{"role": "user", "content": "Name a colour that starts with the letter q."}]
    )
    forward = cached._forward
    failures = [RuntimeError("planted: the forward failed")]

    def failing_once(*args: object) -> torch.Tensor:
        if failures:
            raise failures.pop()
        return forward(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(cached, "_forward", failing_once)
    group = [GenerationRequest(prompt, None, GREEDY) for _ in range(2)]
    with pytest.raises(RuntimeError, match="planted"):
        await asyncio.wait_for(cached.generate(group), 60)
    assert not failures  # the failure came from the forward while the rows joined
    [answer] = await asyncio.wait_for(cached.generate([GenerationRequest(prompt, None, GREEDY)]), 120)
    assert answer.token_ids


async def test_rows_that_cannot_be_sampled_fail_alone_and_their_batch_mates_finish(
    engines: tuple[GenerationEngine, GenerationEngine], tokenizer: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine itself, below the server's checks: requests whose parameters no step can sample (a seed
    beyond 64 bits, stop ids beyond the vocabulary) submitted with good ones fail alone before they join, and a
    step whose sampling fails for one row (planted: a sampler bug that one row's parameters trigger) fails
    that row only; the others get the tokens they get without it."""
    plain, _ = engines
    prompt = chat_ids(tokenizer, [{"role": "user", "content": "Count to ten."}])
    good = SamplingParams(max_tokens=10, temperature=1.0, seed=3, ignore_eos=True)
    bad = {
        "seed": SamplingParams(max_tokens=10, seed=2**64),
        "stop_token_ids": SamplingParams(max_tokens=10, stop_token_ids=(10**6,), min_tokens=3),
    }
    [alone] = await plain.generate([GenerationRequest(prompt, None, good)])
    futures = plain.submit([GenerationRequest(prompt, None, p) for p in (good, *bad.values(), good)])
    results = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures), return_exceptions=True)
    assert [r.token_ids for r in (results[0], results[-1])] == [alone.token_ids] * 2  # type: ignore[union-attr]
    for param, result in zip(bad, results[1:-1], strict=True):
        assert isinstance(result, ValueError) and str(result).startswith(param), result

    marked = 7  # top_logprobs=7 marks the row the planted sampler bug breaks on
    real = batcher.sample_step

    def breaks_on_the_marked_row(logits: torch.Tensor, rows: RowSampler, n: list[int]) -> StepSample:
        if marked in rows.top_logprobs:
            raise IndexError("planted: a sampler bug this row's parameters trigger")
        return real(logits, rows, n)

    monkeypatch.setattr(batcher, "sample_step", breaks_on_the_marked_row)
    monkeypatch.setattr(sampling, "sample_step", breaks_on_the_marked_row)  # a row sampled alone too
    broken = SamplingParams(max_tokens=10, seed=4, top_logprobs=marked)
    futures = plain.submit([GenerationRequest(prompt, None, p) for p in (good, broken, good)])
    results = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures), return_exceptions=True)
    assert isinstance(results[1], IndexError) and "planted" in str(results[1])
    assert [r.token_ids for r in (results[0], results[2])] == [alone.token_ids] * 2  # type: ignore[union-attr]
