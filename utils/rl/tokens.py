"""Per-token quantities of a policy: log-probs and entropy from logits, and statistics over real tokens only
(the conventions are in utils/rl/__init__.py)."""

from __future__ import annotations

import torch

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
   , otherwise the PPO ratio is not pi_new / pi_old.

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


def sequence_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, answer_mask: torch.Tensor) -> torch.Tensor:
    """Log-probability of each row's answer under a causal LM: the sum of its answer tokens' log-probs.

        log pi(y|x)[b] = sum_t answer_mask[b, t] * log p(input_ids[b, t + 1] | input_ids[b, :t + 1])

    logits (B, T, V) of the model on input_ids (B, T); answer_mask (B, T - 1) is 1.0 where the next-token label
    input_ids[b, t + 1] belongs to the answer (EOS included) and 0.0 on prompt and padding labels (whatever the
    sequence's layout, prompts of different lengths in one batch included). -> (B,) float32 (float64 for float64
    logits). A row with an all-zero mask gives 0.
    """
    if answer_mask.shape != (input_ids.shape[0], input_ids.shape[1] - 1):
        raise ValueError(f"answer_mask {tuple(answer_mask.shape)} must be (B, T - 1) for input_ids "
                         f"{tuple(input_ids.shape)}")
    logprobs = logprobs_from_logits(logits[:, :-1], input_ids[:, 1:])
    return masked_sum(logprobs, answer_mask, dim=-1)


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


def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last real (mask 1) position of each row: right, left or no padding, prefix action masks too.

    mask (B, T) -> (B,) long; a row with no real position gives -1.
    """
    positions = torch.arange(mask.shape[-1], device=mask.device)
    index = (positions * (mask > 0).long()).argmax(dim=-1)
    return torch.where((mask > 0).any(dim=-1), index, torch.full_like(index, -1))
