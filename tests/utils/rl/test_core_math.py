"""Unit tests for the RL core's tensor math (utils/rl/: tokens, kl, rewards, advantages, losses), the critic-free
estimators (GRPO, RLOO, REINFORCE++) and the loss variants (clip-higher, aggregation, the KL loss) included.

Expected numbers are worked out by hand in the comments beside them; random-input tests compare the vectorised
code with a plain reference loop written independently here.
"""

import math

import numpy as np
import pytest
import torch

from utils.rl.advantages import (gae_advantages_and_returns, grpo_advantages, reinforce_pp_advantages,
                                 returns_to_go, rloo_advantages, sequence_advantages)
from utils.rl.kl import AdaptiveKLController, FixedKLController, kl_penalty, make_kl_controller
from utils.rl.losses import aggregate_loss, kl_loss, policy_loss, positive_nll, value_loss
from utils.rl.rewards import RunningMoments, compute_rewards, overlong_fraction
from utils.rl.tokens import (entropy_from_logits, last_token_index, logprobs_from_logits, masked_mean, masked_sum,
                             masked_var, masked_whiten)

LN2 = math.log(2.0)
LN3 = math.log(3.0)
INF = float("inf")


def close(actual, expected, atol=1e-6):
    """Compare in float64 (a Python float must not pass through float32 on the way)."""
    if isinstance(actual, torch.Tensor):
        actual = actual.double()
    else:
        actual = torch.tensor(actual, dtype=torch.float64)
    expected = torch.as_tensor(expected, dtype=torch.float64)
    torch.testing.assert_close(actual, expected, atol=atol, rtol=0)


# ---------------------------------------------------------------------------------------------------------
# Log-probabilities and entropy
# ---------------------------------------------------------------------------------------------------------


def naive_logprobs(logits, labels, temperature):
    """log(exp(z_label) / sum_v exp(z_v)) element by element, in float64."""
    out = torch.empty(labels.shape, dtype=torch.float64)
    for b in range(labels.shape[0]):
        for t in range(labels.shape[1]):
            z = logits[b, t].double() / temperature
            out[b, t] = torch.log(torch.exp(z[labels[b, t]]) / torch.exp(z).sum())
    return out


def test_logprobs_hand_values():
    # logits [0, ln 3]: softmax = [1/4, 3/4]. At T = 2 the logits become [0, ln sqrt(3)]:
    # softmax = [1, sqrt 3] / (1 + sqrt 3).
    logits = torch.tensor([[[0.0, LN3], [0.0, LN3]]])
    labels = torch.tensor([[1, 0]])
    close(logprobs_from_logits(logits, labels), [[math.log(0.75), math.log(0.25)]])
    s3 = math.sqrt(3.0)
    close(
        logprobs_from_logits(logits, labels, temperature=2.0),
        [[math.log(s3 / (1 + s3)), math.log(1 / (1 + s3))]],
    )


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.3])
def test_logprobs_match_naive_loop_and_gradients(temperature):
    gen = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(3, 5, 11, generator=gen, dtype=torch.float64)).requires_grad_()
    labels = torch.randint(0, 11, (3, 5), generator=gen)
    fast = logprobs_from_logits(logits, labels, temperature)
    slow = naive_logprobs(logits, labels, temperature)
    torch.testing.assert_close(fast, slow.detach(), atol=1e-12, rtol=0)
    (grad_fast,) = torch.autograd.grad(fast.sum(), logits)
    (grad_slow,) = torch.autograd.grad(slow.sum(), logits)
    torch.testing.assert_close(grad_fast, grad_slow, atol=1e-12, rtol=0)


def test_logprobs_temperature_changes_result():
    # Dividing the logits by T is not a no-op: at T = 2 the label's logprob differs from T = 1.
    logits = torch.tensor([[[0.0, 2.0, -1.0]]])
    labels = torch.tensor([[1]])
    assert not torch.allclose(logprobs_from_logits(logits, labels, 2.0), logprobs_from_logits(logits, labels))
    with pytest.raises(ValueError, match="temperature"):
        logprobs_from_logits(logits, labels, 0.0)


def test_logprobs_bf16_upcast_to_float32():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 4, 50, generator=gen).to(torch.bfloat16)
    labels = torch.randint(0, 50, (2, 4), generator=gen)
    out = logprobs_from_logits(logits, labels, 0.9)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), naive_logprobs(logits.float(), labels, 0.9), atol=1e-5, rtol=0)


def test_entropy_hand_values():
    # Uniform over 4 tokens: H = ln 4.  p = [1/4, 3/4]: H = -(1/4 ln 1/4 + 3/4 ln 3/4) = ln 4 - (3/4) ln 3.
    # One-hot (the other logit is -inf): H = 0, and no NaN in the value or the gradient.
    logits = torch.tensor(
        [[[0.0, 0.0, 0.0, 0.0], [0.0, LN3, -INF, -INF], [5.0, -INF, -INF, -INF]]],
        requires_grad=True,
    )
    entropy = entropy_from_logits(logits)
    close(entropy, [[math.log(4.0), math.log(4.0) - 0.75 * LN3, 0.0]])
    (grad,) = torch.autograd.grad(entropy.sum(), logits)
    assert torch.isfinite(grad).all()


def test_entropy_temperature_matches_naive():
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 3, 7, generator=gen, dtype=torch.float64)
    for temperature in (0.5, 2.0):
        p = torch.softmax(logits / temperature, dim=-1)
        expected = -(p * p.log()).sum(-1)
        torch.testing.assert_close(entropy_from_logits(logits, temperature), expected, atol=1e-12, rtol=0)
    # Higher temperature flattens the distribution, so the entropy rises.
    assert (entropy_from_logits(logits, 2.0) > entropy_from_logits(logits, 0.5)).all()


