"""Sampling parameters and one vectorized sampling step over a batch whose rows each have their own.

Logprobs are those of the raw model distribution (temperature 1, no top-p/top-k), computed in fp32 from
the raw logits, as vLLM's default ``logprobs_mode=raw_logprobs`` returns them: the trainer scores the same
tokens under the policy from raw logits, so the importance ratio compares like with like. Temperature,
top-p, top-k and a logit bias only shape which token is drawn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from schemas.numbers import SEED_MAX, SEED_MIN

GREEDY_BELOW = 1e-5
"""A temperature under this is greedy decoding (argmax), as in vLLM."""
MAX_LOGIT_BIAS = 100.0
"""A logit bias is clamped to within this, as vLLM does."""


@dataclass(frozen=True)
class SamplingParams:
    """How one completion is sampled (one row of a batch)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0 keeps every token."""
    seed: int | None = None
    """A seeded row draws from its own generator, so its output does not depend on its batch mates."""
    stop: tuple[str, ...] = ()
    """Strings that end the completion (excluded from the text, kept in ``token_ids``)."""
    stop_token_ids: tuple[int, ...] = ()
    """Token ids that end the completion besides the model's EOS tokens."""
    ignore_eos: bool = False
    """EOS does not end the completion (it may still be drawn), as in vLLM."""
    min_tokens: int = 0
    """EOS and stop tokens are not drawn before this many tokens."""
    top_logprobs: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, bias) added to the row's logits before a token is drawn (vLLM's ``logit_bias``); like
    temperature, it shapes only which token is drawn, never the raw logprobs returned."""

    def problem(self, vocab_size: int) -> tuple[str, str] | None:
        """``(parameter, what is wrong)`` when these parameters cannot be sampled with a vocabulary of
        ``vocab_size`` logits, else None: checked before a row joins a batch, so a bad row fails alone."""
        if self.seed is not None and not SEED_MIN <= self.seed <= SEED_MAX:
            return "seed", f"seed {self.seed} is outside [{SEED_MIN}, {SEED_MAX}]"
        for name, ids in (
            ("stop_token_ids", self.stop_token_ids),
            ("logit_bias", [i for i, _ in self.logit_bias]),
        ):
            outside = [i for i in ids if not 0 <= i < vocab_size]
            if outside:
                return name, f"token id(s) {outside[:8]} in {name} are outside the vocabulary of {vocab_size}"
        if any(not math.isfinite(b) for _, b in self.logit_bias):
            return "logit_bias", "logit_bias values must be finite numbers"
        numbers = {"temperature": self.temperature, "top_p": self.top_p}
        for name, value in numbers.items():
            if not math.isfinite(value) or value < 0:
                return name, f"{name} must be a finite number >= 0, got {value}"
        if not 0 < self.top_p <= 1:
            return "top_p", f"top_p must be in (0, 1], got {self.top_p}"
        if self.max_tokens < 1:
            return "max_tokens", f"max_tokens must be at least 1, got {self.max_tokens}"
        if not 0 <= self.min_tokens <= self.max_tokens:
            return (
                "min_tokens",
                f"min_tokens {self.min_tokens} must be within [0, max_tokens={self.max_tokens}]",
            )
        if self.top_logprobs < 0:
            return "top_logprobs", f"top_logprobs must be >= 0, got {self.top_logprobs}"
        return None


@dataclass
class RowSampler:
    """Per-row sampling state kept by the batch: tensors indexed like the batch's rows."""

    temperature: torch.Tensor
    top_p: torch.Tensor
    top_k: list[int]
    generators: list[torch.Generator | None]
    banned_until: list[int]
    """Row i may not draw an end token while it has fewer than ``banned_until[i]`` tokens."""
    end_ids: list[list[int]]
    top_logprobs: list[int]
    logit_bias: list[tuple[list[int], torch.Tensor] | None]
    """Per row, the token ids its ``logit_bias`` moves and by how much (None: no bias)."""
    default_generator: torch.Generator
    """Draws for the unseeded rows (one engine-wide generator, seeded at random)."""

    @classmethod
    def build(
        cls, params: list[SamplingParams], eos_ids: list[int], default_generator: torch.Generator
    ) -> RowSampler:
        generators: list[torch.Generator | None] = []
        for p in params:
            gen = None
            if p.seed is not None:
                gen = torch.Generator()
                gen.manual_seed(p.seed)
            generators.append(gen)
        return cls(
            temperature=torch.tensor([p.temperature for p in params], dtype=torch.float32),
            top_p=torch.tensor([p.top_p for p in params], dtype=torch.float32),
            top_k=[p.top_k for p in params],
            generators=generators,
            banned_until=[p.min_tokens for p in params],
            end_ids=[[*([] if p.ignore_eos else eos_ids), *p.stop_token_ids] for p in params],
            top_logprobs=[p.top_logprobs for p in params],
            logit_bias=[_bias(p.logit_bias) for p in params],
            default_generator=default_generator,
        )

    def select(self, keep: list[int]) -> None:
        """Keep only the rows ``keep`` (finished rows leave the batch)."""
        index = torch.tensor(keep, dtype=torch.long)
        self.temperature = self.temperature[index]
        self.top_p = self.top_p[index]
        self.top_k = [self.top_k[i] for i in keep]
        self.generators = [self.generators[i] for i in keep]
        self.banned_until = [self.banned_until[i] for i in keep]
        self.end_ids = [self.end_ids[i] for i in keep]
        self.top_logprobs = [self.top_logprobs[i] for i in keep]
        self.logit_bias = [self.logit_bias[i] for i in keep]

    def row(self, i: int) -> RowSampler:
        """Row ``i`` alone (its generator shared: what it draws advances the row's own stream)."""
        return RowSampler(
            temperature=self.temperature[i : i + 1],
            top_p=self.top_p[i : i + 1],
            top_k=[self.top_k[i]],
            generators=[self.generators[i]],
            banned_until=[self.banned_until[i]],
            end_ids=[self.end_ids[i]],
            top_logprobs=[self.top_logprobs[i]],
            logit_bias=[self.logit_bias[i]],
            default_generator=self.default_generator,
        )

    def extend(self, other: RowSampler) -> None:
        """Append ``other``'s rows (requests joining a running batch)."""
        self.temperature = torch.cat([self.temperature, other.temperature])
        self.top_p = torch.cat([self.top_p, other.top_p])
        self.top_k += other.top_k
        self.generators += other.generators
        self.banned_until += other.banned_until
        self.end_ids += other.end_ids
        self.top_logprobs += other.top_logprobs
        self.logit_bias += other.logit_bias


