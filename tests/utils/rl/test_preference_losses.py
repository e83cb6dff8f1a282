"""The preference losses (utils/rl/losses.py: DPO with label smoothing, IPO, SimPO; dispatched by the registry of
utils/rl/preference_losses.py) and answer log-probs (utils/rl/tokens.py `sequence_logprobs`) on values worked out by
hand in the comments beside them."""
import math
from types import SimpleNamespace

import pytest
import torch

from utils.rl.losses import chosen_nll, dpo_loss, ipo_loss, simpo_loss
from utils.rl.preference_losses import PREFERENCE_LOSSES, preference_loss
from utils.rl.tokens import sequence_logprobs


def softplus(x):
    """log(1 + e^x) = -log sigmoid(-x)."""
    return math.log1p(math.exp(x))


def t(*values):
    return torch.tensor(values, dtype=torch.float64)


# One pair: log pi(chosen) = -1, log pi(rejected) = -3, log ref of both = -2.
# Log-ratios: chosen -1 - (-2) = 1, rejected -3 - (-2) = -1; margin h = 2.
PAIR = (t(-1.0), t(-3.0), t(-2.0), t(-2.0))


@pytest.mark.parametrize("beta, expected_loss", [
    (0.5, softplus(-1.0)),   # rewards 0.5 and -0.5: -log sigmoid(1) = log(1 + e^-1) = 0.31326
    (1.0, softplus(-2.0)),   # rewards 1 and -1:     -log sigmoid(2) = log(1 + e^-2) = 0.12693
])
def test_dpo_loss_and_rewards_scale_with_beta(beta, expected_loss):
    loss, stats = dpo_loss(*PAIR, beta=beta)
    assert loss.item() == pytest.approx(expected_loss, abs=1e-7)
    assert stats["chosen_rewards"].item() == pytest.approx(beta * 1.0)
    assert stats["rejected_rewards"].item() == pytest.approx(beta * -1.0)
    assert stats["margins"].item() == pytest.approx(beta * 2.0)
    assert stats["accuracy"].item() == 1.0


def test_dpo_label_smoothing_hand_worked():
    # beta 0.5, margin of rewards 1, eps 0.1:
    #   0.9 * -log sigmoid(1) + 0.1 * -log sigmoid(-1) = 0.9 log(1 + e^-1) + 0.1 log(1 + e)
    #   and log(1 + e) = 1 + log(1 + e^-1), so the loss is log(1 + e^-1) + 0.1 = 0.41326.
    loss, _ = dpo_loss(*PAIR, beta=0.5, label_smoothing=0.1)
    assert loss.item() == pytest.approx(softplus(-1.0) + 0.1, abs=1e-7)
    # Conservative DPO's minimum is at the finite reward margin log((1 - eps) / eps) = log 9: the gradient of the
    # loss in the margin vanishes there (plain DPO's never does).
    margin = torch.tensor([math.log(9.0)], dtype=torch.float64, requires_grad=True)
    loss, _ = dpo_loss(margin, t(0.0), t(0.0), t(0.0), beta=1.0, label_smoothing=0.1)
    (grad,) = torch.autograd.grad(loss, margin)
    assert grad.item() == pytest.approx(0.0, abs=1e-6)  # computed in float32
    loss, _ = dpo_loss(margin, t(0.0), t(0.0), t(0.0), beta=1.0)
    (grad,) = torch.autograd.grad(loss, margin)
    assert grad.item() == pytest.approx(-0.1, abs=1e-6)  # -sigmoid(-log 9) = -1/10


def test_dpo_loss_is_a_mean_over_pairs_and_counts_ties_as_wrong():
    # Pair 1 as PAIR (beta 1: loss log(1 + e^-2)); pair 2 with policy = reference: margin 0, loss log 2, a tie.
    loss, stats = dpo_loss(t(-1.0, -5.0), t(-3.0, -6.0), t(-2.0, -5.0), t(-2.0, -6.0), beta=1.0)
    assert loss.item() == pytest.approx((softplus(-2.0) + math.log(2.0)) / 2, abs=1e-7)
    assert stats["accuracy"].item() == 0.5
    assert stats["margins"].item() == pytest.approx(1.0)


