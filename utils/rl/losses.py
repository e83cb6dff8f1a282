"""The losses: PPO's clipped policy and value losses (the policy loss with asymmetric clipping and three ways of
averaging over tokens), the KL to the reference as a loss term, the NLL of well-scored answers, the pairwise
(Bradley-Terry) loss of reward models, and the preference losses that train a policy on chosen/rejected pairs
directly (DPO, IPO, SimPO).

The preference losses take sequence log-probs: log pi(y|x) summed over the answer's tokens, EOS included
(`utils.rl.tokens.sequence_logprobs`); index i of every argument is pair i. Each returns the loss (mean over
pairs) and stats, detached 0-dim tensors:
  chosen_rewards / rejected_rewards  mean implicit reward of the chosen / rejected answers (see each loss);
  margins                            mean of chosen reward - rejected reward;
  accuracy                           fraction of pairs whose chosen reward is strictly above the rejected one.

Which loss a run uses is a row of a registry: step 3's --policy_loss of `utils/rl/policy_losses.py`, DPO's
--loss_type of `utils/rl/preference_losses.py`, and --loss_agg_mode of LOSS_AGG_MODES below.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from utils.rl.kl import kl_penalty
from utils.rl.tokens import masked_mean, masked_sum


@dataclass(frozen=True)
class LossAggregation:
    """A way of making a per-token loss (B, A) one number over the real tokens (--loss_agg_mode)."""
    aggregate: Callable  # (losses (B, A), action_mask (B, A)) -> 0-dim tensor
    help: str  # one phrase for --loss_agg_mode's help


def _mean_over_answers(per_row: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    """mean_b of a per-answer value over the rows with at least one real token."""
    has_tokens = (action_mask.sum(dim=1) > 0).to(per_row.dtype)
    return masked_mean(per_row, has_tokens)


def _token_mean(losses: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    return masked_mean(losses, action_mask)


def _seq_mean_token_sum(losses: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    return _mean_over_answers(masked_sum(losses, action_mask, dim=1), action_mask)


def _seq_mean_token_mean(losses: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    return _mean_over_answers(masked_mean(losses, action_mask, dim=1), action_mask)


# The registry of --loss_agg_mode: the flag's choices and help and `aggregate_loss`'s dispatch come from it; a new
# mode is one function (losses, action_mask) -> loss and one row.
LOSS_AGG_MODES = {
    "token_mean": LossAggregation(_token_mean, "the mean over all real tokens of the batch (PPO, DAPO)"),
    "seq_mean_token_sum": LossAggregation(_seq_mean_token_sum,
                                          "each answer's sum over its tokens, averaged over answers (Dr. GRPO)"),
    "seq_mean_token_mean": LossAggregation(_seq_mean_token_mean,
                                           "each answer's mean over its tokens, averaged over answers (GRPO)"),
}


def aggregate_loss(losses: torch.Tensor, action_mask: torch.Tensor, mode: str = "token_mean") -> torch.Tensor:
    """A per-token loss (B, A) made one number, over the real tokens only, by the LOSS_AGG_MODES row `mode`:

        token_mean           sum_bt m_bt l_bt / sum_bt m_bt            every token weighs the same (PPO, DAPO)
        seq_mean_token_sum   mean_b  sum_t m_bt l_bt                   every token weighs the same, the batch's
                                                                       size does not matter (Dr. GRPO)
        seq_mean_token_mean  mean_b (sum_t m_bt l_bt / sum_t m_bt)     every answer weighs the same (GRPO)

    mean_b runs over the rows with at least one real token, so a row whose mask is all 0 (a dropped group)
    counts for nothing, as if it were not in the batch. No real token at all: 0 (gradient 0). Unknown mode:
    ValueError.
    """
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss aggregation {mode!r}; expected one of {tuple(LOSS_AGG_MODES)}")
    return LOSS_AGG_MODES[mode].aggregate(losses, action_mask)


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


def positive_nll(logprobs: torch.Tensor, action_mask: torch.Tensor, positive: torch.Tensor,
                 loss_agg_mode: str = "token_mean") -> torch.Tensor:
    """VAPO's positive-example language-modelling loss (Yue et al. 2025): the negative log-likelihood of the
    sampled answers that scored well (`positive`, (B,) bool), over their real tokens, averaged as the policy loss
    is (`aggregate_loss`). Added to the policy loss, it keeps the likelihood of answers known to be right from
    falling while the group baselines push the others down. No positive answer: 0 (gradient 0)."""
    return aggregate_loss(-logprobs, action_mask * positive.unsqueeze(1).to(action_mask.dtype), loss_agg_mode)


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


def chosen_nll(policy_chosen_logps: torch.Tensor, chosen_lengths: torch.Tensor) -> torch.Tensor:
    """RPO's language-modelling term (Pang et al. 2024, TRL's rpo_alpha): the chosen answers' negative log-likelihood
    per token, mean over pairs,

        nll = mean( -log pi(y_w|x) / |y_w| )      (|y_w|: answer tokens, EOS in)

    Added to a preference loss, it keeps the chosen answers' likelihood from falling with the rejected ones'."""
    return (-policy_chosen_logps.float() / chosen_lengths.float().clamp(min=1)).mean()