def _bias(logit_bias: tuple[tuple[int, float], ...]) -> tuple[list[int], torch.Tensor] | None:
    if not logit_bias:
        return None
    ids = [i for i, _ in logit_bias]
    values = [max(-MAX_LOGIT_BIAS, min(MAX_LOGIT_BIAS, b)) for _, b in logit_bias]
    return ids, torch.tensor(values, dtype=torch.float32)


@dataclass
class StepSample:
    tokens: list[int]
    logprobs: list[float]
    top: list[list[tuple[int, float]]]
    """Per row, the ``top_logprobs`` most likely tokens of the raw distribution (empty when not asked)."""


TOP_P_CANDIDATES = 256
"""Top-p looks at this many most likely tokens first; a full sort only when they cover less than top_p."""


def _top_p_mask(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """True for the tokens of one row that top-p drops (keeps the smallest set covering ``top_p``)."""
    k = min(TOP_P_CANDIDATES, probs.shape[0])
    values, ids = torch.topk(probs, k)
    total = float(probs.sum())
    if float(values.sum()) < top_p * total:  # the candidates do not cover it: sort everything
        values, ids = torch.sort(probs, descending=True)
    keep_sorted = (values.cumsum(0) - values) < top_p * total
    drop = torch.ones_like(probs, dtype=torch.bool)
    drop[ids[keep_sorted]] = False
    return drop


def sample_step(logits: torch.Tensor, rows: RowSampler, n_generated: list[int]) -> StepSample:
    """Draw one token per row from ``logits`` (batch x vocab) and return the raw logprobs of the draws.

    Inverse-CDF sampling with one uniform per row (from the row's own generator when seeded): on a CPU
    far cheaper than ``torch.multinomial`` or an exponential race over the whole vocabulary. Rows at
    temperature 1 with no filter share the one ``exp`` pass that also gives the logsumexp.
    """
    raw = logits.float()
    peak = raw.max(dim=-1, keepdim=True).values
    weights = torch.exp(raw - peak)  # unnormalised temperature-1 probabilities, reshaped per row below
    lse = peak.squeeze(1) + torch.log(weights.sum(dim=-1))
    logits = raw
    if any(b is not None for b in rows.logit_bias):  # a biased row draws from its biased logits
        logits, peak = raw.clone(), peak.clone()
        for i, bias in enumerate(rows.logit_bias):
            if bias is not None:
                logits[i, bias[0]] += bias[1]
                peak[i] = logits[i].max()
                weights[i] = torch.exp(logits[i] - peak[i])
    greedy: list[int] = []
    for i, n in enumerate(n_generated):
        temperature, top_p, top_k = float(rows.temperature[i]), float(rows.top_p[i]), rows.top_k[i]
        banned = rows.end_ids[i] if n < rows.banned_until[i] else []
        if temperature < GREEDY_BELOW:
            greedy.append(i)
            continue
        if temperature == 1.0 and top_p >= 1.0 and top_k <= 0 and not banned:
            continue
        row = weights[i] if temperature == 1.0 else torch.exp((logits[i] - peak[i]) / temperature)
        if banned:
            row[banned] = 0.0
        if 0 < top_k < row.shape[0]:
            row = row.masked_fill(row < torch.topk(row, top_k).values[-1], 0.0)
        if top_p < 1.0:
            row = row.masked_fill(_top_p_mask(row, top_p), 0.0)
        weights[i] = row
    cdf = weights.cumsum(dim=-1)
    uniform = torch.rand(len(n_generated), generator=rows.default_generator)
    for i, gen in enumerate(rows.generators):
        if gen is not None:
            uniform[i] = torch.rand(1, generator=gen)[0]
    chosen = torch.searchsorted(cdf, (uniform * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)
    chosen = chosen.clamp(max=logits.shape[1] - 1)
    for i in greedy:
        row = logits[i].clone()
        if n_generated[i] < rows.banned_until[i] and rows.end_ids[i]:
            row[rows.end_ids[i]] = float("-inf")
        chosen[i] = torch.argmax(row)
    chosen_logprobs = raw.gather(1, chosen.unsqueeze(1)).squeeze(1) - lse
    top: list[list[tuple[int, float]]] = [[] for _ in rows.top_logprobs]
    k_max = max(rows.top_logprobs, default=0)
    if k_max > 0:
        values, ids = torch.topk(raw, k_max, dim=-1)
        values = values - lse.unsqueeze(1)
        for i, k in enumerate(rows.top_logprobs):
            top[i] = list(zip(ids[i, :k].tolist(), values[i, :k].tolist(), strict=True))
    return StepSample(tokens=chosen.tolist(), logprobs=chosen_logprobs.tolist(), top=top)


def sample_rows_alone(
    logits: torch.Tensor, rows: RowSampler, n_generated: list[int]
) -> tuple[StepSample, dict[int, BaseException]]:
    """``sample_step`` row by row, after the batch's step failed: the rows that sample, and the error of each
    row that cannot (its place in the sample holds a placeholder)."""
    out = StepSample(tokens=[], logprobs=[], top=[])
    failed: dict[int, BaseException] = {}
    for i, n in enumerate(n_generated):
        try:
            one = sample_step(logits[i : i + 1], rows.row(i), [n])
        except Exception as err:
            failed[i] = err
            one = StepSample(tokens=[0], logprobs=[0.0], top=[[]])
        out.tokens += one.tokens
        out.logprobs += one.logprobs
        out.top += one.top
    return out, failed
