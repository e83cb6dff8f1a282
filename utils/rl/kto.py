"""KTO's loss (Ethayarajh et al. 2024, "KTO: Model Alignment as Prospect Theoretic Optimization"; TRL's KTOTrainer,
OpenRLHF's train_kto.py): a policy learns from answers labelled desirable or undesirable one by one, with no pairs,
against a frozen reference.

Arguments are sequence log-probs log pi(y|x) summed over the answer's tokens, EOS included
(`utils.rl.tokens.sequence_logprobs`), (B,), index i of every argument being answer i of the batch.
"""
from __future__ import annotations

from typing import Callable

import torch


def kto_kl_estimate(
    policy_mismatched_logps: torch.Tensor,
    ref_mismatched_logps: torch.Tensor,
    batch_mean: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """KTO's reference point z_0, an estimate of KL(pi || ref) from the batch's mismatched pairs (prompt x_j with
    the answer y'_j given to another prompt of the batch):

        z_0 = max(0, mean_j (log pi(y'_j|x_j) - log ref(y'_j|x_j)))

    `batch_mean` (optional) averages the mean over every rank's batch before the clamp. Detached: no gradient
    flows through z_0 (the paper's, TRL's). No pairs: 0. Returns a 0-dim float32 tensor (float64 stays float64).
    """
    dtype = torch.float64 if policy_mismatched_logps.dtype == torch.float64 else torch.float32
    with torch.no_grad():
        log_ratios = policy_mismatched_logps.to(dtype) - ref_mismatched_logps.to(dtype)
        mean = log_ratios.mean() if log_ratios.numel() else log_ratios.new_zeros(())
        if batch_mean is not None:
            mean = batch_mean(mean)
        return mean.clamp(min=0.0).detach()


def kto_loss(
    policy_logps: torch.Tensor,
    ref_logps: torch.Tensor,
    desirable: torch.Tensor,
    kl: torch.Tensor | float,
    beta: float = 0.1,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """KTO's loss on a batch of labelled answers (`desirable` (B,) bool), with the reference point z_0 = `kl`
    (`kto_kl_estimate`, no gradient):

        r_i    = log pi(y_i|x_i) - log ref(y_i|x_i)
        v_i    = lambda_D sigmoid(beta (r_i - z_0))    if y_i is desirable
                 lambda_U sigmoid(beta (z_0 - r_i))    if y_i is undesirable
        loss   = mean_i (lambda_{y_i} - v_i)

    lambda_D = desirable_weight, lambda_U = undesirable_weight (the paper keeps lambda_D n_D / (lambda_U n_U) in
    [1, 4/3] for n_D desirable and n_U undesirable answers). A desirable answer gains by rising above the reference
    by more than the policy's KL, an undesirable one by falling below it; the sigmoid saturates, so no answer is
    pushed without bound. Stats (detached 0-dim tensors): desirable_rewards and undesirable_rewards, the mean
    beta r_i of each kind (0 where the batch has none), and kl, z_0. No answers: loss 0.
    """
    dtype = torch.float64 if policy_logps.dtype == torch.float64 else torch.float32
    rewards = beta * (policy_logps.to(dtype) - ref_logps.to(dtype))
    z_0 = beta * torch.as_tensor(kl, dtype=dtype, device=rewards.device)
    desirable = desirable.to(torch.bool)
    values = torch.where(desirable, desirable_weight * torch.sigmoid(rewards - z_0),
                         undesirable_weight * torch.sigmoid(z_0 - rewards))
    weights = torch.where(desirable, torch.full_like(rewards, desirable_weight),
                          torch.full_like(rewards, undesirable_weight))
    loss = (weights - values).mean() if rewards.numel() else rewards.sum()
    with torch.no_grad():
        stats = {"desirable_rewards": _mean_where(rewards, desirable),
                 "undesirable_rewards": _mean_where(rewards, ~desirable), "kl": z_0 / beta}
    return loss, {name: value.detach() for name, value in stats.items()}


def _mean_where(values: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """The mean of `values` where `where` holds; 0 where it never does."""
    count = where.sum()
    return (values * where).sum() / count.clamp(min=1)
