"""Tests of KTO's loss and KL estimate (utils/rl/kto.py) on values worked out by hand in the comments beside them,
and its gradient against autograd of the formula written out here."""
import math

import pytest
import torch

from utils.rl.kto import kto_kl_estimate, kto_loss


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def close(actual, expected, atol=1e-6):
    torch.testing.assert_close(torch.as_tensor(actual, dtype=torch.float64),
                               torch.as_tensor(expected, dtype=torch.float64), atol=atol, rtol=0)


def test_kto_loss_hand_values_and_gradient():
    # log pi [-1, -3, -2], log ref [-2, -2, -2]: r = [1, -1, 0]; answer 0 desirable, 1 and 2 undesirable;
    # z_0 = 0.5, beta 1, lambda_D 1, lambda_U 2:
    #   answer 0: 1 - sigmoid(1 - 0.5)          = 1 - 0.622459 = 0.377541
    #   answer 1: 2 - 2 sigmoid(0.5 - (-1))     = 2 - 1.635149 = 0.364851
    #   answer 2: 2 - 2 sigmoid(0.5 - 0)        = 2 - 1.244919 = 0.755081     mean 0.499158
    policy = torch.tensor([-1.0, -3.0, -2.0], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([-2.0, -2.0, -2.0], dtype=torch.float64)
    desirable = torch.tensor([True, False, False])
    loss, stats = kto_loss(policy, ref, desirable, 0.5, beta=1.0, desirable_weight=1.0, undesirable_weight=2.0)
    s05, s15 = sigmoid(0.5), sigmoid(1.5)
    close(loss, ((1 - s05) + (2 - 2 * s15) + (2 - 2 * s05)) / 3)
    close(loss, 0.499158, atol=1e-6)
    close(stats["desirable_rewards"], 1.0)
    close(stats["undesirable_rewards"], -0.5)
    close(stats["kl"], 0.5)
    # d/d log pi: desirable -sigma'(0.5), undesirable lambda_U sigma'(z_0 - r), each / 3 answers.
    (grad,) = torch.autograd.grad(loss, policy)
    close(grad, [-s05 * (1 - s05) / 3, 2 * s15 * (1 - s15) / 3, 2 * s05 * (1 - s05) / 3])


def test_kto_beta_scales_the_log_ratio_and_the_reference_point():
    # beta 0.5, r = [2, 2] (one desirable, one undesirable), z_0 = 1: sigmoid(0.5 (2 - 1)) and sigmoid(0.5 (1 - 2)).
    loss, stats = kto_loss(torch.tensor([0.0, 0.0]), torch.tensor([-2.0, -2.0]), torch.tensor([True, False]),
                           torch.tensor(1.0), beta=0.5)
    close(loss, ((1 - sigmoid(0.5)) + (1 - sigmoid(-0.5))) / 2, atol=1e-6)
    close(stats["desirable_rewards"], 1.0)  # beta r
    close(stats["kl"], 1.0)


def test_kto_loss_matches_its_written_formula_on_random_batches():
    generator = torch.Generator().manual_seed(0)
    policy = torch.randn(32, generator=generator, dtype=torch.float64).requires_grad_()
    ref = torch.randn(32, generator=generator, dtype=torch.float64)
    desirable = torch.rand(32, generator=generator) < 0.4
    beta, z_0, lam_d, lam_u = 0.3, 0.2, 1.33, 0.8
    loss, _ = kto_loss(policy, ref, desirable, z_0, beta, lam_d, lam_u)
    terms = [lam_d * (1 - torch.sigmoid(beta * (p - r - z_0))) if d else lam_u * (1 - torch.sigmoid(beta * (z_0 - p + r)))
             for p, r, d in zip(policy, ref, desirable)]
    expected = sum(terms) / len(terms)
    close(loss, expected.detach(), atol=1e-12)
    close(torch.autograd.grad(loss, policy)[0], torch.autograd.grad(expected, policy)[0], atol=1e-12)


def test_a_batch_of_one_kind_has_zero_rewards_for_the_other_and_no_nan():
    loss, stats = kto_loss(torch.tensor([-1.0, -2.0]), torch.tensor([-1.0, -1.0]), torch.tensor([True, True]), 0.0)
    assert stats["undesirable_rewards"].item() == 0.0 and torch.isfinite(loss)
    close(stats["desirable_rewards"], -0.05)  # beta 0.1 x mean(0, -1)
    empty, _ = kto_loss(torch.zeros(0, requires_grad=True), torch.zeros(0), torch.zeros(0, dtype=torch.bool), 0.0)
    assert empty.item() == 0.0


def test_kl_estimate_is_the_clamped_mean_log_ratio_without_gradient():
    # Mismatched log-ratios [1, 0]: mean 0.5. [1, -2]: mean -0.5, clamped to 0.
    policy = torch.tensor([-3.0, -4.0], requires_grad=True)
    z_0 = kto_kl_estimate(policy, torch.tensor([-4.0, -4.0]))
    close(z_0, 0.5)
    assert not z_0.requires_grad
    close(kto_kl_estimate(torch.tensor([-3.0, -6.0]), torch.tensor([-4.0, -4.0])), 0.0)
    # Averaged over ranks before the clamp: here a stand-in that sees another rank's mean of -1.5.
    close(kto_kl_estimate(policy, torch.tensor([-4.0, -4.0]), batch_mean=lambda mean: (mean - 1.5) / 2), 0.0)
    close(kto_kl_estimate(policy, torch.tensor([-4.0, -4.0]), batch_mean=lambda mean: (mean + 1.5) / 2), 1.0)
    close(kto_kl_estimate(torch.zeros(0), torch.zeros(0)), 0.0)


@pytest.mark.parametrize("z_0", [0.0, 2.0])
def test_the_reference_point_raises_the_bar_for_desirable_answers(z_0):
    """A desirable answer at r = 1 loses more against a larger z_0; an undesirable one at r = 1 loses less."""
    d_loss, _ = kto_loss(torch.tensor([0.0]), torch.tensor([-1.0]), torch.tensor([True]), z_0, beta=1.0)
    u_loss, _ = kto_loss(torch.tensor([0.0]), torch.tensor([-1.0]), torch.tensor([False]), z_0, beta=1.0)
    close(d_loss, 1 - sigmoid(1 - z_0))
    close(u_loss, 1 - sigmoid(z_0 - 1))
