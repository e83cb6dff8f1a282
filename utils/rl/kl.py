"""KL between the policy and the frozen reference: per-token estimators and the coefficient controllers.

The estimators are a registry, KL_ESTIMATORS, from which --kl_estimator's and --kl_loss_estimator's choices and
help and `kl_penalty`'s dispatch are derived. A new estimator is one function of r = log(pi_ref / pi) and one row:

    KL_ESTIMATORS["my_kl"] = KLEstimator(my_kl, help="...")
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class KLEstimator:
    """A per-token estimate of KL(pi || pi_ref) from r = ref_logprobs - logprobs at tokens sampled from pi."""
    estimate: Callable  # r (any shape) -> the per-token estimate, elementwise
    help: str  # one phrase for the flags' help


def _k1(r: torch.Tensor) -> torch.Tensor:
    """k1 = -r = logprobs - ref_logprobs."""
    return -r


def _k2(r: torch.Tensor) -> torch.Tensor:
    """k2 = r^2 / 2."""
    return 0.5 * r**2


def _k3(r: torch.Tensor) -> torch.Tensor:
    """k3 = exp(r) - 1 - r, computed exactly (no clamping of r)."""
    return torch.expm1(r) - r


KL_ESTIMATORS = {
    "k1": KLEstimator(_k1, "log-prob difference, unbiased, can be negative per token"),
    "k2": KLEstimator(_k2, "half the squared log-ratio, biased, never negative"),
    "k3": KLEstimator(_k3, "exp(r) - 1 - r, unbiased and never negative"),
}


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k1") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from tokens sampled from pi (Schulman 2020), by the KL_ESTIMATORS row
    `estimator`.

    With r = ref_logprobs - logprobs = log(pi_ref / pi) at the sampled token:
        k1 = -r               = logprobs - ref_logprobs   unbiased, can be negative per token
        k2 = r^2 / 2                                       biased, >= 0, low variance
        k3 = exp(r) - 1 - r                                unbiased, >= 0 (since e^r >= 1 + r), low variance

    Elementwise, any shape. Unknown estimator -> ValueError. k3 is computed exactly (no clamping of r), so a
    huge log-ratio (r > ~88 in float32) overflows to inf.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {estimator!r}; expected one of {tuple(KL_ESTIMATORS)}")
    return KL_ESTIMATORS[estimator].estimate(ref_logprobs - logprobs)


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


def make_kl_controller(kl_coef: float, adaptive_kl_target: float = 0.0, adaptive_kl_horizon: float = 10000):
    """Adaptive (Ziegler et al.) when a target KL > 0 is given, else fixed at kl_coef."""
    if adaptive_kl_target > 0:
        return AdaptiveKLController(kl_coef, adaptive_kl_target, adaptive_kl_horizon)
    return FixedKLController(kl_coef)


def uses_reference(args) -> bool:
    """Whether step 3 with these flags has a KL term (in the reward, --kl_coef or its adaptive controller; or as a
    loss, --use_kl_loss) and so needs the frozen reference model. Without one no reference is made or run, as
    OpenRLHF and verl make none at a KL coefficient of 0: a forward pass a round and a model's memory saved, and no
    KL to the reference logged."""
    return args.kl_coef > 0 or args.adaptive_kl_target > 0 or args.use_kl_loss
