"""The tensor math of RLHF with PPO: log-probs, KL estimators, rewards, GAE, whitening and the PPO losses.

Every function here is small, pure (it never modifies its inputs) and works on plain tensors, so each can be
unit-tested on values worked out by hand (tests/training/step3_rlhf_finetuning/test_ppo_math.py).

Conventions
-----------
* Per-token tensors cover the ANSWER (action) positions only and have shape (B, A): position t is the t-th
  generated token, so ``logprobs[:, t]`` is log pi(answer_t | prompt, answer_<t).
* ``action_mask`` (B, A) is 1.0 on real answer tokens, the EOS token INCLUDED, and 0.0 on the padding after
  it. It is a prefix mask: a row's real tokens are positions 0 .. n-1 with n = action_mask[row].sum(). The EOS
  must stay inside the mask, or stopping is never reinforced (DESIGN-NOTES section 3, item 3).
* Every row of a real batch has n >= 1 (an empty answer still has its EOS). A row with n = 0 is nevertheless
  handled without NaN: each function's docstring says what such a row gives (always zeros or "contributes
  nothing").
* Masks are binary (0.0 / 1.0). Masked-out values are multiplied by 0, so they must be finite.

References (read, not copied): Schulman, "Approximating KL divergence" (2020) for k1/k2/k3; Ziegler et al.,
"Fine-Tuning Language Models from Human Preferences" (2019) for the adaptive KL controller; Schulman et al.,
"High-Dimensional Continuous Control Using GAE" (2015); Huang et al., "The N+ Implementation Details of RLHF
with PPO" (2024); TRL, OpenRLHF, torchtune and DeepSpeed-Chat.
"""

from __future__ import annotations

import math

import torch

KL_ESTIMATORS = ("k1", "k2", "k3")


# ----------------------------------------------------------------------------------------------------------
# Log-probabilities and entropy
# ----------------------------------------------------------------------------------------------------------


def _check_temperature(temperature: float) -> None:
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; every other dtype (float32, bf16, fp16) is computed in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def logprobs_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Log-probability of each label under softmax(logits / T).

        logprob[b, t] = z[b, t, labels[b, t]] - log sum_v exp(z[b, t, v]),   z = logits / T

    logits (B, A, V), labels (B, A) -> (B, A). The temperature must be the one used to sample the rollouts
    (DESIGN-NOTES section 3, item 5), otherwise the PPO ratio is not pi_new / pi_old.

    Memory: the (A, V) slice of one row at a time is scaled and normalised, so the peak extra memory is one
    row's vocabulary slice, not a (B, A, V) copy. bf16 / fp16 logits are upcast to float32 row by row (a
    log-softmax in bf16 loses ~3 significant digits); the result is float32 (float64 for float64 logits).
    """
    _check_temperature(temperature)
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} do not match")
    out_dtype = _compute_dtype(logits.dtype)
    rows = []
    for row_logits, row_labels in zip(logits, labels):  # (A, V), (A,)
        z = row_logits.to(out_dtype)
        if temperature != 1.0:
            z = z / temperature
        row_logprobs = torch.log_softmax(z, dim=-1)
        rows.append(row_logprobs.gather(-1, row_labels.long().unsqueeze(-1)).squeeze(-1))
    if not rows:
        return logits.new_zeros(labels.shape, dtype=out_dtype)
    return torch.stack(rows)


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Entropy of softmax(logits / T) at each position.

        H[b, t] = - sum_v p_v log p_v,   p = softmax(logits[b, t] / T)

    logits (B, A, V) -> (B, A). Terms with p_v = 0 (logits of -inf, e.g. a masked vocabulary) count as 0.
    Computed one row at a time in float32 (float64 for float64 logits), as in `logprobs_from_logits`.
    """
    _check_temperature(temperature)
    out_dtype = _compute_dtype(logits.dtype)
    rows = []
    for row_logits in logits:  # (A, V)
        z = row_logits.to(out_dtype)
        if temperature != 1.0:
            z = z / temperature
        log_p = torch.log_softmax(z, dim=-1)
        # 0 * log 0 = 0: replace -inf by 0 before the product so neither forward nor backward makes a NaN.
        finite_log_p = torch.where(torch.isfinite(log_p), log_p, torch.zeros_like(log_p))
        rows.append(-(log_p.exp() * finite_log_p).sum(dim=-1))
    if not rows:
        return logits.new_zeros(logits.shape[:-1], dtype=out_dtype)
    return torch.stack(rows)


