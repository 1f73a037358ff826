"""The GRPO policy loss: token-level importance ratio against the sampling logprobs.

Per trainable token ``t`` of a sequence with advantage ``A``:

- ``ratio = exp(logprob_t - sampling_logprob_t)`` (the sampling policy is the one that generated the
  token; its logprobs came back from the server, so no recompute of the "old" policy is needed).
- ``ppo_clip``: ``-min(ratio * A, clip(ratio, 1 - epsilon, 1 + epsilon_high) * A)``.
- ``cispo`` (truncated importance sampling): ``-sg(min(ratio, 1 + epsilon_high)) * A * logprob_t``;
  the weight is detached, so every token keeps a gradient (none is clipped to zero), as in MiniMax-M1.
- KL to the base policy (adapter disabled), k3 estimator: ``exp(ref - lp) - (ref - lp) - 1``, times
  ``kl_coef``, added per token.

Aggregation: a weighted sum over trainable tokens divided by the step's total weight, so the micro-batch
losses of a step add up to the step's loss whatever the micro-batch size (gradient accumulation is then
exact, and halving the micro-batch after an OOM does not change the update). By default every trainable
token weighs 1 (the mean over the step's trainable tokens, as DAPO/Dr. GRPO); with ``length_weighting``
a trajectory's tokens weigh ``1 / its trainable token count`` (every trajectory weighs equally, as the
original GRPO's per-sequence mean).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from schemas.config import TrainConfig


@dataclass(frozen=True)
class LossParams:
    """The loss's knobs, taken from ``TrainConfig``."""

    epsilon: float = 0.2
    epsilon_high: float = 0.2
    importance_sampling: str = "ppo_clip"
    kl_coef: float = 0.0

    @classmethod
    def from_config(cls, config: TrainConfig) -> LossParams:
        high = config.epsilon if config.epsilon_high is None else config.epsilon_high
        return cls(config.epsilon, high, config.importance_sampling, config.kl_coef)


@dataclass
class LossOutput:
    loss: torch.Tensor
    """Scalar: this micro-batch's share of the step loss (sum of weighted token losses / step weight)."""
    policy_loss_sum: float
    """Weighted sum of the policy terms (for logging; divide by the step weight)."""
    kl_sum: float
    """Weighted sum of the KL terms."""
    ratio_sum: float
    """Unweighted sum of ratios over trainable tokens."""
    clipped_tokens: int
    """Trainable tokens whose ratio was outside the clip range."""
    n_tokens: int
    """Trainable tokens in the micro-batch."""


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits)[..., target]`` without materialising the full log-softmax twice."""
    logits = logits.float()
    return torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def grpo_loss(
    logprobs: torch.Tensor,
    sampling_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    total_weight: float,
    params: LossParams,
    ref_logprobs: torch.Tensor | None = None,
) -> LossOutput:
    """The policy loss of one micro-batch.

    All tensors are ``[batch, tokens]`` (``advantages`` may be ``[batch]``); ``weights`` is zero on
    tokens that are not trained (prompt, padding, tool output), so it is also the loss mask.
    ``total_weight`` is the sum of ``weights`` over the whole step (all micro-batches).
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand_as(logprobs)
    mask = weights > 0
    # Masked positions may hold NaN/garbage sampling logprobs; zero them before exp.
    log_ratio = torch.where(mask, logprobs - sampling_logprobs, torch.zeros_like(logprobs))
    ratio = torch.exp(log_ratio)
    low, high = 1.0 - params.epsilon, 1.0 + params.epsilon_high
    if params.importance_sampling == "ppo_clip":
        unclipped = ratio * advantages
        clipped = torch.clamp(ratio, low, high) * advantages
        per_token = -torch.minimum(unclipped, clipped)
        outside = (ratio < low) | (ratio > high)
    elif params.importance_sampling == "cispo":
        weight = torch.clamp(ratio, max=high).detach()
        per_token = -weight * advantages * logprobs
        outside = ratio > high
    else:
        raise ValueError(f"unknown importance_sampling {params.importance_sampling!r}")
    kl = torch.zeros_like(per_token)
    if params.kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs (the base policy's logprobs)")
        delta = torch.where(mask, ref_logprobs - logprobs, torch.zeros_like(logprobs))
        kl = torch.exp(delta) - delta - 1.0
    weighted_policy = (per_token * weights).sum()
    weighted_kl = (kl * weights).sum()
    loss = (weighted_policy + params.kl_coef * weighted_kl) / total_weight
    return LossOutput(
        loss=loss,
        policy_loss_sum=float(weighted_policy.detach()),
        kl_sum=float(weighted_kl.detach()),
        ratio_sum=float(ratio.detach()[mask].sum()),
        clipped_tokens=int((outside & mask).sum()),
        n_tokens=int(mask.sum()),
    )