# ---------------------------------------------------------------------------------------------------------
# Masked statistics
# ---------------------------------------------------------------------------------------------------------

X = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
M = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


def test_masked_sum_and_mean_hand_values():
    # Masked elements 1, 2, 4: sum 7, mean 7/3. Per row: sums [1+2, 4] = [3, 4], means [1.5, 4].
    close(masked_sum(X, M), 7.0)
    close(masked_mean(X, M), 7.0 / 3.0)
    close(masked_sum(X, M, dim=-1), [3.0, 4.0])
    close(masked_mean(X, M, dim=-1), [1.5, 4.0])
    # Columns: [1+4, 2, 0] and means [2.5, 2, 0 (empty column -> 0)].
    close(masked_mean(X, M, dim=0), [2.5, 2.0, 0.0])


def test_masked_mean_empty_mask_is_zero_with_finite_gradient():
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    mask = torch.tensor([[0.0, 0.0], [1.0, 0.0]])
    out = masked_mean(x, mask, dim=-1)
    close(out, [0.0, 3.0])
    (grad,) = torch.autograd.grad(out.sum(), x)
    close(grad, [[0.0, 0.0], [1.0, 0.0]])
    close(masked_mean(x, torch.zeros_like(mask)), 0.0)


def test_masked_var_hand_values():
    # Masked elements 1, 2, 4: mean 7/3, deviations -4/3, -1/3, 5/3, squares 16/9 + 1/9 + 25/9 = 42/9 = 14/3.
    # Unbiased: (14/3) / 2 = 7/3.  Biased: (14/3) / 3 = 14/9.
    close(masked_var(X, M), 7.0 / 3.0)
    close(masked_var(X, M, unbiased=False), 14.0 / 9.0)
    # n = 1 and n = 0 give 0, not NaN.
    close(masked_var(X, torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])), 0.0)
    close(masked_var(X, torch.zeros_like(M)), 0.0)


def test_masked_whiten_hand_values():
    # Masked 1, 2, 4: mean 7/3, unbiased var 7/3, so y = (x - 7/3) / sqrt(7/3); masked-out entries are 0.
    s = math.sqrt(7.0 / 3.0)
    expected = [[(-4 / 3) / s, (-1 / 3) / s, 0.0], [(5 / 3) / s, 0.0, 0.0]]
    close(masked_whiten(X, M), expected, atol=1e-5)
    # shift_mean=False adds the mean back on the masked entries only.
    m = 7.0 / 3.0
    close(masked_whiten(X, M, shift_mean=False), [[expected[0][0] + m, expected[0][1] + m, 0.0],
                                                 [expected[1][0] + m, 0.0, 0.0]], atol=1e-5)


def test_masked_whiten_random_mean_zero_var_one():
    gen = torch.Generator().manual_seed(3)
    x = 5 + 3 * torch.randn(4, 9, generator=gen, dtype=torch.float64)
    lengths = torch.tensor([9, 1, 4, 6])
    mask = (torch.arange(9)[None, :] < lengths[:, None]).double()
    white = masked_whiten(x, mask)
    close(masked_mean(white, mask), 0.0, atol=1e-10)
    close(masked_var(white, mask), 1.0, atol=1e-7)
    assert (white[mask == 0] == 0).all()
    kept = masked_whiten(x, mask, shift_mean=False)
    close(masked_mean(kept, mask), masked_mean(x, mask), atol=1e-10)
    close(masked_var(kept, mask), 1.0, atol=1e-7)
    assert (kept[mask == 0] == 0).all()
    assert torch.isfinite(masked_whiten(x, torch.zeros_like(mask))).all()


# ---------------------------------------------------------------------------------------------------------
# KL estimators and rewards
# ---------------------------------------------------------------------------------------------------------


def test_kl_estimators_hand_values():
    # Token 0: pi = 1/2, pi_ref = 1/4, r = ln(pi_ref / pi) = -ln 2:
    #   k1 = ln 2 = 0.6931, k2 = (ln 2)^2 / 2 = 0.2402, k3 = e^{-ln 2} - 1 + ln 2 = 0.5 - 1 + 0.6931 = 0.1931.
    # Token 1: pi = 1/4, pi_ref = 1/2, r = +ln 2:
    #   k1 = -ln 2 (negative: k1 is unbiased, not positive per token), k2 = 0.2402,
    #   k3 = 2 - 1 - ln 2 = 0.3069.
    # Token 2: pi = pi_ref: every estimator is 0.
    logprobs = torch.log(torch.tensor([0.5, 0.25, 0.3]))
    ref_logprobs = torch.log(torch.tensor([0.25, 0.5, 0.3]))
    close(kl_penalty(logprobs, ref_logprobs, "k1"), [LN2, -LN2, 0.0])
    close(kl_penalty(logprobs, ref_logprobs, "k2"), [LN2**2 / 2, LN2**2 / 2, 0.0])
    close(kl_penalty(logprobs, ref_logprobs, "k3"), [0.5 - 1 + LN2, 2 - 1 - LN2, 0.0])


def test_kl_k3_nonnegative_and_unknown_estimator():
    gen = torch.Generator().manual_seed(4)
    logprobs, ref_logprobs = 4 * torch.randn(2, 1000, generator=gen)
    assert (kl_penalty(logprobs, ref_logprobs, "k3") >= 0).all()
    assert (kl_penalty(logprobs, ref_logprobs, "k2") >= 0).all()
    k1 = kl_penalty(logprobs, ref_logprobs, "k1")
    assert ((k1 > 0) == (logprobs > ref_logprobs)).all()
    with pytest.raises(ValueError, match="'k4'"):
        kl_penalty(logprobs, ref_logprobs, "k4")


