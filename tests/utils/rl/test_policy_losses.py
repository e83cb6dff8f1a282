"""Tests of the policy losses of utils/rl/policy_losses.py beyond PPO's: GSPO's sequence-level ratio on values worked
out by hand in the comments beside them, its gradient against autograd of the paper's formula written out here and
against verl's token form, and Dr. GRPO's unbiased aggregation as --loss_agg_mode seq_mean_token_sum with
--no_std_normalization."""
import math
from types import SimpleNamespace

import pytest
import torch

from training.step3_rlhf_finetuning.arguments import parse_args as step3_args
from utils.rl.estimators import ESTIMATORS
from utils.rl.losses import policy_loss
from utils.rl.policy_losses import POLICY_LOSSES, gspo_loss
from utils.trainer.ppo_trainer import PPOTrainer

LN2 = math.log(2.0)


def close(actual, expected, atol=1e-6):
    torch.testing.assert_close(torch.as_tensor(actual, dtype=torch.float64),
                               torch.as_tensor(expected, dtype=torch.float64), atol=atol, rtol=0)


def t(*rows):
    return torch.tensor(rows, dtype=torch.float64)


# Four answers, old log-probs 0, clip ranges 0.2 / 0.28 (readable numbers; GSPO's own are ~1e-4):
#   row 0: log-ratios [ln 2, 0], A = +1:  s = exp(ln 2 / 2) = sqrt 2 = 1.41421;  max(-1.41421, -1.28) = -1.28 (clipped)
#   row 1: log-ratios [ln 0.9] x 3, A = -1:  s = 0.9;  max(0.9, 0.9) = 0.9
#   row 2: log-ratio [ln 1.1], A = +2:  s = 1.1;  max(-2.2, -2.2) = -2.2
#   row 3: no real token: counts for nothing
LOGPROBS = t([LN2, 0.0, 0.0], [math.log(0.9)] * 3, [math.log(1.1), 0.0, 0.0], [5.0, 5.0, 5.0])
ADVANTAGES = t([1.0, 1.0, 0.0], [-1.0, -1.0, -1.0], [2.0, 0.0, 0.0], [3.0, 3.0, 3.0])
MASK = t([1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0])


def test_gspo_hand_values_stats_and_gradient():
    logprobs = LOGPROBS.clone().requires_grad_()
    loss, stats = gspo_loss(logprobs, torch.zeros(4, 3, dtype=torch.float64), ADVANTAGES, MASK, 0.2, 0.28)
    close(loss, (-1.28 + 0.9 - 2.2) / 3)  # seq_mean_token_mean: the mean over the three answers, -0.86
    close(stats["clipfrac"], 1 / 3)
    close(stats["ratio_mean"], (math.sqrt(2.0) + 0.9 + 1.1) / 3)
    close(stats["approx_kl"], (0.5 * LN2**2 + 3 * 0.5 * math.log(0.9) ** 2 + 0.5 * math.log(1.1) ** 2) / 6)
    # d l_i / d logprobs_it = -A_i s_i / |y_i| where unclipped: row 1 0.9 / 3 = 0.3, row 2 -2.2; over 3 answers.
    (grad,) = torch.autograd.grad(loss, logprobs)
    close(grad, [[0.0, 0.0, 0.0], [0.1, 0.1, 0.1], [-2.2 / 3, 0.0, 0.0], [0.0, 0.0, 0.0]])
    # token_mean weighs each answer's l_i by its tokens: (2 x -1.28 + 3 x 0.9 - 2.2) / 6.
    token_mean, _ = gspo_loss(LOGPROBS, torch.zeros(4, 3), ADVANTAGES, MASK, 0.2, 0.28, "token_mean")
    close(token_mean, (2 * -1.28 + 3 * 0.9 - 2.2) / 6)


