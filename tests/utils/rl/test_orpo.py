"""Tests of ORPO's loss (utils/rl/orpo.py) on values worked out by hand in the comments beside them, its gradient
against the derivative written out here, the log odds at the ends of (0, 1), and its PREFERENCE_LOSSES row in DPO."""
import math

import pytest
import torch

from training.step2_dpo_finetuning import main as dpo
from utils.rl.orpo import MAX_MEAN_LOGP, log1mexp, log_odds, orpo_loss
from utils.rl.preference_losses import PREFERENCE_LOSSES


def close(actual, expected, atol=1e-6):
    torch.testing.assert_close(torch.as_tensor(actual, dtype=torch.float64),
                               torch.as_tensor(expected, dtype=torch.float64), atol=atol, rtol=0)


# Chosen: log pi = -0.6 over 3 tokens, mean -0.2, p = e^-0.2 = 0.818731, log odds = -0.2 - ln(0.181269) = 1.507772.
# Rejected: log pi = -2 over 2 tokens, mean -1, p = e^-1 = 0.367879, log odds = -1 - ln(0.632121) = -0.541325.
P_W, P_L = math.exp(-0.2), math.exp(-1.0)
ODDS_W, ODDS_L = -0.2 - math.log(1 - P_W), -1.0 - math.log(1 - P_L)


def test_log_odds_hand_values():
    close(log_odds(torch.tensor([-0.6, -2.0]), torch.tensor([3, 2])), [ODDS_W, ODDS_L])
    close(ODDS_W, 1.507772)
    close(ODDS_L, -0.541325)
    # p = 1/2 (mean log-prob ln 1/2) is even odds: log odds 0.
    close(log_odds(torch.tensor([2 * math.log(0.5)]), torch.tensor([2])), [0.0])


def test_orpo_hand_values_and_gradient():
    # Margin 1.507772 + 0.541325 = 2.049097; or_loss = ln(1 + e^-2.049097) = ln 1.128851 = 0.121201;
    # nll = 0.6 / 3 = 0.2; lambda 0.5: loss = 0.2 + 0.5 x 0.121201 = 0.260600.
    chosen = torch.tensor([-0.6], dtype=torch.float64, requires_grad=True)
    rejected = torch.tensor([-2.0], dtype=torch.float64, requires_grad=True)
    loss, stats = orpo_loss(chosen, rejected, torch.tensor([3]), torch.tensor([2]), lam=0.5)
    margin = ODDS_W - ODDS_L
    or_loss = math.log1p(math.exp(-margin))
    close(loss, 0.2 + 0.5 * or_loss)
    close(loss, 0.260600)
    close(stats["or_loss"], or_loss)
    close(stats["nll"], 0.2)
    close(stats["margins"], margin)
    assert stats["accuracy"].item() == 1.0
    # d log odds / d log pi(y) = (1 / |y|) / (1 - p); d or_loss / d margin = -(1 - sigmoid(margin)).
    grad_w, grad_l = torch.autograd.grad(loss, (chosen, rejected))
    push = 1 - 1 / (1 + math.exp(-margin))
    close(grad_w, [-1 / 3 - 0.5 * push / (3 * (1 - P_W))])
    close(grad_l, [0.5 * push / (2 * (1 - P_L))])


def test_orpo_is_the_mean_over_pairs():
    chosen, rejected = torch.tensor([-0.6, -1.0]), torch.tensor([-2.0, -0.5])
    lengths = torch.tensor([3, 2]), torch.tensor([2, 1])
    loss, stats = orpo_loss(chosen, rejected, *lengths, lam=1.0)
    parts = [orpo_loss(chosen[i:i + 1], rejected[i:i + 1], lengths[0][i:i + 1], lengths[1][i:i + 1], 1.0)[0]
             for i in range(2)]
    close(loss, sum(parts) / 2)
    assert stats["accuracy"].item() == 0.5  # pair 1: mean log-prob -0.5 against -0.5: not strictly higher


def test_log1mexp_is_accurate_and_finite_at_both_ends():
    x = torch.tensor([-1e-9, -1e-6, -0.5, -math.log(2.0), -1.0, -40.0], dtype=torch.float64, requires_grad=True)
    expected = [math.log(-math.expm1(v)) for v in x.tolist()]
    close(log1mexp(x), expected, atol=1e-9)
    (grad,) = torch.autograd.grad(log1mexp(x).sum(), x)
    assert torch.isfinite(grad).all()


def test_a_certain_answer_has_finite_odds_and_no_nan_gradient():
    """log pi = 0 (p = 1: infinite odds) is capped at MAX_MEAN_LOGP: finite loss, gradient 0 through the cap."""
    chosen = torch.tensor([0.0, -1e-9], requires_grad=True)
    loss, _ = orpo_loss(chosen, torch.tensor([-3.0, -3.0]), torch.tensor([2, 2]), torch.tensor([2, 2]), lam=1.0)
    (grad,) = torch.autograd.grad(loss, chosen)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    cap = MAX_MEAN_LOGP - math.log(-math.expm1(MAX_MEAN_LOGP))
    close(log_odds(torch.tensor([0.0]), torch.tensor([1])), [cap], atol=1e-3)


def test_orpo_is_dpos_reference_free_loss_type_with_beta_as_lambda(monkeypatch):
    assert not PREFERENCE_LOSSES["orpo"].needs_reference
    args = dpo.parse_args(["--output_dir", "unused", "--loss_type", "orpo", "--beta", "0.5"])
    assert not dpo.uses_reference(args)
    logps = torch.tensor([-0.6, -2.0])  # one pair: the chosen row, then the rejected row
    monkeypatch.setattr(dpo, "answer_logps", lambda engine, batch: logps)
    batch = {"answer_mask": torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0]])}  # 3 and 2 answer tokens
    loss, stats = dpo.preference_batch_loss(None, None, batch, args)
    assert loss.item() == pytest.approx(0.260600, abs=1e-6) and stats["nll"].item() == pytest.approx(0.2)
