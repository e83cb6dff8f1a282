"""ORPO's loss (Hong et al. 2024, "ORPO: Monolithic Preference Optimization without Reference Model"; TRL's
ORPOTrainer): supervised fine-tuning and preference alignment in one loss, with no reference model, so it trains a
base model on preference pairs directly (no step 1).

Arguments follow the preference losses of `utils/rl/losses.py`: sequence log-probs log pi(y|x) summed over the
answer's tokens, EOS included, (B,), index i of every argument being pair i; lengths |y| are the answers' token
counts (EOS in).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from utils.rl.losses import chosen_nll

# The mean per-token log-prob is capped just below 0 (p at most 1 - 1e-6): at p = 1 the odds are infinite.
MAX_MEAN_LOGP = -1e-6


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - e^x) for x < 0, accurate at both ends (Maechler 2012): log(-expm1(x)) near 0, log1p(-e^x) below
    -ln 2. Both branches are finite for x < 0, so neither sends a NaN gradient through torch.where."""
    return torch.where(x > -math.log(2.0), torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def log_odds(logps: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """ORPO's log odds of answers, from the length-normalised likelihood p = exp(log pi(y|x) / |y|):

        log odds(y|x) = log (p / (1 - p)) = log p - log(1 - p)

    log p is capped at MAX_MEAN_LOGP (p = 1 has infinite odds; the gradient is 0 past the cap). (B,) -> (B,),
    float32 (float64 stays float64)."""
    dtype = torch.float64 if logps.dtype == torch.float64 else torch.float32
    mean_logp = (logps.to(dtype) / lengths.to(dtype).clamp(min=1)).clamp(max=MAX_MEAN_LOGP)
    return mean_logp - log1mexp(mean_logp)


def orpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    chosen_lengths: torch.Tensor,
    rejected_lengths: torch.Tensor,
    lam: float = 0.1,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """ORPO's loss: the chosen answers' NLL plus lambda times the odds-ratio term.

        nll     = mean( -log pi(y_w|x) / |y_w| )                                  (the SFT loss, `chosen_nll`)
        or_loss = mean( -log sigmoid(log odds(y_w|x) - log odds(y_l|x)) )          (`log_odds`)
        loss    = nll + lambda * or_loss

    The odds ratio odds(y_w) / odds(y_l) grows as the chosen answer becomes likelier than the rejected one; unlike
    DPO's log-ratio it saturates as p(y_w) -> 1, and the NLL keeps the model on the chosen answers, so there is no
    reference to stay near. Stats (detached 0-dim tensors), as the preference losses': chosen_rewards and
    rejected_rewards the mean log odds, margins the mean log odds ratio, accuracy the fraction of pairs whose chosen
    answer has the higher odds (the higher mean per-token log-prob); and nll, or_loss.
    """
    nll = chosen_nll(policy_chosen_logps, chosen_lengths)
    chosen = log_odds(policy_chosen_logps, chosen_lengths)
    rejected = log_odds(policy_rejected_logps, rejected_lengths)
    or_loss = -F.logsigmoid(chosen - rejected).mean()
    with torch.no_grad():
        stats = {"chosen_rewards": chosen.mean(), "rejected_rewards": rejected.mean(),
                 "margins": (chosen - rejected).mean(), "accuracy": (chosen > rejected).float().mean(),
                 "nll": nll, "or_loss": or_loss}
    return nll + lam * or_loss, {name: value.detach() for name, value in stats.items()}