@pytest.mark.parametrize("beta, expected_loss", [
    (0.5, 1.0),     # target 1 / (2 * 0.5) = 1: (2 - 1)^2 = 1
    (0.25, 0.0),    # target 2: h is there already
    (1.0, 2.25),    # target 0.5: (2 - 0.5)^2 = 2.25
])
def test_ipo_loss_is_the_square_of_the_distance_to_one_over_two_beta(beta, expected_loss):
    loss, stats = ipo_loss(*PAIR, beta=beta)
    assert loss.item() == pytest.approx(expected_loss, abs=1e-12)
    assert stats["margins"].item() == pytest.approx(2.0 * beta)


def test_ipo_pulls_a_margin_past_its_target_back():
    # h = 2 against a target of 0.5 (beta 1): d/dh (h - 0.5)^2 = 2 * 1.5 = 3 > 0, so descent lowers log pi(chosen).
    chosen = t(-1.0).requires_grad_()
    loss, _ = ipo_loss(chosen, t(-3.0), t(-2.0), t(-2.0), beta=1.0)
    (grad,) = torch.autograd.grad(loss, chosen)
    assert grad.item() == pytest.approx(3.0)


def test_simpo_normalises_by_length_and_needs_no_reference():
    # Chosen: log-prob -4 over 8 tokens (-0.5 a token); rejected: -3 over 2 tokens (-1.5 a token). Summed, the
    # rejected answer is the likelier; per token, the chosen one. beta 2: r_w = -1, r_l = -3; gamma 0.5:
    # loss = -log sigmoid(-1 + 3 - 0.5) = log(1 + e^-1.5) = 0.20141.
    loss, stats = simpo_loss(t(-4.0), t(-3.0), t(8.0), t(2.0), beta=2.0, gamma=0.5)
    assert loss.item() == pytest.approx(softplus(-1.5), abs=1e-7)
    assert stats["chosen_rewards"].item() == pytest.approx(-1.0)
    assert stats["rejected_rewards"].item() == pytest.approx(-3.0)
    assert stats["margins"].item() == pytest.approx(2.0)  # gamma is not part of the reported margin
    assert stats["accuracy"].item() == 1.0
    # gamma 0 and eps 0.2: 0.8 log(1 + e^-2) + 0.2 log(1 + e^2).
    loss, _ = simpo_loss(t(-4.0), t(-3.0), t(8.0), t(2.0), beta=2.0, gamma=0.0, label_smoothing=0.2)
    assert loss.item() == pytest.approx(0.8 * softplus(-2.0) + 0.2 * softplus(2.0), abs=1e-7)
    # The same log-probs over equal lengths: summed and normalised agree, and the rejected answer wins.
    _, stats = simpo_loss(t(-4.0), t(-3.0), t(2.0), t(2.0), beta=2.0, gamma=0.5)
    assert stats["accuracy"].item() == 0.0


@pytest.mark.parametrize("loss_type, label_smoothing", [("sigmoid", 0.0), ("sigmoid", 0.2), ("ipo", 0.0),
                                                        ("simpo", 0.0), ("simpo", 0.2)])
def test_no_gradient_when_chosen_and_rejected_are_the_same_answer(loss_type, label_smoothing):
    """An answer paired with itself carries no preference: the loss is flat in the policy's log-probs."""
    logps = t(-2.0, -7.5, -0.3).requires_grad_()
    ref = t(-2.5, -7.0, -0.1)
    lengths = t(3.0, 5.0, 1.0)
    settings = SimpleNamespace(beta=0.7, label_smoothing=label_smoothing, simpo_gamma=0.5)
    loss, stats = preference_loss(loss_type, logps, logps, ref, ref, lengths, lengths, settings)
    (grad,) = torch.autograd.grad(loss, logps)
    assert torch.count_nonzero(grad) == 0
    assert stats["margins"].item() == 0.0 and stats["accuracy"].item() == 0.0
    assert torch.isfinite(loss)


def test_dpo_gradient_raises_chosen_and_lowers_rejected():
    chosen, rejected = t(-2.0).requires_grad_(), t(-2.0).requires_grad_()
    loss, _ = dpo_loss(chosen, rejected, t(-2.0), t(-2.0), beta=0.5)
    grad_chosen, grad_rejected = torch.autograd.grad(loss, [chosen, rejected])
    # At margin 0: d/dr_w -log sigmoid(r_w - r_l) = -1/2, times beta 0.5.
    assert grad_chosen.item() == pytest.approx(-0.25) and grad_rejected.item() == pytest.approx(0.25)


