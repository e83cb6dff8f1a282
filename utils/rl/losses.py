"""The losses: PPO's clipped policy and value losses, and the pairwise (Bradley-Terry) loss of reward models."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from utils.rl.tokens import masked_mean


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    action_mask: torch.Tensor,
    clip_range: float = 0.2,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate loss, averaged over all real tokens of the batch.

        ratio_t = exp(logprobs_t - old_logprobs_t)
        loss    = masked_mean( max(-A_t * ratio_t, -A_t * clip(ratio_t, 1 - eps, 1 + eps)) )

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
    clipped = -advantages * ratio.clamp(1.0 - clip_range, 1.0 + clip_range)
    loss = masked_mean(torch.maximum(unclipped, clipped), action_mask)
    with torch.no_grad():
        stats = {
            "clipfrac": masked_mean((clipped > unclipped).to(ratio.dtype), action_mask),
            "approx_kl": masked_mean(0.5 * log_ratio**2, action_mask),
            "ratio_mean": masked_mean(ratio, action_mask),
        }
    return loss, {name: value.detach() for name, value in stats.items()}


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
