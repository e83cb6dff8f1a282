"""The registry of preference losses (DPO's `--loss_type`): one row each, from which the flag's choices and help,
whether DPO builds a frozen reference, which losses take --label_smoothing, and the dispatch are derived.

A new preference loss is its function (in `utils/rl/losses.py` or a module of its own) and one row here:

    PREFERENCE_LOSSES["my_loss"] = PreferenceLoss(my_loss, help="...", needs_reference=True)

where `my_loss(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_lengths,
rejected_lengths, settings)` returns (loss, stats) as the preference losses of `utils/rl/losses.py` do: sequence
log-probs (B,) of pair i at index i, the reference's None for a row without a reference, the answers' token counts
(EOS in), and `settings` DPO's parsed flags (beta, label_smoothing, simpo_gamma).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from utils.rl.losses import dpo_loss, ipo_loss, simpo_loss
from utils.rl.orpo import orpo_loss


@dataclass(frozen=True)
class PreferenceLoss:
    """How a policy learns from a chosen/rejected pair."""
    loss: Callable  # (policy_chosen, policy_rejected, ref_chosen, ref_rejected, chosen_lengths, rejected_lengths,
    # settings) -> (loss, stats)
    help: str  # one phrase for --loss_type's help
    needs_reference: bool = True  # compares with a frozen reference's log-probs: DPO loads one (or precomputes them)
    label_smoothing: bool = False  # takes --label_smoothing (the probability that a preference label is wrong)


def _sigmoid(policy_chosen, policy_rejected, ref_chosen, ref_rejected, chosen_lengths, rejected_lengths, settings):
    return dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, settings.beta,
                    settings.label_smoothing)


def _ipo(policy_chosen, policy_rejected, ref_chosen, ref_rejected, chosen_lengths, rejected_lengths, settings):
    return ipo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, settings.beta)


def _simpo(policy_chosen, policy_rejected, ref_chosen, ref_rejected, chosen_lengths, rejected_lengths, settings):
    return simpo_loss(policy_chosen, policy_rejected, chosen_lengths, rejected_lengths, settings.beta,
                      settings.simpo_gamma, settings.label_smoothing)


def _orpo(policy_chosen, policy_rejected, ref_chosen, ref_rejected, chosen_lengths, rejected_lengths, settings):
    return orpo_loss(policy_chosen, policy_rejected, chosen_lengths, rejected_lengths, settings.beta)


PREFERENCE_LOSSES = {
    "sigmoid": PreferenceLoss(_sigmoid, "DPO, -log sigmoid(beta x the log-ratio margin)", label_smoothing=True),
    "ipo": PreferenceLoss(_ipo, "IPO's squared loss, (log-ratio margin - 1 / (2 beta))^2"),
    "simpo": PreferenceLoss(_simpo, "SimPO, length-normalised log-probs with a target margin --simpo_gamma, "
                                    "reference-free", needs_reference=False, label_smoothing=True),
    "orpo": PreferenceLoss(_orpo, "ORPO, the chosen answers' NLL + beta x -log sigmoid(log-odds margin) of the "
                                  "length-normalised likelihoods, reference-free: trains a base model, no step 1",
                           needs_reference=False),
}


def preference_loss(loss_type, policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps,
                    chosen_lengths, rejected_lengths, settings):
    """The loss and stats of the PREFERENCE_LOSSES row `loss_type` on one batch of pairs; `settings` holds the
    flags the loss reads (beta, label_smoothing, simpo_gamma). Unknown loss_type: ValueError."""
    if loss_type not in PREFERENCE_LOSSES:
        raise ValueError(f"unknown preference loss {loss_type!r}; expected one of {tuple(PREFERENCE_LOSSES)}")
    return PREFERENCE_LOSSES[loss_type].loss(policy_chosen_logps, policy_rejected_logps, ref_chosen_logps,
                                              ref_rejected_logps, chosen_lengths, rejected_lengths, settings)
