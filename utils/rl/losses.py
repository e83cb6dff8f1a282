"""The losses: PPO's clipped policy and value losses, the pairwise (Bradley-Terry) loss of reward models, and the
preference losses that train a policy on chosen/rejected pairs directly (DPO, IPO, SimPO).

The preference losses take sequence log-probs: log pi(y|x) summed over the answer's tokens, EOS included
(`utils.rl.tokens.sequence_logprobs`); index i of every argument is pair i. Each returns the loss (mean over
pairs) and stats, detached 0-dim tensors:
  chosen_rewards / rejected_rewards  mean implicit reward of the chosen / rejected answers (see each loss);
  margins                            mean of chosen reward - rejected reward;
  accuracy                           fraction of pairs whose chosen reward is strictly above the rejected one.
"""

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


PREFERENCE_LOSS_TYPES = ("sigmoid", "ipo", "simpo")


def _smoothed_logsigmoid_loss(logits: torch.Tensor, label_smoothing: float) -> torch.Tensor:
    """-(1 - eps) log sigmoid(z) - eps log sigmoid(-z), mean over pairs: the logistic loss on a preference label
    that is wrong with probability eps (eps = 0: -log sigmoid(z))."""
    losses = -(1.0 - label_smoothing) * F.logsigmoid(logits) - label_smoothing * F.logsigmoid(-logits)
    return losses.mean()


def _reward_stats(chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor) -> dict[str, torch.Tensor]:
    chosen_rewards, rejected_rewards = chosen_rewards.detach(), rejected_rewards.detach()
    return {"chosen_rewards": chosen_rewards.mean(), "rejected_rewards": rejected_rewards.mean(),
            "margins": (chosen_rewards - rejected_rewards).mean(),
            "accuracy": (chosen_rewards > rejected_rewards).float().mean()}


def _logratio_rewards(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, beta):
    """DPO's implicit rewards r = beta * (log pi(y|x) - log ref(y|x)) of the chosen and rejected answers."""
    chosen = beta * (policy_chosen_logps.float() - ref_chosen_logps.float())
    rejected = beta * (policy_rejected_logps.float() - ref_rejected_logps.float())
    return chosen, rejected


def dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DPO's sigmoid loss (Rafailov et al. 2023) with conservative DPO's label smoothing (Mitchell 2023).

        r_w  = beta * (log pi(y_w|x) - log ref(y_w|x)),   r_l = beta * (log pi(y_l|x) - log ref(y_l|x))
        loss = mean( -(1 - eps) log sigmoid(r_w - r_l) - eps log sigmoid(r_l - r_w) )

    eps = label_smoothing: 0 is plain DPO, whose loss falls for ever as the margin grows; with eps > 0 (labels
    taken as flipped with probability eps, eps < 0.5) it is least at the finite margin log((1 - eps) / eps).
    Rewards in the stats are r_w and r_l.
    """
    chosen, rejected = _logratio_rewards(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps,
                                         ref_rejected_logps, beta)
    return _smoothed_logsigmoid_loss(chosen - rejected, label_smoothing), _reward_stats(chosen, rejected)


def ipo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float = 0.1,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """IPO's squared loss (Azar et al. 2023), beta in the role of the paper's tau.

        h    = (log pi(y_w|x) - log ref(y_w|x)) - (log pi(y_l|x) - log ref(y_l|x))
        loss = mean( (h - 1 / (2 beta))^2 )

    It pulls each pair's log-ratio margin h to 1 / (2 beta) and no further (DPO's loss keeps falling as h grows,
    so a deterministic preference drives it to infinity). Rewards in the stats are beta * log-ratio, as DPO's.
    """
    chosen, rejected = _logratio_rewards(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps,
                                         ref_rejected_logps, beta)
    h = (chosen - rejected) / beta
    return ((h - 1.0 / (2.0 * beta)) ** 2).mean(), _reward_stats(chosen, rejected)


def simpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    chosen_lengths: torch.Tensor,
    rejected_lengths: torch.Tensor,
    beta: float = 2.0,
    gamma: float = 0.5,
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SimPO's loss (Meng et al. 2024): length-normalised and reference-free, with a target margin gamma.

        r_w  = beta * log pi(y_w|x) / |y_w|,   r_l = beta * log pi(y_l|x) / |y_l|     (|y|: answer tokens, EOS in)
        loss = mean( -(1 - eps) log sigmoid(r_w - r_l - gamma) - eps log sigmoid(gamma - r_w + r_l) )

    The reward is the mean per-token log-prob, so a longer answer is not rewarded or punished for its length;
    gamma asks the chosen answer to win by a margin. Rewards in the stats are r_w and r_l (margins without gamma).
    """
    chosen = beta * policy_chosen_logps.float() / chosen_lengths.float().clamp(min=1)
    rejected = beta * policy_rejected_logps.float() / rejected_lengths.float().clamp(min=1)
    loss = _smoothed_logsigmoid_loss(chosen - rejected - gamma, label_smoothing)
    return loss, _reward_stats(chosen, rejected)


def preference_loss(
    loss_type: str,
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor | None,
    ref_rejected_logps: torch.Tensor | None,
    chosen_lengths: torch.Tensor,
    rejected_lengths: torch.Tensor,
    *,
    beta: float,
    label_smoothing: float = 0.0,
    simpo_gamma: float = 0.5,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss of `loss_type` ("sigmoid": DPO, "ipo", "simpo") on one batch of pairs. The reference log-probs
    are unused (and may be None) for SimPO, the answer lengths for the others; IPO takes no label smoothing."""
    if loss_type == "sigmoid":
        return dpo_loss(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, beta,
                        label_smoothing)
    if loss_type == "ipo":
        return ipo_loss(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, beta)
    if loss_type == "simpo":
        return simpo_loss(policy_chosen_logps, policy_rejected_logps, chosen_lengths, rejected_lengths, beta,
                          simpo_gamma, label_smoothing)
    raise ValueError(f"unknown preference loss {loss_type!r} (one of {', '.join(PREFERENCE_LOSS_TYPES)})")