# ----------------------------------------------------------------------------------------------------------
# Masked statistics
# ----------------------------------------------------------------------------------------------------------


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """sum_i x_i m_i, over all elements (dim=None) or along `dim`."""
    masked = x * mask.to(x.dtype)
    return masked.sum() if dim is None else masked.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """sum_i x_i m_i / sum_i m_i, over all elements (dim=None) or along `dim`.

    Where the mask is all zeros (sum_i m_i = 0) the result is 0, not NaN, and its gradient is 0 too.
    """
    count = masked_sum(torch.ones_like(x), mask, dim)
    # Divide by 1 where the count is 0 (the numerator is 0 there): a plain where() after the division would
    # still send NaN gradients through the unused 0/0 branch.
    safe_count = torch.where(count > 0, count, torch.ones_like(count))
    return masked_sum(x, mask, dim) / safe_count


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked elements of x (all of them together, one scalar).

        mu  = masked_mean(x, m),   n = sum_i m_i
        var = sum_i m_i (x_i - mu)^2 / (n - 1)     (unbiased, Bessel's correction)
        var = sum_i m_i (x_i - mu)^2 / n           (unbiased=False)

    With n = 0 the result is 0; with n = 1 it is 0 too (the denominator n - 1 is replaced by 1, and the sum of
    squares of one centred element is 0), so neither case makes a NaN.
    """
    mu = masked_mean(x, mask)
    sum_squares = masked_sum((x - mu) ** 2, mask)
    n = masked_sum(torch.ones_like(x), mask)
    denominator = n - 1 if unbiased else n
    return sum_squares / denominator.clamp_min(1)


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Whiten x over all its masked elements together (one mean and variance for the whole batch).

        y_i = (x_i - mu) / sqrt(var + eps)            (shift_mean=True: mean 0, unbiased variance ~1)
        y_i = (x_i - mu) / sqrt(var + eps) + mu       (shift_mean=False: rescale only, keep the mean, as TRL)

    with mu = masked_mean(x, m) and var = masked_var(x, m, unbiased=True). y_i = 0 wherever m_i = 0. A mask
    with no ones gives all zeros.
    """
    mu = masked_mean(x, mask)
    var = masked_var(x, mask, unbiased=True)
    whitened = (x - mu) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mu
    return whitened * mask.to(whitened.dtype)


# ----------------------------------------------------------------------------------------------------------
# KL penalty and rewards
# ----------------------------------------------------------------------------------------------------------


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k1") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from tokens sampled from pi (Schulman 2020).

    With r = ref_logprobs - logprobs = log(pi_ref / pi) at the sampled token:
        k1 = -r               = logprobs - ref_logprobs   unbiased, can be negative per token
        k2 = r^2 / 2                                       biased, >= 0, low variance
        k3 = exp(r) - 1 - r                                unbiased, >= 0 (since e^r >= 1 + r), low variance

    Elementwise, any shape. Unknown estimator -> ValueError. k3 is computed exactly (no clamping of r), so a
    huge log-ratio (r > ~88 in float32) overflows to inf.
    """
    r = ref_logprobs - logprobs
    if estimator == "k1":
        return -r
    if estimator == "k2":
        return 0.5 * r**2
    if estimator == "k3":
        return torch.expm1(r) - r
    raise ValueError(f"unknown KL estimator {estimator!r}; expected one of {KL_ESTIMATORS}")


def last_token_index(action_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last real answer token of each row: n - 1 with n = number of ones in the (prefix) mask.

    action_mask (B, A) -> (B,) long. A row with no real token gives -1.
    """
    return action_mask.sum(dim=-1).round().long() - 1


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


# ----------------------------------------------------------------------------------------------------------
# Advantages
# ----------------------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------------------
# PPO losses
# ----------------------------------------------------------------------------------------------------------


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


# ----------------------------------------------------------------------------------------------------------
# KL coefficient controllers
# ----------------------------------------------------------------------------------------------------------


class FixedKLController:
    """A constant KL coefficient; `update` does nothing. Same interface as `AdaptiveKLController`."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        pass

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019), steering the measured KL towards `target`.

        proportional_error = clip(current_kl / target - 1, -0.2, 0.2)
        value <- value * (1 + proportional_error * n_steps / horizon)

    `current_kl` is the KL per sequence (summed over tokens, averaged over the batch) in the units of
    `target`; `n_steps` is the number of samples (sequences) the measurement covers. The state is `value`
    alone; `target` and `horizon` come from the run's arguments.
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: float):
        if not target > 0 or not horizon > 0:
            raise ValueError(f"target and horizon must be > 0, got target={target}, horizon={horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        proportional_error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


# ----------------------------------------------------------------------------------------------------------
# Running reward statistics
# ----------------------------------------------------------------------------------------------------------


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