def test_kl_estimators_agree_in_expectation():
    # Sampling from pi and averaging: k1 and k3 are unbiased for KL(pi || pi_ref).
    # pi = [0.7, 0.3], pi_ref = [0.5, 0.5]: KL = 0.7 ln 1.4 + 0.3 ln 0.6 = 0.2355 - 0.1532 = 0.0823.
    pi, ref = torch.tensor([0.7, 0.3]), torch.tensor([0.5, 0.5])
    exact = (pi * (pi / ref).log()).sum()
    gen = torch.Generator().manual_seed(5)
    tokens = torch.multinomial(pi, 200_000, replacement=True, generator=gen)
    for estimator in ("k1", "k3"):
        estimate = kl_penalty(pi.log()[tokens], ref.log()[tokens], estimator).mean()
        close(estimate, exact, atol=3e-3)


def test_last_token_index():
    mask = torch.tensor(
        [[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]]
    )
    assert last_token_index(mask).tolist() == [2, 0, 3, -1]


def test_rewards_land_on_last_real_token():
    # Row 0: 3 real tokens; row 1: only the EOS; row 2: all 4 real. k1 = logprobs - ref = the numbers below
    # (9 on padding must be ignored). kl_coef = 0.5, scores [1, -2, 3]:
    #   row 0: -0.5 * [0.1, 0.2, 0.3] + [0, 0, 1]  = [-0.05, -0.10, 0.85, 0]
    #   row 1: -0.5 * [0.5] - 2                   = [-2.25, 0, 0, 0]
    #   row 2: -0.5 * 0.1 each, + 3 at the end     = [-0.05, -0.05, -0.05, 2.95]
    diff = torch.tensor([[0.1, 0.2, 0.3, 9.0], [0.5, 9.0, 9.0, 9.0], [0.1, 0.1, 0.1, 0.1]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    scores = torch.tensor([1.0, -2.0, 3.0])
    rewards, kl = compute_rewards(diff, torch.zeros_like(diff), scores, mask, kl_coef=0.5)
    close(rewards, [[-0.05, -0.10, 0.85, 0.0], [-2.25, 0.0, 0.0, 0.0], [-0.05, -0.05, -0.05, 2.95]])
    close(kl, [[0.1, 0.2, 0.3, 0.0], [0.5, 0.0, 0.0, 0.0], [0.1, 0.1, 0.1, 0.1]])
    # reward_clip = 2.5: the score 3 becomes 2.5 (row 2 ends at -0.05 + 2.5 = 2.45); -2 and 1 are unchanged.
    clipped, _ = compute_rewards(diff, torch.zeros_like(diff), scores, mask, kl_coef=0.5, reward_clip=2.5)
    close(clipped, [[-0.05, -0.10, 0.85, 0.0], [-2.25, 0.0, 0.0, 0.0], [-0.05, -0.05, -0.05, 2.45]])


def test_rewards_with_k3_and_empty_row():
    # k3 at r = -ln 2 is 0.1931 (see test_kl_estimators_hand_values); kl_coef 1, score 0.5 on the only token.
    # An all-zero row (not produced in practice) gets no score and no KL: zeros, no NaN.
    logprobs = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5]]))
    ref_logprobs = torch.log(torch.tensor([[0.25, 0.25], [0.25, 0.25]]))
    mask = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    rewards, kl = compute_rewards(logprobs, ref_logprobs, torch.tensor([0.5, 7.0]), mask, 1.0, estimator="k3")
    k3 = 0.5 - 1 + LN2
    close(kl, [[k3, 0.0], [0.0, 0.0]])
    close(rewards, [[-k3 + 0.5, 0.0], [0.0, 0.0]])


# ---------------------------------------------------------------------------------------------------------
# GAE
# ---------------------------------------------------------------------------------------------------------


def reference_gae(values, rewards, action_mask, gamma, lam):
    """Row by row, over the real tokens only, in plain Python floats."""
    advantages = torch.zeros_like(values, dtype=torch.float64)
    returns = torch.zeros_like(values, dtype=torch.float64)
    for b in range(values.shape[0]):
        n = int(action_mask[b].sum())
        v = values[b, :n].tolist()
        r = rewards[b, :n].tolist()
        running = 0.0
        for t in reversed(range(n)):
            next_v = v[t + 1] if t + 1 < n else 0.0
            running = r[t] + gamma * next_v - v[t] + gamma * lam * running
            advantages[b, t] = running
            returns[b, t] = running + v[t]
    return advantages, returns


def test_gae_hand_example_gamma1_lam05():
    # V = [1, 2, 3], r = [0, 0, 1], gamma = 1, lam = 0.5:
    #   t=2: delta = 1 + 1*0 - 3 = -2           A2 = -2
    #   t=1: delta = 0 + 3 - 2 = 1              A1 = 1 + 0.5 * (-2) = 0
    #   t=0: delta = 0 + 2 - 1 = 1              A0 = 1 + 0.5 * 0 = 1
    #   returns = A + V = [2, 2, 1]
    values = torch.tensor([[1.0, 2.0, 3.0]])
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    advantages, returns = gae_advantages_and_returns(values, rewards, torch.ones(1, 3), gamma=1.0, lam=0.5)
    close(advantages, [[1.0, 0.0, -2.0]])
    close(returns, [[2.0, 2.0, 1.0]])


def test_gae_hand_example_discounted_lam1():
    # V = [1, 2], r = [1, 4], gamma = 0.5, lam = 1 (returns are then discounted Monte-Carlo returns):
    #   t=1: delta = 4 - 2 = 2                   A1 = 2,   R1 = 4
    #   t=0: delta = 1 + 0.5*2 - 1 = 1           A0 = 1 + 0.5 * 1 * 2 = 2,   R0 = 3 = 1 + 0.5 * 4
    advantages, returns = gae_advantages_and_returns(
        torch.tensor([[1.0, 2.0]]), torch.tensor([[1.0, 4.0]]), torch.ones(1, 2), gamma=0.5, lam=1.0
    )
    close(advantages, [[2.0, 2.0]])
    close(returns, [[3.0, 4.0]])


