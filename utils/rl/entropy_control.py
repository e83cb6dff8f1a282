"""The entropy bonus's coefficient: fixed (--entropy_coef), or steered towards a target entropy (--target_entropy:
Skywork-OR1's adaptive entropy control, He et al. 2025), so that a policy whose answers are collapsing onto one is
pushed back while one that still explores trains as without a bonus.

    after round k, with e_k its mean entropy of the trained answer tokens (nats per token):
        c_{k+1} = clip(c_k + step, 0, max_coef)   if e_k < target
        c_{k+1} = clip(c_k - step, 0, max_coef)   otherwise
    the bonus of round k+1:  c_{k+1} if e_k < target, else 0

c_0 is --entropy_coef (the bonus of the first round, before any measurement). A round that trained nothing
(every group dropped by --filter_zero_variance) measures nothing and leaves the state as it is. The state (the
coefficient and the last entropy) is carried by checkpoints, so a resumed run applies the bonuses the uninterrupted
one would."""
import math


class FixedEntropyCoef:
    """--entropy_coef, the same every round; `update` does nothing. Same interface as AdaptiveEntropyCoef."""

    def __init__(self, coef: float):
        self.value = float(coef)

    @property
    def bonus(self) -> float:
        return self.value

    def update(self, entropy) -> None:
        pass

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state["value"])


class AdaptiveEntropyCoef:
    """The coefficient of the module docstring's rule; `bonus` is the weight of the entropy in the next round's
    actor loss."""

    def __init__(self, initial: float, target: float, step: float, max_coef: float):
        if not target > 0 or not step > 0 or not max_coef >= initial >= 0:
            raise ValueError(f"need target > 0, step > 0 and 0 <= initial <= max_coef, got target={target}, "
                             f"step={step}, initial={initial}, max_coef={max_coef}")
        self.value, self.target, self.step, self.max_coef = float(initial), float(target), float(step), float(max_coef)
        self.entropy = None  # the last round's measured entropy (None before the first)

    @property
    def bonus(self) -> float:
        return self.value if self.entropy is None or self.entropy < self.target else 0.0

    def update(self, entropy) -> None:
        """After a round: `entropy` its mean answer-token entropy, or None when it trained nothing."""
        if entropy is None or not math.isfinite(entropy):
            return
        self.entropy = float(entropy)
        change = self.step if self.entropy < self.target else -self.step
        self.value = min(max(self.value + change, 0.0), self.max_coef)

    def state_dict(self) -> dict:
        return {"value": self.value, "entropy": self.entropy}

    def load_state_dict(self, state: dict) -> None:
        self.value, self.entropy = float(state["value"]), state.get("entropy")


def make_entropy_coef(entropy_coef: float, target_entropy: float = 0.0, step: float = 0.005,
                      max_coef: float = 0.1):
    """Adaptive when a target entropy > 0 is given (starting from entropy_coef), else fixed at entropy_coef."""
    if target_entropy > 0:
        return AdaptiveEntropyCoef(entropy_coef, target_entropy, step, max_coef)
    return FixedEntropyCoef(entropy_coef)
