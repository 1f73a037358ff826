"""The GRPO loss against a plain float64 reference written token by token."""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from activities.grpo_loss import LossParams, grpo_loss


def reference(lp, old, adv, w, total, p: LossParams, ref=None):
    """Loss value and d loss / d lp, one token at a time in float64."""
    loss, grad = 0.0, np.zeros_like(lp)
    low, high = 1 - p.epsilon, 1 + p.epsilon_high
    for b in range(lp.shape[0]):
        for t in range(lp.shape[1]):
            if w[b, t] <= 0:
                continue
            a, r = adv[b], math.exp(lp[b, t] - old[b, t])
            if p.importance_sampling == "ppo_clip":
                term = -min(r * a, min(max(r, low), high) * a)
                g = -a * r if (a >= 0 and r <= high) or (a < 0 and r >= low) else 0.0
            else:
                term, g = -min(r, high) * a * lp[b, t], -min(r, high) * a
            if p.kl_coef > 0:
                d = ref[b, t] - lp[b, t]
                term += p.kl_coef * (math.exp(d) - d - 1)
                g += p.kl_coef * (1 - math.exp(d))
            loss += w[b, t] * term
            grad[b, t] = w[b, t] * g / total
    return loss / total, grad


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    batch=st.integers(1, 4),
    tokens=st.integers(1, 12),
    mode=st.sampled_from(["ppo_clip", "cispo"]),
    epsilon=st.floats(0.05, 0.5),
    epsilon_high=st.floats(0.05, 0.5),
    kl_coef=st.sampled_from([0.0, 0.05, 0.3]),
    length_weights=st.booleans(),
)
def test_loss_and_gradient_match_float64_reference(
    seed, batch, tokens, mode, epsilon, epsilon_high, kl_coef, length_weights
):
    rng = np.random.default_rng(seed)
    lp = -rng.exponential(1.5, (batch, tokens))
    old = lp + rng.normal(0, 0.3, (batch, tokens))  # ratios spread across both clip edges
    ref = lp + rng.normal(0, 0.5, (batch, tokens))
    adv = rng.normal(0, 1, batch)
    mask = rng.random((batch, tokens)) < 0.7
    mask[0, 0] = True
    w = mask * (rng.uniform(0.1, 1.0, (batch, tokens)) if length_weights else 1.0)
    old[~mask] = np.nan  # off-mask sampling logprobs are garbage and must not leak in
    total = float(w.sum()) * rng.uniform(1.0, 3.0)  # this micro-batch is part of a larger step
    p = LossParams(epsilon, epsilon_high, mode, kl_coef)

    lp_t = torch.tensor(lp, dtype=torch.float64, requires_grad=True)
    out = grpo_loss(
        lp_t,
        torch.tensor(old),
        torch.tensor(adv),
        torch.tensor(w),
        total,
        p,
        torch.tensor(ref) if kl_coef > 0 else None,
    )
    out.loss.backward()
    want_loss, want_grad = reference(lp, old, adv, w, total, p, ref)
    assert math.isclose(float(out.loss.detach()), want_loss, rel_tol=1e-6, abs_tol=1e-12)
    np.testing.assert_allclose(lp_t.grad.numpy(), want_grad, rtol=1e-6, atol=1e-12)
    assert out.n_tokens == int(mask.sum())


def test_float32_loss_is_close_to_float64():
    rng = np.random.default_rng(0)
    lp = -rng.exponential(1.0, (8, 64))
    old = lp + rng.normal(0, 0.1, lp.shape)
    adv = rng.normal(0, 1, 8)
    w = np.ones_like(lp)
    p = LossParams()
    out = grpo_loss(
        torch.tensor(lp, dtype=torch.float32),
        torch.tensor(old, dtype=torch.float32),
        torch.tensor(adv, dtype=torch.float32),
        torch.tensor(w, dtype=torch.float32),
        float(w.sum()),
        p,
    )
    want, _ = reference(lp, old, adv, w, float(w.sum()), p)
    assert math.isclose(float(out.loss), want, rel_tol=1e-5)


def test_ratio_one_gives_minus_mean_advantage():
    lp = torch.full((2, 3), -1.0, requires_grad=True)
    adv = torch.tensor([1.0, -3.0])
    out = grpo_loss(lp, lp.detach(), adv, torch.ones(2, 3), 6.0, LossParams())
    assert math.isclose(float(out.loss), 1.0, rel_tol=1e-6)  # -(3*1 + 3*-3)/6
    assert out.clipped_tokens == 0