def test_gae_mask_cut_equals_truncated_sequence():
    # The hand example above, followed by two padded positions holding junk values and rewards.
    values = torch.tensor([[1.0, 2.0, 3.0, 7.0, 8.0]])
    rewards = torch.tensor([[0.0, 0.0, 1.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0, 0.0]])
    advantages, returns = gae_advantages_and_returns(values, rewards, mask, gamma=1.0, lam=0.5)
    close(advantages, [[1.0, 0.0, -2.0, 0.0, 0.0]])
    close(returns, [[2.0, 2.0, 1.0, 0.0, 0.0]])

    gen = torch.Generator().manual_seed(6)
    values, rewards = torch.randn(2, 4, 10, generator=gen, dtype=torch.float64)
    lengths = [10, 1, 6, 3]
    mask = (torch.arange(10)[None, :] < torch.tensor(lengths)[:, None]).double()
    advantages, returns = gae_advantages_and_returns(values, rewards, mask, gamma=0.9, lam=0.8)
    for b, n in enumerate(lengths):
        short_adv, short_ret = gae_advantages_and_returns(
            values[b : b + 1, :n], rewards[b : b + 1, :n], torch.ones(1, n, dtype=torch.float64), 0.9, 0.8
        )
        torch.testing.assert_close(advantages[b, :n], short_adv[0])
        torch.testing.assert_close(returns[b, :n], short_ret[0])
        assert (advantages[b, n:] == 0).all() and (returns[b, n:] == 0).all()


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.99, 0.9), (0.5, 0.0), (1.0, 1.0)])
def test_gae_matches_reference_loop(gamma, lam):
    gen = torch.Generator().manual_seed(7)
    values, rewards = torch.randn(2, 6, 12, generator=gen, dtype=torch.float64)
    lengths = torch.tensor([12, 1, 5, 8, 2, 11])
    mask = (torch.arange(12)[None, :] < lengths[:, None]).double()
    advantages, returns = gae_advantages_and_returns(values, rewards, mask, gamma, lam)
    ref_advantages, ref_returns = reference_gae(values, rewards, mask, gamma, lam)
    torch.testing.assert_close(advantages, ref_advantages)
    torch.testing.assert_close(returns, ref_returns)


def test_gae_empty_row_is_zero():
    values = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    advantages, returns = gae_advantages_and_returns(values, torch.ones(2, 2), mask)
    assert (advantages[1] == 0).all() and (returns[1] == 0).all()
    assert torch.isfinite(advantages).all() and advantages[0].abs().sum() > 0


# ---------------------------------------------------------------------------------------------------------
# PPO losses
# ---------------------------------------------------------------------------------------------------------


