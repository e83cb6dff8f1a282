"""Per-token rewards (the KL penalty plus the end score) and the running moments that normalise scores."""

from __future__ import annotations

import math

import torch

from utils.rl.kl import kl_penalty
from utils.rl.tokens import last_token_index


def compute_rewards(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    end_scores: torch.Tensor,
    action_mask: torch.Tensor,
    kl_coef: float,
    estimator: str = "k1",
    reward_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token rewards: a KL penalty on every real token plus the reward model's score at the last one.

        kl_t      = kl_penalty(logprobs, ref_logprobs, estimator)_t * m_t
        rewards_t = -kl_coef * kl_t + [t == n - 1] * clip(end_score, -reward_clip, reward_clip)

    where n is the number of real tokens of the row (the score lands on the EOS, or on the last token of an
    answer cut at the length limit: the same position step 2 scores). reward_clip=None leaves the score as is.
    logprobs, ref_logprobs, action_mask (B, A); end_scores (B,). Returns (rewards, kl), both (B, A) and 0
    where the mask is 0. A row with no real token gets no end score: its rewards are all 0.
    Call under torch.no_grad(): rewards are targets, not something to differentiate.
    """
    mask = action_mask.to(logprobs.dtype)
    kl = kl_penalty(logprobs, ref_logprobs, estimator) * mask
    rewards = -kl_coef * kl

    scores = end_scores.to(rewards.dtype)
    if reward_clip is not None:
        scores = scores.clamp(-reward_clip, reward_clip)
    last = last_token_index(action_mask)
    has_tokens = last >= 0
    scores = torch.where(has_tokens, scores, torch.zeros_like(scores))
    rewards = rewards.scatter_add(1, last.clamp_min(0).unsqueeze(1), scores.unsqueeze(1))
    return rewards, kl


class RunningMoments:
    """Running mean and standard deviation of every scalar seen so far, for reward normalisation.

    A batch of n_b values with mean mu_b and sum of squared deviations M2_b is folded into the running
    (n_a, mu_a, M2_a) with the parallel formula of Chan et al.:

        n     = n_a + n_b,   delta = mu_b - mu_a
        mu    = mu_a + delta * n_b / n
        M2    = M2_a + M2_b + delta^2 * n_a * n_b / n
        std   = sqrt(M2 / n)                         (population std, numpy's default ddof=0)

    Accumulated in float64 Python floats. Before any update, mean = 0 and std = 1, so `normalise` is the
    identity. In a multi-process run, gather the scores of all ranks before `update` so every rank keeps the
    same statistics.
    """

    def __init__(self):
        self.count = 0.0
        self._mean = 0.0
        self._m2 = 0.0

    @property
    def mean(self) -> float:
        return self._mean

    @property
    def std(self) -> float:
        return math.sqrt(self._m2 / self.count) if self.count > 0 else 1.0

    def update(self, xs: torch.Tensor) -> tuple[float, float]:
        """Fold every element of `xs` into the running moments; return the batch's (mean, population std)."""
        xs = xs.detach().reshape(-1).to(torch.float64)
        n_b = xs.numel()
        if n_b == 0:
            raise ValueError("RunningMoments.update needs at least one value")
        mean_b = xs.mean().item()
        m2_b = ((xs - mean_b) ** 2).sum().item()

        n = self.count + n_b
        delta = mean_b - self._mean
        self._mean += delta * n_b / n
        self._m2 += m2_b + delta**2 * self.count * n_b / n
        self.count = n
        return mean_b, math.sqrt(m2_b / n_b)

    def normalise(self, x: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
        """(x - mean) / (std + eps) with shift_mean=True; x / (std + eps) otherwise (TRL-style scaling)."""
        centred = x - self._mean if shift_mean else x
        return centred / (self.std + eps)

    def state_dict(self) -> dict[str, float]:
        return {"count": self.count, "mean": self._mean, "m2": self._m2}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.count = float(state["count"])
        self._mean = float(state["mean"])
        self._m2 = float(state["m2"])