def test_gspo_clips_the_answer_not_its_tokens():
    """One token far off (ratio 2) and one below 1 average to s = sqrt(2 x 0.5) = 1: the answer is inside GSPO's
    small range and every token gets the gradient, where PPO's per-token clip zeroes the first token's."""
    logprobs = t([LN2, math.log(0.5)]).requires_grad_()
    old, advantages, mask = torch.zeros(1, 2, dtype=torch.float64), t([1.0, 1.0]), t([1.0, 1.0])
    loss, stats = gspo_loss(logprobs, old, advantages, mask, 3e-4, 4e-4)
    close(loss, -1.0)
    assert stats["clipfrac"].item() == 0.0
    (grad,) = torch.autograd.grad(loss, logprobs)
    close(grad, [[-0.5, -0.5]])
    ppo, ppo_stats = policy_loss(logprobs, old, advantages, mask, 0.2)
    (ppo_grad,) = torch.autograd.grad(ppo, logprobs)
    assert ppo_stats["clipfrac"].item() == 0.5 and ppo_grad[0, 0].item() == 0.0
    # Past 1 + 4e-4 the whole answer is clipped: no gradient on any of its tokens.
    pushed = torch.full((1, 2), 1e-3, dtype=torch.float64, requires_grad=True)
    loss, stats = gspo_loss(pushed, old, advantages, mask, 3e-4, 4e-4)
    close(loss, -(1 + 4e-4))
    assert stats["clipfrac"].item() == 1.0 and not torch.autograd.grad(loss, pushed)[0].any()


def paper_objective(logprobs, old_logprobs, advantages, mask, low, high):
    """GSPO's objective as the paper writes it, answer by answer in plain Python: -1/G sum_i min(s_i A_i,
    clip(s_i, 1 - low, 1 + high) A_i) with s_i = (pi / pi_old)^(1 / |y_i|), over the answers with tokens."""
    terms = []
    for row in range(logprobs.shape[0]):
        tokens = [t for t in range(logprobs.shape[1]) if mask[row, t] > 0]
        if not tokens:
            continue
        log_ratio = sum(logprobs[row, t] - old_logprobs[row, t] for t in tokens) / len(tokens)
        ratio = torch.exp(log_ratio)
        advantage = advantages[row, tokens[0]]
        terms.append(torch.minimum(ratio * advantage, ratio.clamp(1 - low, 1 + high) * advantage))
    return -sum(terms) / len(terms)


def verl_token_form(logprobs, old_logprobs, advantages, mask, low, high):
    """verl's GSPO-token: s_it = sg[s_i] pi(y_it) / sg[pi(y_it)] on every token, PPO's clip per token, then the mean
    over each answer's tokens and over answers. Same value as GSPO; with one advantage per answer, same gradient."""
    lengths = mask.sum(1).clamp(min=1)
    seq_log_ratio = ((logprobs - old_logprobs) * mask).sum(1) / lengths
    ratio = torch.exp(logprobs - logprobs.detach() + seq_log_ratio.detach().unsqueeze(1))
    losses = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(1 - low, 1 + high))
    per_answer = (losses * mask).sum(1) / lengths
    answered = (mask.sum(1) > 0).double()
    return (per_answer * answered).sum() / answered.sum()


@pytest.mark.parametrize("low, high", [(3e-4, 4e-4), (0.05, 0.1)])
def test_gspo_value_and_gradient_match_the_papers_formula_and_verls_token_form(low, high):
    generator = torch.Generator().manual_seed(0)
    rows, width = 16, 6
    old = -torch.rand(rows, width, generator=generator, dtype=torch.float64) * 3
    noise = torch.randn(rows, width, generator=generator, dtype=torch.float64) * 5 * high  # ratios either side
    logprobs = (old + noise).requires_grad_()
    lengths = torch.randint(1, width + 1, (rows,), generator=generator)
    mask = (torch.arange(width) < lengths.unsqueeze(1)).double()
    mask[3] = 0.0  # a row without a real token
    advantages = torch.randn(rows, 1, generator=generator, dtype=torch.float64).expand(rows, width) * mask
    loss, stats = gspo_loss(logprobs, old, advantages, mask, low, high)
    assert 0.0 < stats["clipfrac"].item() < 1.0  # both branches of the clip are exercised
    (grad,) = torch.autograd.grad(loss, logprobs)
    for reference in (paper_objective, verl_token_form):
        expected = reference(logprobs, old, advantages, mask, low, high)
        (expected_grad,) = torch.autograd.grad(expected, logprobs)
        close(loss, expected.detach(), atol=1e-12)
        close(grad, expected_grad, atol=1e-12)


