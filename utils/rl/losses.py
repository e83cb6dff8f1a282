"""The losses: PPO's clipped policy and value losses (the policy loss with asymmetric clipping and three ways of
averaging over tokens), the KL to the reference as a loss term, and the pairwise (Bradley-Terry) loss of reward
models."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from utils.rl.kl import kl_penalty
from utils.rl.tokens import masked_mean, masked_sum

LOSS_AGG_MODES = ("token_mean", "seq_mean_token_sum", "seq_mean_token_mean")


def aggregate_loss(losses: torch.Tensor, action_mask: torch.Tensor, mode: str = "token_mean") -> torch.Tensor:
    """A per-token loss (B, A) made one number, over the real tokens only:

        token_mean           sum_bt m_bt l_bt / sum_bt m_bt            every token weighs the same (PPO, DAPO)
        seq_mean_token_sum   mean_b  sum_t m_bt l_bt                   every token weighs the same, the batch's
                                                                       size does not matter (Dr. GRPO)
        seq_mean_token_mean  mean_b (sum_t m_bt l_bt / sum_t m_bt)     every answer weighs the same (GRPO)

    mean_b runs over the rows with at least one real token, so a row whose mask is all 0 (a dropped group)
    counts for nothing, as if it were not in the batch. No real token at all: 0 (gradient 0). Unknown mode:
    ValueError.
    """
    if mode == "token_mean":
        return masked_mean(losses, action_mask)
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss aggregation {mode!r}; expected one of {LOSS_AGG_MODES}")
    per_row = masked_sum(losses, action_mask, dim=1) if mode == "seq_mean_token_sum" else masked_mean(
        losses, action_mask, dim=1)
    has_tokens = (action_mask.sum(dim=1) > 0).to(per_row.dtype)
    return masked_mean(per_row, has_tokens)


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    action_mask: torch.Tensor,
    clip_range: float = 0.2,
    clip_range_low: float | None = None,
    clip_range_high: float | None = None,
    loss_agg_mode: str = "token_mean",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate loss, averaged over all real tokens of the batch (by default).

        ratio_t = exp(logprobs_t - old_logprobs_t)
        loss    = masked_mean( max(-A_t * ratio_t, -A_t * clip(ratio_t, 1 - eps_low, 1 + eps_high)) )

    eps_low and eps_high are clip_range unless given: a larger eps_high lets the probability of a good but
    unlikely token grow further in one update (DAPO's clip-higher, Yu et al. 2025). `loss_agg_mode` replaces
    the masked_mean by another average of `aggregate_loss`.

    Stats (detached 0-dim tensors):
      clipfrac   fraction of real tokens where the clipped term is strictly larger, i.e. the clip is active
                 and the token's gradient is 0;
      approx_kl  masked_mean(0.5 * (logprobs - old_logprobs)^2): the k2 estimator of KL(pi_old || pi) on
                 tokens sampled from pi_old (Schulman 2020; see `kl_penalty`);
      ratio_mean masked_mean(ratio).
    All-zero mask: loss and stats are 0.
    """
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    low = clip_range if clip_range_low is None else clip_range_low
    high = clip_range if clip_range_high is None else clip_range_high
    clipped = -advantages * ratio.clamp(1.0 - low, 1.0 + high)
    loss = aggregate_loss(torch.maximum(unclipped, clipped), action_mask, loss_agg_mode)
    with torch.no_grad():
        stats = {
            "clipfrac": masked_mean((clipped > unclipped).to(ratio.dtype), action_mask),
            "approx_kl": masked_mean(0.5 * log_ratio**2, action_mask),
            "ratio_mean": masked_mean(ratio, action_mask),
        }
    return loss, {name: value.detach() for name, value in stats.items()}


def kl_loss(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    action_mask: torch.Tensor,
    estimator: str = "k3",
    loss_agg_mode: str = "token_mean",
) -> torch.Tensor:
    """The KL to the reference as a term of the policy's loss (GRPO) instead of a penalty in the reward:

        loss = aggregate_loss(kl_penalty(logprobs, ref_logprobs, estimator), action_mask, loss_agg_mode)

    with the gradient flowing through `logprobs` (the current policy's, on tokens sampled from pi_old). Use k3
    (or k2): the k1 term logprobs - ref_logprobs has the gradient of log pi alone, zero in expectation.
    """
    return aggregate_loss(kl_penalty(logprobs, ref_logprobs, estimator), action_mask, loss_agg_mode)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    action_mask: torch.Tensor,
    clip_range_value: float | None = 0.2,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss, averaged over all real tokens of the batch.

        V_clip_t = clip(V_t, V_old_t - c, V_old_t + c)
        loss     = 0.5 * masked_mean( max((V_t - R_t)^2, (V_clip_t - R_t)^2) )

    clip_range_value=None drops the clipped term (loss = 0.5 * masked_mean((V - R)^2)).
    Stats (detached 0-dim tensor): vf_clipfrac = fraction of real tokens where the clipped term is strictly
    larger (the clip is active). All-zero mask: loss and stats are 0.
    """
    unclipped = (values - returns) ** 2
    if clip_range_value is None:
        clipped = unclipped
    else:
        values_clipped = old_values + (values - old_values).clamp(-clip_range_value, clip_range_value)
        clipped = (values_clipped - returns) ** 2
    loss = 0.5 * masked_mean(torch.maximum(unclipped, clipped), action_mask)
    with torch.no_grad():
        vf_clipfrac = masked_mean((clipped > unclipped).to(values.dtype), action_mask)
    return loss, {"vf_clipfrac": vf_clipfrac.detach()}


def pairwise_loss(chosen_scores: torch.Tensor, rejected_scores: torch.Tensor) -> torch.Tensor:
    """Bradley-Terry loss, mean over pairs of -log sigmoid(r_chosen - r_rejected)."""
    return -F.logsigmoid(chosen_scores.float() - rejected_scores.float()).mean()