def test_stats_are_detached():
    chosen = t(-1.0).requires_grad_()
    for _, stats in (dpo_loss(chosen, t(-3.0), t(-2.0), t(-2.0)), ipo_loss(chosen, t(-3.0), t(-2.0), t(-2.0)),
                     simpo_loss(chosen, t(-3.0), t(1.0), t(1.0))):
        assert not any(value.requires_grad for value in stats.values())


def test_unknown_loss_type():
    with pytest.raises(ValueError, match="unknown preference loss 'kto'"):
        preference_loss("kto", t(0.0), t(0.0), t(0.0), t(0.0), t(1.0), t(1.0), SimpleNamespace(beta=0.1))


@pytest.mark.parametrize("loss_type, expected", [
    ("sigmoid", softplus(-1.0) + 0.1),  # = test_dpo_label_smoothing_hand_worked (beta 0.5, eps 0.1)
    ("ipo", 1.0),                       # = the IPO case beta 0.5: (2 - 1)^2
    # SimPO on PAIR's log-probs over 2 and 1 tokens, beta 0.5: r_w = 0.5 * -1/2 = -0.25, r_l = 0.5 * -3 = -1.5;
    # z = 1.25 - gamma 0.25 = 1; eps 0.1: 0.9 log(1 + e^-1) + 0.1 log(1 + e) = log(1 + e^-1) + 0.1.
    ("simpo", softplus(-1.0) + 0.1),
])
def test_each_registry_row_passes_the_flags_its_loss_takes(loss_type, expected):
    """The row reads beta, label_smoothing (where the loss takes it: IPO does not) and simpo_gamma from the
    settings, and the reference log-probs only where it needs a reference."""
    settings = SimpleNamespace(beta=0.5, label_smoothing=0.1 if PREFERENCE_LOSSES[loss_type].label_smoothing else 0.0,
                               simpo_gamma=0.25)
    chosen, rejected, ref_chosen, ref_rejected = PAIR
    if not PREFERENCE_LOSSES[loss_type].needs_reference:
        ref_chosen = ref_rejected = None
    loss, _ = preference_loss(loss_type, chosen, rejected, ref_chosen, ref_rejected, t(2.0), t(1.0), settings)
    assert loss.item() == pytest.approx(expected, abs=1e-7)


def test_the_rows_say_which_losses_need_a_reference_and_take_label_smoothing():
    assert {name for name, row in PREFERENCE_LOSSES.items() if not row.needs_reference} == {"simpo", "orpo"}
    assert {name for name, row in PREFERENCE_LOSSES.items() if row.label_smoothing} == {"sigmoid", "simpo"}


def test_sequence_logprobs_sum_answer_labels_only():
    # Vocabulary of 2; logits [0, ln 3] at every position: p(1) = 3/4, p(0) = 1/4.
    # Row 0: tokens [0, 1, 1, 0], answer labels at t = 1, 2 (tokens 1 and 0): log 3/4 + log 1/4.
    # Row 1: tokens [1, 0, 1, 1] with one pad at the end: answer label at t = 1 only (token 1): log 3/4.
    logits = torch.tensor([0.0, math.log(3.0)]).expand(2, 4, 2)
    input_ids = torch.tensor([[0, 1, 1, 0], [1, 0, 1, 1]])
    answer_mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    result = sequence_logprobs(logits, input_ids, answer_mask)
    assert result.tolist() == pytest.approx([math.log(0.75) + math.log(0.25), math.log(0.75)])
    with pytest.raises(ValueError, match="must be"):
        sequence_logprobs(logits, input_ids, answer_mask[:, :2])


def test_chosen_nll_is_the_per_token_mean_over_pairs_hand_worked():
    """RPO's term: -(-4 / 2) and -(-3 / 3) -> (2 + 1) / 2 = 1.5; its gradient raises the chosen log-probs."""
    logps = torch.tensor([-4.0, -3.0], requires_grad=True)
    nll = chosen_nll(logps, torch.tensor([2, 3]))
    assert nll.item() == pytest.approx(1.5)
    nll.backward()
    torch.testing.assert_close(logps.grad, torch.tensor([-0.25, -1 / 6]))