def test_gspo_of_one_token_answers_is_ppo():
    """With one token an answer's ratio is its token's: GSPO is PPO's per-token loss."""
    logprobs = t([math.log(1.25)], [math.log(1.4)], [math.log(0.7)], [math.log(1.4)]).requires_grad_()
    old, mask, advantages = torch.zeros(4, 1, dtype=torch.float64), torch.ones(4, 1), t([1.0], [1.0], [-1.0], [-1.0])
    gspo, gspo_stats = gspo_loss(logprobs, old, advantages, mask, 0.2, 0.28)
    ppo, ppo_stats = policy_loss(logprobs, old, advantages, mask, 0.2, 0.2, 0.28)
    close(gspo, ppo.detach())
    close(gspo_stats["clipfrac"], ppo_stats["clipfrac"])
    close(torch.autograd.grad(gspo, logprobs)[0], torch.autograd.grad(ppo, logprobs)[0])


def test_gspo_row_is_a_flag_choice_with_the_clip_flags_and_the_trainer_calls_it():
    argv = ["--actor_model_name_or_path", "tiny", "--output_dir", "unused", "--reward_fn", "builtin",
            "--advantage_estimator", "grpo", "--num_samples_per_prompt", "2", "--policy_loss", "gspo",
            "--cliprange_low", "0.2", "--cliprange_high", "0.28", "--loss_agg_mode", "seq_mean_token_mean"]
    args = step3_args(argv)
    minibatch = SimpleNamespace(logprobs=torch.zeros(4, 3, dtype=torch.float64), advantages=ADVANTAGES,
                                positive=None)
    loss, stats = PPOTrainer.actor_loss(SimpleNamespace(args=args), LOGPROBS, minibatch, MASK)
    close(loss, -0.86)
    assert stats["clipfrac"] == pytest.approx(1 / 3)
    assert "gspo" in POLICY_LOSSES


def test_dr_grpo_is_seq_mean_token_sum_without_std_normalization():
    """Dr. GRPO (Liu et al. 2025): advantages r - mean(group), no std; the loss sum_t l_it / L_max averaged over
    the G answers of the batch, L_max a constant. --no_std_normalization with --loss_agg_mode seq_mean_token_sum
    is that loss times L_max: the same direction, a constant scale (which Adam's update does not see)."""
    # Group rewards [1, 0, 0, 1] on answers of 3, 1, 2 and 2 tokens: mean 0.5, advantages +-0.5 without std.
    settings = SimpleNamespace(num_samples_per_prompt=4, no_std_normalization=True)
    mask = t([1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 0.0])
    rewards = t([0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 1.0, 0.0])
    advantages, _ = ESTIMATORS["grpo"].advantages(rewards, None, mask, settings, None)
    close(advantages, t([0.5, 0.5, 0.5], [-0.5, 0.0, 0.0], [-0.5, -0.5, 0.0], [0.5, 0.5, 0.0]))
    # At ratio 1 each token's loss is -A: Dr. GRPO with L_max = 3 is (-1.5 + 0.5 + 1 - 1) / 3 / 4 = -1/12.
    loss, _ = policy_loss(torch.zeros(4, 3), torch.zeros(4, 3), advantages, mask, loss_agg_mode="seq_mean_token_sum")
    close(loss / 3, -1 / 12)
    # With the std (GRPO's default) the advantages are scaled by a group's own spread: a bias Dr. GRPO drops.
    with_std, _ = ESTIMATORS["grpo"].advantages(rewards, None, mask, SimpleNamespace(
        num_samples_per_prompt=4, no_std_normalization=False), None)
    close(with_std[0, 0], 0.5 / (math.sqrt(1 / 3) + 1e-6))  # the group's std (Bessel) is sqrt(1/3), + eps 1e-6
