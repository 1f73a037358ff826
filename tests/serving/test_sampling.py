"""One sampling step over rows with their own parameters: raw logprobs, seeds, greedy, top-p, top-k, EOS bans."""

from __future__ import annotations

import torch

from serving.sampling import RowSampler, SamplingParams, sample_step

EOS = 2


def rows(*params: SamplingParams) -> RowSampler:
    generator = torch.Generator()
    generator.manual_seed(0)
    return RowSampler.build(list(params), [EOS], generator)


def logits(batch: int, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_logprobs_are_the_raw_distribution_whatever_the_temperature_and_filters() -> None:
    x = logits(3)
    step = sample_step(
        x,
        rows(
            SamplingParams(8, temperature=0.3),
            SamplingParams(8, temperature=1.7, top_p=0.5),
            SamplingParams(8, top_k=3),
        ),
        [0, 0, 0],
    )
    raw = torch.log_softmax(x, dim=-1)
    for i, token in enumerate(step.tokens):
        assert abs(step.logprobs[i] - float(raw[i, token])) < 1e-6


def test_greedy_rows_take_the_argmax() -> None:
    x = logits(4)
    step = sample_step(x, rows(*[SamplingParams(8, temperature=0.0)] * 4), [0] * 4)
    assert step.tokens == x.argmax(dim=-1).tolist()


def test_a_seeded_row_is_reproducible_and_independent_of_its_batch_mates() -> None:
    x = logits(1, seed=5)
    alone = [sample_step(x, rows(SamplingParams(8, seed=11)), [0]).tokens[0]]
    crowd = sample_step(
        x.repeat(3, 1), rows(SamplingParams(8), SamplingParams(8, seed=11), SamplingParams(8)), [0] * 3
    )
    assert crowd.tokens[1] == alone[0]
    many = [sample_step(x, rows(SamplingParams(8, seed=s)), [0]).tokens[0] for s in range(40)]
    assert len(set(many)) > 3  # it does sample


def test_sampling_follows_the_distribution() -> None:
    x = torch.log(torch.tensor([[0.7, 0.2, 0.1, 0.0]]))
    sampler = rows(SamplingParams(8))
    counts = torch.zeros(4)
    for _ in range(2000):
        counts[sample_step(x, sampler, [0]).tokens[0]] += 1
    assert counts[3] == 0
    assert torch.allclose(counts / 2000, torch.tensor([0.7, 0.2, 0.1, 0.0]), atol=0.04)


def test_top_p_and_top_k_restrict_the_support() -> None:
    x = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    top_p = rows(SamplingParams(8, top_p=0.6))  # keeps 0.5 and 0.3
    top_k = rows(SamplingParams(8, top_k=1))
    seen_p = {sample_step(x, top_p, [0]).tokens[0] for _ in range(300)}
    seen_k = {sample_step(x, top_k, [0]).tokens[0] for _ in range(50)}
    assert seen_p == {0, 1} and seen_k == {0}


def test_end_tokens_are_banned_before_min_tokens() -> None:
    x = torch.full((2, 10), -20.0)
    x[:, EOS] = 10.0  # EOS is almost certain
    x[:, 7] = 9.0
    sampler = rows(
        SamplingParams(8, min_tokens=2), SamplingParams(8, min_tokens=3, stop_token_ids=(7,), temperature=0.0)
    )
    early = sample_step(x, sampler, [1, 2])
    assert EOS not in early.tokens and early.tokens[1] != 7
    later = sample_step(x, sampler, [2, 3])
    assert later.tokens == [EOS, EOS]


def test_top_logprobs_are_sorted_raw_logprobs() -> None:
    x = logits(2)
    step = sample_step(x, rows(SamplingParams(8, top_logprobs=3), SamplingParams(8)), [0, 0])
    raw = torch.log_softmax(x, dim=-1)
    ids = [i for i, _ in step.top[0]]
    assert ids == raw[0].topk(3).indices.tolist()
    assert [lp for _, lp in step.top[0]] == sorted((lp for _, lp in step.top[0]), reverse=True)
    assert step.top[1] == []
