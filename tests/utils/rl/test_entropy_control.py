"""The entropy bonus's coefficient (utils/rl/entropy_control.py), on values worked out by hand."""
import math

import pytest

from utils.rl.entropy_control import AdaptiveEntropyCoef, FixedEntropyCoef, make_entropy_coef


def test_the_adaptive_coefficient_follows_the_rule_round_by_round():
    """Target 0.2, step 0.005, at most 0.012, from 0: the coefficient rises while the entropy is below the target,
    falls (not below 0) otherwise, and is the bonus only after a round below the target; a round that trained
    nothing (None) or measured NaN changes nothing."""
    coef = AdaptiveEntropyCoef(0.0, target=0.2, step=0.005, max_coef=0.012)
    assert coef.bonus == 0.0  # the first round: --entropy_coef, here 0
    seen = []
    for entropy in (0.5, 0.1, 0.1, 0.1, 0.3, None, math.nan, 0.1):
        coef.update(entropy)
        seen.append((round(coef.value, 6), round(coef.bonus, 6)))
    assert seen == [(0.0, 0.0),        # 0.5 >= 0.2: down, floored at 0; no bonus
                    (0.005, 0.005),    # 0.1 < 0.2: up
                    (0.01, 0.01),
                    (0.012, 0.012),    # capped at max_coef
                    (0.007, 0.0),      # 0.3: down, and no bonus while above the target
                    (0.007, 0.0),      # nothing trained: as it was
                    (0.007, 0.0),      # NaN: as it was
                    (0.012, 0.012)]    # 0.1: up again, capped


def test_the_first_round_takes_the_starting_coefficient_and_the_state_round_trips():
    coef = AdaptiveEntropyCoef(0.02, target=0.3, step=0.01, max_coef=0.1)
    assert coef.bonus == 0.02
    coef.update(0.1)
    again = AdaptiveEntropyCoef(0.0, target=0.3, step=0.01, max_coef=0.1)
    again.load_state_dict(coef.state_dict())
    assert (again.value, again.entropy, again.bonus) == (pytest.approx(0.03), 0.1, pytest.approx(0.03))


def test_fixed_coefficient_and_the_factory():
    fixed = make_entropy_coef(0.02)
    assert isinstance(fixed, FixedEntropyCoef) and fixed.bonus == 0.02
    fixed.update(0.0)
    assert fixed.bonus == 0.02
    adaptive = make_entropy_coef(0.0, target_entropy=0.2, step=0.005, max_coef=0.1)
    assert isinstance(adaptive, AdaptiveEntropyCoef) and (adaptive.target, adaptive.step) == (0.2, 0.005)


@pytest.mark.parametrize("initial, target, step, max_coef", [
    (0.0, 0.0, 0.005, 0.1), (0.0, 0.2, 0.0, 0.1), (0.2, 0.2, 0.005, 0.1), (-0.1, 0.2, 0.005, 0.1)])
def test_an_adaptive_coefficient_refuses_settings_it_cannot_follow(initial, target, step, max_coef):
    with pytest.raises(ValueError):
        AdaptiveEntropyCoef(initial, target, step, max_coef)
