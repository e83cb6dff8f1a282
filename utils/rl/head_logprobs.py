"""The output layer and the labels' log-probs in one step, a chunk of rows at a time, so the (N, V) logits of a
whole batch (and their float32 copy, and its log-softmax, and their gradients) never exist at once: with
SmolLM2's 49,152-token vocabulary they are the largest tensors of a training step.

    z[n]        = hidden[n] @ weight.T / T                     (the logits of row n, in the weights' dtype, then
                                                                float32 as `logprobs_from_logits` upcasts them)
    logprob[n]  = z[n, labels[n]] - log sum_v exp(z[n, v])
    entropy[n]  = - sum_v p_v log p_v,   p = softmax(z[n])
    d logprob[n] / d z[n, v] = 1[v = labels[n]] - p_v
    d entropy[n] / d z[n, v] = - p_v (log p_v + entropy[n])

`linear_logprobs` keeps each row's log-sum-exp and computes a chunk's logits again in the backward pass (one
more output-layer matmul, on the rows asked for only); `linear_nll` (the mean negative log-likelihood, step 1's
loss) knows its gradient up to the one scalar of the backward pass, so it computes the gradients in the forward
pass as it goes (as Liger Kernel's fused linear cross-entropy does) and only scales them in the backward. Values
and gradients equal `logprobs_from_logits` / `cross_entropy` on the full logits to float rounding
(tests/utils/rl/test_head_logprobs.py).
"""

from __future__ import annotations

import torch

from utils.rl.tokens import _check_temperature, _compute_dtype

CHUNK_ELEMENTS = 2 ** 22
"""Logits held at once: max(1, CHUNK_ELEMENTS // V) rows a chunk (16 MiB in float32)."""


