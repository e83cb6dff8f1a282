"""The registry of policy losses (step 3's `--policy_loss`): one row each, from which the flag's choices and help and
the trainer's dispatch are derived.

A new policy loss is its function (here, in `utils/rl/losses.py` or a module of its own) and one row here:

    POLICY_LOSSES["my_loss"] = PolicyLoss(my_loss, help="...")

where `my_loss(logprobs, old_logprobs, advantages, action_mask, settings)` returns (loss, stats): the arguments are
(B, A) tensors on the answer positions (`utils/rl/__init__.py`'s conventions), the gradient flows through
`logprobs`, `settings` is step 3's parsed flags (cliprange, cliprange_low, cliprange_high, loss_agg_mode, ...) and
stats are detached 0-dim tensors, logged under their names.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from utils.rl.losses import aggregate_loss, policy_loss
from utils.rl.tokens import masked_mean


@dataclass(frozen=True)
class PolicyLoss:
    """How the actor learns from the advantages of its sampled answers."""
    loss: Callable  # (logprobs, old_logprobs, advantages, action_mask, settings) -> (loss, stats)
    help: str  # one phrase for --policy_loss's help


def _ppo(logprobs, old_logprobs, advantages, action_mask, settings):
    return policy_loss(logprobs, old_logprobs, advantages, action_mask, settings.cliprange, settings.cliprange_low,
                       settings.cliprange_high, settings.loss_agg_mode)


# verl clamps GSPO's log-ratio here too: one answer far off the old policy cannot overflow exp().
MAX_LOG_SEQUENCE_RATIO = 10.0


def gspo_loss(logprobs, old_logprobs, advantages, action_mask, clip_range_low=3e-4, clip_range_high=4e-4,
              loss_agg_mode="seq_mean_token_mean"):
    """GSPO's clipped surrogate on a sequence-level ratio (Zheng et al. 2025, "Group Sequence Policy
    Optimization"; verl's and TRL's importance_sampling_level="sequence"):

        log s_i = min(10, (1 / |y_i|) sum_t m_it (logprobs_it - old_logprobs_it))   (length-normalised)
        s_i     = exp(log s_i) = (pi(y_i|x) / pi_old(y_i|x)) ^ (1 / |y_i|)
        A_i     = (1 / |y_i|) sum_t m_it A_it        (the grpo estimator gives an answer's tokens one advantage)
        l_i     = max(-A_i s_i, -A_i clip(s_i, 1 - eps_low, 1 + eps_high))
        loss    = aggregate_loss(l_i on each of answer i's tokens, action_mask, loss_agg_mode)

    With seq_mean_token_mean (the paper's) the loss is mean_i l_i, and its gradient (where unclipped)
    -A_i s_i (1 / |y_i|) sum_t grad log pi(y_it): every token of an answer weighed alike by the whole answer's
    ratio. The ratio being a mean over tokens, it stays near 1, so the clip ranges are small (the paper's 3e-4 and
    4e-4). A row without real tokens has s = 1, A = 0 and counts for nothing.

    Stats (detached 0-dim tensors): clipfrac, the fraction of answers whose clip is active (gradient 0);
    approx_kl, masked_mean(0.5 * (logprobs - old_logprobs)^2) over tokens as the ppo loss's; ratio_mean, the mean
    s_i over answers.
    """
    log_ratio = logprobs - old_logprobs
    seq_log_ratio = masked_mean(log_ratio, action_mask, dim=1).clamp(max=MAX_LOG_SEQUENCE_RATIO)
    seq_ratio = torch.exp(seq_log_ratio)
    seq_advantages = masked_mean(advantages, action_mask, dim=1)
    unclipped = -seq_advantages * seq_ratio
    clipped = -seq_advantages * seq_ratio.clamp(1.0 - clip_range_low, 1.0 + clip_range_high)
    per_answer = torch.maximum(unclipped, clipped)
    loss = aggregate_loss(per_answer.unsqueeze(1).expand_as(action_mask), action_mask, loss_agg_mode)
    with torch.no_grad():
        answered = (action_mask.sum(dim=1) > 0).to(seq_ratio.dtype)
        stats = {"clipfrac": masked_mean((clipped > unclipped).to(seq_ratio.dtype), answered),
                 "approx_kl": masked_mean(0.5 * log_ratio**2, action_mask),
                 "ratio_mean": masked_mean(seq_ratio, answered)}
    return loss, {name: value.detach() for name, value in stats.items()}


def _gspo(logprobs, old_logprobs, advantages, action_mask, settings):
    low = settings.cliprange if settings.cliprange_low is None else settings.cliprange_low
    high = settings.cliprange if settings.cliprange_high is None else settings.cliprange_high
    return gspo_loss(logprobs, old_logprobs, advantages, action_mask, low, high, settings.loss_agg_mode)


POLICY_LOSSES = {
    "ppo": PolicyLoss(_ppo, "PPO's clipped surrogate, with the probability ratio of each token clipped to "
                            "[1 - --cliprange_low, 1 + --cliprange_high]"),
    "gspo": PolicyLoss(_gspo, "GSPO: one ratio per answer, the geometric mean of its tokens' ratios, clipped to "
                              "[1 - --cliprange_low, 1 + --cliprange_high] (give it small ranges: the gspo "
                              "algorithm's are in training/pipeline.py)"),
}
