"""Advantage estimators: GAE with a critic."""

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
    so V_{t+1} = 0 after the last real token and A_{t+1} = 0 there. values, rewards, action_mask (B, A) ->
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
    for t in reversed(range(length)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        next_advantage = delta + gamma * lam * next_advantage
        next_value = values[:, t]
        advantages_reversed.append(next_advantage)
    advantages = torch.stack(advantages_reversed[::-1], dim=1) * mask
    returns = (advantages + values) * mask
    return advantages, returns