def test_policy_loss_ratio_one():
    # ratio = 1 everywhere: loss = -masked_mean(A) = -(1 - 2 + 4) / 3 = -1 (the masked 3 and 0s are ignored),
    # clipfrac 0, approx_kl 0, ratio_mean 1.
    logprobs = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.0, -1.0]])
    advantages = torch.tensor([[1.0, -2.0, 3.0], [4.0, 100.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    loss, stats = policy_loss(logprobs, logprobs.clone(), advantages, mask)
    close(loss, -1.0)
    close(stats["clipfrac"], 0.0)
    close(stats["approx_kl"], 0.0)
    close(stats["ratio_mean"], 1.0)


def test_policy_loss_clip_branches():
    # eps = 0.2, so clip(ratio) lies in [0.8, 1.2].
    #   a: ratio 1.5, A = +1: -1.5 vs -1.2 -> max = -1.2   (clipped: no gain beyond 1 + eps)
    #   b: ratio 1.5, A = -1:  1.5 vs  1.2 -> max =  1.5   (unclipped: a bad move is always penalised)
    #   c: ratio 0.5, A = +1: -0.5 vs -0.8 -> max = -0.5   (unclipped)
    #   d: ratio 0.5, A = -1:  0.5 vs  0.8 -> max =  0.8   (clipped)
    #   e: masked out, ignored.
    # loss = (-1.2 + 1.5 - 0.5 + 0.8) / 4 = 0.15; clipfrac = 2/4 = 0.5; ratio_mean = (1.5+1.5+0.5+0.5)/4 = 1;
    # approx_kl = (2 * 0.5 ln(1.5)^2 + 2 * 0.5 ln(0.5)^2) / 4 = (ln(1.5)^2 + ln(2)^2) / 4.
    # Gradient w.r.t. logprobs: 0 on the clipped tokens a, d; d(-A ratio)/dlogp / 4 = -A ratio / 4 on b, c:
    #   b: -(-1)(1.5)/4 = 0.375, c: -(1)(0.5)/4 = -0.125.
    old = torch.tensor([[-1.0, -1.0, -1.0, -1.0, -1.0]])
    ratio = torch.tensor([[1.5, 1.5, 0.5, 0.5, 5.0]])
    logprobs = (old + ratio.log()).requires_grad_()
    advantages = torch.tensor([[1.0, -1.0, 1.0, -1.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    loss, stats = policy_loss(logprobs, old, advantages, mask, clip_range=0.2)
    close(loss, 0.15)
    close(stats["clipfrac"], 0.5)
    close(stats["ratio_mean"], 1.0)
    close(stats["approx_kl"], (math.log(1.5) ** 2 + LN2**2) / 4)
    assert all(not value.requires_grad for value in stats.values())
    (grad,) = torch.autograd.grad(loss, logprobs)
    close(grad, [[0.0, 0.375, -0.125, 0.0, 0.0]])


def test_policy_loss_empty_mask_no_nan():
    logprobs = torch.zeros(1, 3, requires_grad=True)
    loss, stats = policy_loss(logprobs, torch.zeros(1, 3), torch.ones(1, 3), torch.zeros(1, 3))
    (grad,) = torch.autograd.grad(loss, logprobs)
    assert loss.item() == 0.0 and torch.isfinite(grad).all()
    assert all(torch.isfinite(value) for value in stats.values())


def test_value_loss_clip_branches():
    # c = 0.2.
    #   1: V = 1.0, V_old = 0.5, R = 2: V_clip = 0.7; (1-2)^2 = 1 vs (0.7-2)^2 = 1.69 -> 1.69 (clipped)
    #   2: V = 1.0, V_old = 0.5, R = 0: V_clip = 0.7; (1-0)^2 = 1 vs 0.49 -> 1 (unclipped)
    #   3: V = 0.6, V_old = 0.5, R = 1: inside the range, both 0.16
    #   4: masked out, ignored.
    # loss = 0.5 * (1.69 + 1 + 0.16) / 3 = 0.475; vf_clipfrac = 1/3.
    # Without clipping: 0.5 * (1 + 1 + 0.16) / 3 = 0.36.
    values = torch.tensor([[1.0, 1.0, 0.6, 50.0]], requires_grad=True)
    old_values = torch.tensor([[0.5, 0.5, 0.5, 0.0]])
    returns = torch.tensor([[2.0, 0.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    loss, stats = value_loss(values, old_values, returns, mask, clip_range_value=0.2)
    close(loss, 0.475)
    close(stats["vf_clipfrac"], 1.0 / 3.0)
    # Gradient: 0 on the clipped token 1; (V - R)/3 on tokens 2 and 3: 1/3 and -0.4/3.
    (grad,) = torch.autograd.grad(loss, values)
    close(grad, [[0.0, 1.0 / 3.0, -0.4 / 3.0, 0.0]])
    unclipped_loss, unclipped_stats = value_loss(values, old_values, returns, mask, clip_range_value=None)
    close(unclipped_loss, 0.36)
    close(unclipped_stats["vf_clipfrac"], 0.0)


# ---------------------------------------------------------------------------------------------------------
# KL controllers
# ---------------------------------------------------------------------------------------------------------


def test_adaptive_kl_controller_exact_multipliers():
    # target 6, horizon 10000.
    #   KL 9:   9/6 - 1 = 0.5 -> clipped to 0.2;  n_steps 64: mult = 1 + 0.2 * 64 / 10000 = 1.00128
    #   KL 3:   3/6 - 1 = -0.5 -> clipped -0.2;   n_steps 64: mult = 1 - 0.00128 = 0.99872
    #   KL 6.6: 6.6/6 - 1 = 0.1 (inside);         n_steps 100: mult = 1 + 0.1 * 100 / 10000 = 1.001
    controller = AdaptiveKLController(init_kl_coef=0.1, target=6.0, horizon=10000)
    controller.update(9.0, 64)
    close(controller.value, 0.1 * 1.00128, atol=1e-12)
    controller.update(3.0, 64)
    close(controller.value, 0.1 * 1.00128 * 0.99872, atol=1e-12)
    before = controller.value
    controller.update(6.6, 100)
    close(controller.value, before * 1.001, atol=1e-12)
    assert controller.value > before
    controller.update(1.0, 10)
    assert controller.value < before * 1.001


def test_fixed_kl_controller_and_state_dicts_round_trip():
    fixed = FixedKLController(0.05)
    fixed.update(100.0, 64)
    assert fixed.value == 0.05
    restored_fixed = FixedKLController(0.3)
    restored_fixed.load_state_dict(fixed.state_dict())
    assert restored_fixed.value == 0.05

    adaptive = AdaptiveKLController(0.1, target=6.0, horizon=1000)
    adaptive.update(10.0, 32)
    state = adaptive.state_dict()
    assert all(type(value) is float for value in state.values())
    resumed = AdaptiveKLController(0.1, target=6.0, horizon=1000)
    resumed.load_state_dict(state)
    assert resumed.value == adaptive.value != 0.1
    adaptive.update(4.0, 32)
    resumed.update(4.0, 32)
    assert resumed.value == adaptive.value


# ---------------------------------------------------------------------------------------------------------
# Running moments
# ---------------------------------------------------------------------------------------------------------


def test_running_moments_match_numpy_over_batches():
    gen = torch.Generator().manual_seed(8)
    moments = RunningMoments()
    seen = []
    for size, shift in [(1, 3.0), (5, -1.0), (17, 10.0), (3, 0.0), (64, 2.0)]:
        batch = shift + 2 * torch.randn(size, generator=gen)
        batch_mean, batch_std = moments.update(batch)
        np.testing.assert_allclose(batch_mean, batch.double().numpy().mean(), rtol=0, atol=1e-9)
        np.testing.assert_allclose(batch_std, batch.double().numpy().std(), rtol=0, atol=1e-9)
        seen.append(batch.double().numpy())
        everything = np.concatenate(seen)
        np.testing.assert_allclose(moments.mean, everything.mean(), rtol=0, atol=1e-9)
        np.testing.assert_allclose(moments.std, everything.std(), rtol=0, atol=1e-9)
    assert moments.count == len(everything)


def test_running_moments_normalise_hand_values_and_round_trip():
    moments = RunningMoments()
    # Before any update: mean 0, std 1, normalise is the identity.
    assert moments.mean == 0.0 and moments.std == 1.0
    close(moments.normalise(torch.tensor([2.0, -3.0])), [2.0, -3.0])
    # [1, 2, 3, 4]: mean 2.5, population variance (2.25 + 0.25 + 0.25 + 2.25) / 4 = 1.25.
    moments.update(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    close(moments.mean, 2.5, atol=1e-12)
    close(moments.std, math.sqrt(1.25), atol=1e-12)
    s = math.sqrt(1.25)
    close(moments.normalise(torch.tensor([2.5, 3.5])), [0.0, 1.0 / s])
    close(moments.normalise(torch.tensor([2.5, 3.5]), shift_mean=False), [2.5 / s, 3.5 / s])

    state = moments.state_dict()
    assert all(type(value) is float for value in state.values())
    resumed = RunningMoments()
    resumed.load_state_dict(state)
    assert (resumed.mean, resumed.std, resumed.count) == (moments.mean, moments.std, moments.count)
    extra = torch.tensor([7.0, -1.0, 0.5])
    moments.update(extra)
    resumed.update(extra)
    assert (resumed.mean, resumed.std) == (moments.mean, moments.std)
    with pytest.raises(ValueError):
        moments.update(torch.tensor([]))


# ---------------------------------------------------------------------------------------------------------
# Purity: no function modifies its inputs
# ---------------------------------------------------------------------------------------------------------


def test_functions_do_not_modify_inputs():
    gen = torch.Generator().manual_seed(9)
    logits = torch.randn(2, 3, 5, generator=gen)
    labels = torch.randint(0, 5, (2, 3), generator=gen)
    a, b, c, d = torch.randn(4, 2, 3, generator=gen)
    scores = torch.randn(2, generator=gen)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    inputs = [logits, labels, a, b, c, d, scores, mask]
    copies = [x.clone() for x in inputs]

    logprobs_from_logits(logits, labels, 0.7)
    entropy_from_logits(logits, 0.7)
    masked_whiten(a, mask)
    masked_whiten(a, mask, shift_mean=False)
    masked_var(a, mask)
    kl_penalty(a, b, "k3")
    compute_rewards(a, b, scores, mask, 0.1, "k2", reward_clip=0.5)
    gae_advantages_and_returns(a, b, mask, 0.9, 0.9)
    policy_loss(a, b, c, mask)
    policy_loss(a, b, c, mask, 0.2, 0.1, 0.3, "seq_mean_token_mean")
    value_loss(a, b, c, mask)
    kl_loss(a, b, mask, "k3", "seq_mean_token_sum")
    grpo_advantages(a)
    rloo_advantages(a)
    reinforce_pp_advantages(a, mask, 0.9)
    sequence_advantages(scores, mask)
    RunningMoments().update(scores)

    for x, copy in zip(inputs, copies):
        assert torch.equal(x, copy)


def test_make_kl_controller_is_adaptive_when_a_target_is_given():
    fixed = make_kl_controller(0.2)
    assert type(fixed) is FixedKLController and fixed.value == 0.2
    adaptive = make_kl_controller(0.2, adaptive_kl_target=3, adaptive_kl_horizon=500)
    assert type(adaptive) is AdaptiveKLController
    assert (adaptive.value, adaptive.target, adaptive.horizon) == (0.2, 3.0, 500.0)
    adaptive.update(6.0, 100)  # KL above target: the coefficient grows
    assert adaptive.value > 0.2


# ---------------------------------------------------------------------------------------------------------
# Critic-free advantage estimators
# ---------------------------------------------------------------------------------------------------------


def test_grpo_group_of_four_hand_values():
    # Rewards [1, 0, 0, 1]: mean 0.5, deviations +-0.5, unbiased std sqrt(4 * 0.25 / 3) = sqrt(1/3).
    # GRPO: +-0.5 / (sqrt(1/3) + eps) = +-sqrt(3)/2 = +-0.8660; Dr. GRPO (no std): +-0.5.
    # A second group [1, 0.5, 0, 0.5]: mean 0.5, std sqrt((0.25 + 0 + 0.25 + 0) / 3) = sqrt(1/6):
    # [0.5, 0, -0.5, 0] * sqrt(6) = [1.2247, 0, -1.2247, 0]. Groups are normalised separately.
    scores = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 0.5, 0.0, 0.5]])
    h = math.sqrt(3) / 2
    s6 = math.sqrt(6) / 2
    close(grpo_advantages(scores, eps=0.0), [[h, -h, -h, h], [s6, 0.0, -s6, 0.0]])
    close(grpo_advantages(scores), [[h, -h, -h, h], [s6, 0.0, -s6, 0.0]], atol=1e-5)  # eps 1e-6: tiny shrink
    close(grpo_advantages(scores, std_normalization=False), [[0.5, -0.5, -0.5, 0.5], [0.5, 0.0, -0.5, 0.0]])


def test_group_of_equal_rewards_has_zero_advantages_and_no_nan():
    scores = torch.tensor([[0.7, 0.7, 0.7, 0.7], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    for advantages in (grpo_advantages(scores), grpo_advantages(scores, std_normalization=False),
                       rloo_advantages(scores)):
        assert torch.isfinite(advantages).all()
        close(advantages, torch.zeros(3, 4))
    close(grpo_advantages(torch.tensor([[3.0], [5.0]])), [[0.0], [0.0]])  # a group of one: 0, not NaN


def test_rloo_leave_one_out_hand_values():
    # [1, 0, 0, 1]: answer 0's baseline is the mean of the others (0 + 0 + 1) / 3 = 1/3 -> 1 - 1/3 = 2/3;
    # answer 1's: (1 + 0 + 1) / 3 = 2/3 -> 0 - 2/3 = -2/3. Equal to G / (G - 1) (r - mean) = 4/3 * (+-0.5).
    # [3, 1, 2]: baselines 1.5, 2.5, 2 -> [1.5, -1.5, 0].
    close(rloo_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]])), [[2 / 3, -2 / 3, -2 / 3, 2 / 3]])
    close(rloo_advantages(torch.tensor([[3.0, 1.0, 2.0]])), [[1.5, -1.5, 0.0]])
    with pytest.raises(ValueError):
        rloo_advantages(torch.tensor([[1.0], [2.0]]))


def test_sequence_advantage_broadcast_over_the_action_mask():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    close(sequence_advantages(torch.tensor([0.5, -2.0, 9.0]), mask),
          [[0.5, 0.5, 0.0], [-2.0, 0.0, 0.0], [0.0, 0.0, 0.0]])


def test_returns_to_go_hand_values():
    # Row [0, 0, 1], gamma 0.5: G = [0.25, 0.5, 1]. Row [0.5, 0, (pad 7)]: G = [0.5, 0, 0] (the pad is ignored).
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.5, 0.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    close(returns_to_go(rewards, mask, 0.5), [[0.25, 0.5, 1.0], [0.5, 0.0, 0.0]])
    close(returns_to_go(rewards, mask), [[1.0, 1.0, 1.0], [0.5, 0.0, 0.0]])


def test_reinforce_pp_whitens_returns_over_the_whole_batch():
    # gamma 1: returns [1, 1, 1] and [0.5, 0] on the 5 real tokens; mean 3.5 / 5 = 0.7; deviations
    # [0.3, 0.3, 0.3], [-0.2, -0.7]; unbiased variance (3 * 0.09 + 0.04 + 0.49) / 4 = 0.2.
    # A = deviation / sqrt(0.2): [0.6708, 0.6708, 0.6708], [-0.4472, -1.5652, 0 (pad)].
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.5, 0.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    r = math.sqrt(0.2)
    expected = [[0.3 / r, 0.3 / r, 0.3 / r], [-0.2 / r, -0.7 / r, 0.0]]
    advantages = reinforce_pp_advantages(rewards, mask)
    close(advantages, expected, atol=1e-6)
    # One batch alone is exactly masked_whiten of the returns.
    assert torch.equal(advantages, masked_whiten(returns_to_go(rewards, mask), mask))
    # A global batch: another rank holds 5 real tokens whose returns all equal 0.7. batch_sum adds its sums:
    # (sum, count) + (3.5, 5), and 0 to the sum of squared deviations (its returns sit on the mean). The mean
    # stays 0.7; the variance becomes 0.8 / 9 instead of 0.8 / 4, so every advantage grows by sqrt(9 / 4).
    def with_other_rank(tensor):
        return tensor + torch.tensor([3.5, 5.0]) if tensor.dim() else tensor

    close(reinforce_pp_advantages(rewards, mask, batch_sum=with_other_rank),
          [[1.5 * x for x in row] for row in expected], atol=1e-5)
    close(reinforce_pp_advantages(rewards, torch.zeros(2, 3)), torch.zeros(2, 3))


# ---------------------------------------------------------------------------------------------------------
# Loss variants: clip-higher, aggregation, the KL loss, the overlong penalty
# ---------------------------------------------------------------------------------------------------------


def test_policy_loss_clip_higher():
    # eps_low 0.2, eps_high 0.28: clip(ratio) lies in [0.8, 1.28].
    #   a: ratio 1.25, A = +1: -1.25 vs -1.25 -> -1.25  (inside: with the symmetric 0.2 it was clipped at -1.2)
    #   b: ratio 1.4,  A = +1: -1.4  vs -1.28 -> -1.28  (clipped at 1 + eps_high)
    #   c: ratio 0.7,  A = -1:  0.7  vs  0.8  ->  0.8   (clipped at 1 - eps_low)
    #   d: ratio 1.4,  A = -1:  1.4  vs  1.28 ->  1.4   (unclipped)
    # loss = (-1.25 - 1.28 + 0.8 + 1.4) / 4 = -0.0825, clipfrac 2/4. Symmetric 0.2:
    # (-1.2 - 1.2 + 0.8 + 1.4) / 4 = -0.05, clipfrac 3/4.
    # Gradient (clip-higher): -A ratio / 4 on a and d: a -1.25/4 = -0.3125, d 1.4/4 = 0.35; 0 on b, c.
    old = torch.zeros(1, 4)
    logprobs = torch.tensor([[1.25, 1.4, 0.7, 1.4]]).log().requires_grad_()
    advantages = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    mask = torch.ones(1, 4)
    loss, stats = policy_loss(logprobs, old, advantages, mask, 0.2, clip_range_low=0.2, clip_range_high=0.28)
    close(loss, -0.0825)
    close(stats["clipfrac"], 0.5)
    (grad,) = torch.autograd.grad(loss, logprobs)
    close(grad, [[-0.3125, 0.0, 0.0, 0.35]])
    symmetric, symmetric_stats = policy_loss(logprobs, old, advantages, mask, 0.2)
    close(symmetric, -0.05)
    close(symmetric_stats["clipfrac"], 0.75)
    # Only the low side given: the high side stays at clip_range.
    low_only, _ = policy_loss(logprobs, old, advantages, mask, 0.2, clip_range_low=0.4)  # c: 0.7 vs 0.6 -> 0.7
    close(low_only, (-1.2 - 1.2 + 0.7 + 1.4) / 4)


def test_loss_aggregation_modes_hand_values():
    # Rows [1, 2, 3], [4], and one without real tokens (a dropped group), which counts for nothing:
    #   token_mean            (1 + 2 + 3 + 4) / 4 = 2.5
    #   seq_mean_token_sum    (6 + 4) / 2 = 5
    #   seq_mean_token_mean   (2 + 4) / 2 = 3
    losses = torch.tensor([[1.0, 2.0, 3.0], [4.0, 50.0, 50.0], [9.0, 9.0, 9.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    close(aggregate_loss(losses, mask, "token_mean"), 2.5)
    close(aggregate_loss(losses, mask, "seq_mean_token_sum"), 5.0)
    close(aggregate_loss(losses, mask, "seq_mean_token_mean"), 3.0)
    # Gradients: token_mean 1/4 per token; seq_mean_token_mean 1/6 per token of row 0, 1/2 for row 1's.
    (grad,) = torch.autograd.grad(aggregate_loss(losses, mask, "seq_mean_token_mean"), losses)
    close(grad, [[1 / 6, 1 / 6, 1 / 6], [0.5, 0.0, 0.0], [0.0, 0.0, 0.0]])
    for mode in ("token_mean", "seq_mean_token_sum", "seq_mean_token_mean"):
        empty = aggregate_loss(losses, torch.zeros(3, 3), mode)
        (grad,) = torch.autograd.grad(empty, losses)
        assert empty.item() == 0.0 and torch.isfinite(grad).all()
    with pytest.raises(ValueError):
        aggregate_loss(losses, mask, "sum")
    # The policy loss at ratio 1 is -aggregate(A): -5 for seq_mean_token_sum with A = the losses above.
    policy, _ = policy_loss(torch.zeros(3, 3), torch.zeros(3, 3), losses.detach(), mask,
                            loss_agg_mode="seq_mean_token_sum")
    close(policy, -5.0)


def test_kl_loss_hand_values_and_gradient():
    # logprobs = ref + ln 2 on every token: r = ref - logprobs = -ln 2.
    #   k3 = e^r - 1 - r = 0.5 - 1 + ln 2 = 0.19315;  k2 = r^2 / 2 = (ln 2)^2 / 2;  k1 = -r = ln 2.
    # d k3 / d logprobs = 1 - e^r = 0.5, so the token mean over 3 real tokens gives 0.5 / 3 per token.
    ref = torch.tensor([[-1.0, -2.0, -0.5, -3.0]])
    logprobs = (ref + LN2).requires_grad_()
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    loss = kl_loss(logprobs, ref, mask, "k3")
    close(loss, 0.5 - 1 + LN2)
    close(kl_loss(logprobs, ref, mask, "k2"), LN2**2 / 2)
    close(kl_loss(logprobs, ref, mask, "k1"), LN2)
    (grad,) = torch.autograd.grad(loss, logprobs)
    close(grad, [[0.5 / 3, 0.5 / 3, 0.5 / 3, 0.0]])
    # At the reference the k3 loss and its gradient are 0.
    at_ref = ref.clone().requires_grad_()
    (grad,) = torch.autograd.grad(kl_loss(at_ref, ref, mask), at_ref)
    close(grad, torch.zeros(1, 4))


def test_positive_nll_hand_values_and_gradient():
    # Rows 0 and 2 positive; row 1 (negative) and the masked tokens count for nothing:
    #   token_mean            (1 + 2 + 4) / 3 = 7/3
    #   seq_mean_token_mean   (1.5 + 4) / 2 = 2.75
    logprobs = torch.tensor([[-1.0, -2.0, -9.0], [-5.0, -5.0, -5.0], [-4.0, -9.0, -9.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    positive = torch.tensor([True, False, True])
    loss = positive_nll(logprobs, mask, positive)
    close(loss, 7 / 3)
    close(positive_nll(logprobs, mask, positive, "seq_mean_token_mean"), 2.75)
    (grad,) = torch.autograd.grad(loss, logprobs)  # d(-mean logprob) = -1/3 on each positive real token
    close(grad, [[-1 / 3, -1 / 3, 0.0], [0.0, 0.0, 0.0], [-1 / 3, 0.0, 0.0]])
    nothing = positive_nll(logprobs, mask, torch.zeros(3, dtype=torch.bool))
    (grad,) = torch.autograd.grad(nothing, logprobs)
    assert nothing.item() == 0.0 and not grad.any()


def test_overlong_fraction_hand_values():
    # max 12, buffer 4: 0 up to 8 tokens, then (n - 8) / 4: 9 -> 0.25, 10 -> 0.5, 12 -> 1.
    lengths = torch.tensor([3.0, 8.0, 9.0, 10.0, 12.0])
    close(overlong_fraction(lengths, 12, 4), [0.0, 0.0, 0.25, 0.5, 1.0])
    close(overlong_fraction(lengths, 12, 1), [0.0, 0.0, 0.0, 0.0, 1.0])  # only answers that fill the limit
    with pytest.raises(ValueError):
        overlong_fraction(lengths, 12, 0)


def test_gae_and_returns_to_go_step_over_a_tool_output():
    """A masked stretch inside the answer (a tool's output) is not a step: the numbers equal those of the answer
    with the stretch cut out, and the stretch itself gets 0."""
    values = torch.tensor([[1.0, 9.0, 9.0, 2.0, 3.0]])
    rewards = torch.tensor([[0.0, 5.0, 5.0, 0.0, 1.0]])
    mask = torch.tensor([[1.0, 0.0, 0.0, 1.0, 1.0]])
    # cut out: V = [1, 2, 3], r = [0, 0, 1], gamma = 1, lam = 0.5: the hand example above, A = [1, 0, -2]
    advantages, returns = gae_advantages_and_returns(values, rewards, mask, gamma=1.0, lam=0.5)
    close(advantages, [[1.0, 0.0, 0.0, 0.0, -2.0]])
    close(returns, [[2.0, 0.0, 0.0, 2.0, 1.0]])
    # gamma 0.5 over the three real tokens: G = [0.25, 0.5, 1], not discounted over the two tool tokens
    close(returns_to_go(rewards, mask, 0.5), [[0.25, 0.0, 0.0, 0.5, 1.0]])