def _chunks(rows: int, vocab_size: int) -> list[slice]:
    step = max(1, CHUNK_ELEMENTS // vocab_size)
    return [slice(start, min(start + step, rows)) for start in range(0, rows, step)]


def _logits(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """z of a chunk: the output layer's matmul in its own dtype, upcast, divided by the temperature."""
    z = (hidden @ weight.t()).to(_compute_dtype(weight.dtype))
    return z / temperature if temperature != 1.0 else z


def _add_weight_gradient(total, grad_logits, hidden, dtype):
    """total + grad_logits.T @ hidden in `dtype`: a new tensor for the first chunk (total None), in place after."""
    part = grad_logits.t() @ hidden
    if total is None:
        return part.to(dtype)
    return total.add_(part.to(dtype))


def _check(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> None:
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden {tuple(hidden.shape)} must be (N, H) and weight {tuple(weight.shape)} (V, H)")
    if labels.shape != hidden.shape[:1]:
        raise ValueError(f"labels {tuple(labels.shape)} must be (N,) for hidden {tuple(hidden.shape)}")


class _LinearLogprobs(torch.autograd.Function):

    @staticmethod
    def forward(ctx, hidden, weight, labels, temperature, with_entropy):
        dtype = _compute_dtype(weight.dtype)
        rows = hidden.shape[0]
        logprobs, lse = hidden.new_empty(rows, dtype=dtype), hidden.new_empty(rows, dtype=dtype)
        entropy = hidden.new_empty(rows if with_entropy else 0, dtype=dtype)
        for chunk in _chunks(rows, weight.shape[0]):
            z = _logits(hidden[chunk], weight, temperature)
            lse[chunk] = torch.logsumexp(z, dim=-1)
            log_p = z - lse[chunk].unsqueeze(-1)
            logprobs[chunk] = log_p.gather(-1, labels[chunk].unsqueeze(-1)).squeeze(-1)
            if with_entropy:  # 0 log 0 = 0 where a logit is -inf, as entropy_from_logits
                finite_log_p = torch.where(torch.isfinite(log_p), log_p, torch.zeros_like(log_p))
                entropy[chunk] = -(log_p.exp() * finite_log_p).sum(dim=-1)
        ctx.save_for_backward(hidden, weight, labels, lse, entropy)
        ctx.temperature = temperature
        ctx.set_materialize_grads(False)  # an output the loss does not use has no gradient to compute
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy):
        hidden, weight, labels, lse, entropy = ctx.saved_tensors
        temperature = ctx.temperature
        want_hidden, want_weight = ctx.needs_input_grad[:2]
        grad_hidden = torch.empty_like(hidden) if want_hidden else None
        grad_weight = None
        if grad_logprobs is None:
            grad_logprobs = lse.new_zeros(lse.shape)
        for chunk in _chunks(hidden.shape[0], weight.shape[0]):
            grad = grad_logprobs[chunk].to(lse.dtype).unsqueeze(-1)  # (n, 1)
            z = _logits(hidden[chunk], weight, temperature)
            log_p = z - lse[chunk].unsqueeze(-1)
            per_p = grad  # d / d z_v = - p_v x per_p (+ g at the label)
            if grad_entropy is not None and entropy.numel():  # 0 log 0 = 0, as in the forward
                finite_log_p = torch.where(torch.isfinite(log_p), log_p, torch.zeros_like(log_p))
                per_p = grad + grad_entropy[chunk].to(lse.dtype).unsqueeze(-1) * (
                    finite_log_p + entropy[chunk].unsqueeze(-1))
            grad_z = log_p.exp_().mul_(-per_p)
            grad_z.scatter_add_(-1, labels[chunk].unsqueeze(-1), grad)  # + g at the label
            grad_logits = (grad_z / temperature if temperature != 1.0 else grad_z).to(weight.dtype)
            if want_hidden:
                grad_hidden[chunk] = grad_logits @ weight
            if want_weight:
                grad_weight = _add_weight_gradient(grad_weight, grad_logits, hidden[chunk], lse.dtype)
        if want_weight and grad_weight is None:  # no rows
            grad_weight = torch.zeros_like(weight)
        return (grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype), None, None, None)


def linear_logprobs(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0,
                    with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logprobs, entropy) of each row: logprob[n] = log softmax(hidden[n] @ weight.T / T)[labels[n]] and, if
    asked, the entropy of that softmax (with its gradient, for an entropy bonus; else None).

    hidden (N, H) (the inputs of a bias-free output layer), weight (V, H), labels (N,) -> (N,), (N,) float32
    (float64 for float64 weights). Equals `logprobs_from_logits(hidden @ weight.T, labels, T)` and
    `entropy_from_logits`, with gradients for hidden and weight; N = 0 gives empty tensors.
    """
    _check_temperature(temperature)
    _check(hidden, weight, labels)
    logprobs, entropy = _LinearLogprobs.apply(hidden, weight, labels.long(), float(temperature), with_entropy)
    return logprobs, (entropy if with_entropy else None)


class _LinearNLL(torch.autograd.Function):

    @staticmethod
    def forward(ctx, hidden, weight, labels, grad_enabled):
        dtype = _compute_dtype(weight.dtype)
        rows = hidden.shape[0]
        want_hidden, want_weight = (grad_enabled and wanted for wanted in ctx.needs_input_grad[:2])
        grad_hidden = torch.empty_like(hidden) if want_hidden else None
        grad_weight = None
        total = torch.zeros((), dtype=dtype, device=hidden.device)
        for chunk in _chunks(rows, weight.shape[0]):
            z = _logits(hidden[chunk], weight, 1.0)
            lse = torch.logsumexp(z, dim=-1, keepdim=True)
            total -= (z.gather(-1, labels[chunk].unsqueeze(-1)) - lse).sum()
            if want_hidden or want_weight:  # d loss / d z = (p - onehot(label)) / N
                grad_z = (z - lse).exp_()
                grad_z.scatter_add_(-1, labels[chunk].unsqueeze(-1), -torch.ones_like(lse))
                grad_logits = (grad_z / rows).to(weight.dtype)
                if want_hidden:
                    grad_hidden[chunk] = grad_logits @ weight
                if want_weight:
                    grad_weight = _add_weight_gradient(grad_weight, grad_logits, hidden[chunk], dtype)
        if want_weight and grad_weight is None:  # no rows
            grad_weight = torch.zeros_like(weight)
        ctx.grads = (grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype))
        return total / max(rows, 1)

    @staticmethod
    def backward(ctx, grad_loss):
        grads = ctx.grads
        del ctx.grads
        if grad_loss.item() != 1.0:  # 1 (no accumulation): the gradients as they are, not a copy of (V, H)
            grads = tuple(None if grad is None else grad * grad_loss.to(grad.dtype) for grad in grads)
        return (*grads, None, None)


def linear_nll(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The mean negative log-likelihood of the labels, - (1/N) sum_n log softmax(hidden[n] @ weight.T)[labels[n]]:
    `cross_entropy(hidden @ weight.T, labels)` (a causal LM's loss on its labelled positions), scalar float32
    (float64 for float64 weights), with gradients for hidden and weight. N = 0 gives 0 (and zero gradients).

    The gradients are computed in this forward pass (when a gradient is wanted), so it takes the output layer's
    three matmuls of a plain forward and backward, on the N labelled rows only; they are held (N, H) + (V, H)
    until the backward pass.
    """
    _check(hidden, weight, labels)
    return _LinearNLL.apply(hidden, weight, labels.long(), torch.is_grad_enabled())
