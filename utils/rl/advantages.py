"""Advantage estimators: GAE with a critic; GRPO, RLOO and REINFORCE++ without one."""

from __future__ import annotations

import torch


def gae_advantages_and_returns(
    values: torch.Tensor,
    rewards: torch.Tensor,
    action_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation, computed backwards over the answer positions.

        delta_t = r_t + gamma * V_{t+1} - V_t
        A_t     = delta_t + gamma * lam * A_{t+1}
        R_t     = A_t + V_t                      (the critic's target, "returns")

    The episode ends at the last real token (EOS): values and rewards at padded positions are treated as 0,
    so V_{t+1} = 0 after the last real token and A_{t+1} = 0 there. A masked position inside the answer (a tool's
    output, inference/tool_rollout.py) is not a step: t + 1 is the next real position, V and A are carried
    across it unchanged (for a mask that is 1 then 0, the same numbers as without the carry). values, rewards,
    action_mask (B, A) ->
    (advantages, returns), both (B, A) and 0 where the mask is 0; a row with no real token gives zeros.
    Call under torch.no_grad(): advantages and returns are targets, not something to differentiate.
    """
    mask = action_mask.to(values.dtype)
    values = values * mask
    rewards = rewards * mask
    length = values.shape[-1]
    if length == 0:
        return torch.zeros_like(values), torch.zeros_like(values)
    next_value = torch.zeros_like(values[:, 0])
    next_advantage = torch.zeros_like(values[:, 0])
    advantages_reversed = []
    real = mask > 0
    for t in reversed(range(length)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        next_advantage = torch.where(real[:, t], delta + gamma * lam * next_advantage, next_advantage)
        next_value = torch.where(real[:, t], values[:, t], next_value)
        advantages_reversed.append(next_advantage)
    advantages = torch.stack(advantages_reversed[::-1], dim=1) * mask
    returns = (advantages + values) * mask
    return advantages, returns


# ----------------------------------------------------------------------------------------------------------
# Critic-free estimators. Scores come as (num_prompts, group): row i holds the end scores of the `group`
# answers sampled for prompt i (rollouts are ordered prompt by prompt, each repeated `group` times, so
# `scores.view(-1, group)` of the (B,) scores of a rollout batch).
# ----------------------------------------------------------------------------------------------------------


def grpo_advantages(scores: torch.Tensor, std_normalization: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """Group-relative advantages of GRPO (Shao et al. 2024, DeepSeekMath):

        A_i = (r_i - mean_g(r)) / (std_g(r) + eps)      std_g: unbiased (Bessel) std over the group
        A_i =  r_i - mean_g(r)                          std_normalization=False (Dr. GRPO, Liu et al. 2025)

    scores (N, G) -> (N, G). A group of equal rewards gives 0 for every answer (never NaN); so does a group of
    one (G = 1, whose std is taken as 0).
    """
    centred = scores - scores.mean(dim=1, keepdim=True)
    if not std_normalization:
        return centred
    group = scores.shape[1]
    std = torch.sqrt((centred**2).sum(dim=1, keepdim=True) / max(group - 1, 1))
    return centred / (std + eps)


def rloo_advantages(scores: torch.Tensor) -> torch.Tensor:
    """REINFORCE leave-one-out (Kool et al. 2019; Ahmadian et al. 2024): the baseline of answer i is the mean
    score of the other G - 1 answers to its prompt,

        A_i = r_i - (sum_j r_j - r_i) / (G - 1)  =  G / (G - 1) * (r_i - mean_g(r))

    scores (N, G) -> (N, G), G >= 2 (ValueError otherwise). A group of equal rewards gives 0.
    """
    group = scores.shape[1]
    if group < 2:
        raise ValueError(f"the leave-one-out baseline needs at least 2 answers per prompt, got {group}")
    others_mean = (scores.sum(dim=1, keepdim=True) - scores) / (group - 1)
    return scores - others_mean


def returns_to_go(rewards: torch.Tensor, action_mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """Discounted return from each answer position to the end of the answer:

        G_t = r_t + gamma * G_{t+1},   G = 0 after the last real token

    A masked position inside the answer (a tool's output) is not a step: G is carried across it undiscounted.
    rewards, action_mask (B, A) -> (B, A), 0 where the mask is 0."""
    mask = action_mask.to(rewards.dtype)
    rewards = rewards * mask
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0]) if rewards.shape[1] else None
    real = mask > 0
    for t in reversed(range(rewards.shape[1])):
        running = torch.where(real[:, t], rewards[:, t] + gamma * running, running)
        returns[:, t] = running
    return returns * mask


def reinforce_pp_advantages(rewards: torch.Tensor, action_mask: torch.Tensor, gamma: float = 1.0,
                            batch_sum=None, eps: float = 1e-8) -> torch.Tensor:
    """REINFORCE++ (Hu 2025): returns-to-go of the per-token rewards (the KL penalty on every token, the score on
    the last: `compute_rewards`), whitened over every real token of the global batch; no critic, no group.

        G_t = returns_to_go(rewards)_t
        mu  = sum_bt m_bt G_bt / n,   var = sum_bt m_bt (G_bt - mu)^2 / (n - 1),   n = sum_bt m_bt
        A_t = (G_t - mu) / sqrt(var + eps)

    `batch_sum(tensor) -> tensor` sums over the global batch (an all-reduce across ranks); None: this batch
    alone, which is then exactly `masked_whiten(G, action_mask)`. (B, A) -> (B, A), 0 where the mask is 0; a
    batch without real tokens gives zeros.
    """
    batch_sum = batch_sum or (lambda tensor: tensor)
    mask = action_mask.to(rewards.dtype)
    returns = returns_to_go(rewards, mask, gamma)
    total, count = batch_sum(torch.stack([(returns * mask).sum(), mask.sum()]))
    mean = total / count.clamp_min(1)
    var = batch_sum(((returns - mean) ** 2 * mask).sum()) / (count - 1).clamp_min(1)
    return (returns - mean) * torch.rsqrt(var + eps) * mask


def sequence_advantages(advantages: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    """One advantage per answer on each of its real tokens: A_bt = A_b * m_bt. advantages (B,), mask (B, A)."""
    return advantages.unsqueeze(1) * action_mask.to(advantages.dtype)
