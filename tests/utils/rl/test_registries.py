"""The registries of utils/rl (advantage estimators, policy losses, KL estimators, loss aggregations, preference
losses): a contributor's new row, registered here as a test would (monkeypatching the registry's dict) and
touching no other file, is a valid choice of its flag, is described in the flag's help, and is what the trainer,
the RL math or DPO dispatch to. Loss values are worked out by hand in the comments beside them."""
import math
from types import SimpleNamespace

import pytest
import torch

from training.step2_dpo_finetuning import main as dpo
from training.step3_rlhf_finetuning.arguments import parse_args as step3_args
from utils.rl.estimators import ESTIMATORS, Estimator, uses_critic
from utils.rl.kl import KL_ESTIMATORS, KLEstimator, kl_penalty
from utils.rl.losses import LOSS_AGG_MODES, LossAggregation, aggregate_loss, policy_loss
from utils.rl.policy_losses import POLICY_LOSSES, PolicyLoss
from utils.rl.preference_losses import PREFERENCE_LOSSES, PreferenceLoss
from utils.rl.rewards import compute_rewards
from utils.rl.tokens import masked_sum
from utils.trainer.ppo_trainer import PPOTrainer

STEP3 = ["--actor_model_name_or_path", "tiny", "--output_dir", "unused", "--reward_fn", "builtin",
         "--advantage_estimator", "reinforce_pp"]


def t(*rows):
    return torch.tensor(rows, dtype=torch.float64)


def help_text(parse_args, argv, capsys):
    """The --help text of a script, on one line."""
    with pytest.raises(SystemExit):
        parse_args([*argv, "--help"])
    return " ".join(capsys.readouterr().out.split())


def trainer_with(args):
    """A stand-in for PPOTrainer: what its dispatching methods read (no engines)."""
    return SimpleNamespace(args=args)


def test_a_new_advantage_estimator_is_a_flag_choice_and_the_trainer_calls_it(monkeypatch, capsys):
    def last_token_score(rewards, values, action_mask, settings, batch_sum):
        """Every token of an answer credited with the answer's sequence reward (REINFORCE without a baseline)."""
        return rewards.sum(1, keepdim=True) * action_mask, None

    monkeypatch.setitem(ESTIMATORS, "toy", Estimator(last_token_score, "the answer's reward on every token"))
    argv = [*STEP3[:-1], "toy"]
    args = step3_args(argv)
    assert args.advantage_estimator == "toy" and not uses_critic(args)
    assert "toy: the answer's reward on every token" in help_text(step3_args, argv, capsys)
    # Rewards [0.1, 0.2, 0.7] and [0.5, pad]: sequence rewards 1.0 and 0.5 on each real token.
    rewards, mask = t([0.1, 0.2, 0.7], [0.5, 0.0, 0.0]), t([1.0, 1.0, 1.0], [1.0, 0.0, 0.0])
    advantages, returns = PPOTrainer.estimate_advantages(trainer_with(args), rewards, None, mask)
    torch.testing.assert_close(advantages, t([1.0, 1.0, 1.0], [0.5, 0.0, 0.0]))
    assert returns is None


def test_a_new_policy_loss_is_a_flag_choice_and_the_trainer_calls_it(monkeypatch, capsys):
    def reinforce(logprobs, old_logprobs, advantages, action_mask, settings):
        """-A_t log pi(a_t), averaged by --loss_agg_mode: the vanilla policy gradient, no ratio, no clip."""
        loss = aggregate_loss(-advantages * logprobs, action_mask, settings.loss_agg_mode)
        return loss, {"toy_stat": torch.tensor(1.0)}

    monkeypatch.setitem(POLICY_LOSSES, "toy", PolicyLoss(reinforce, "the vanilla policy gradient"))
    argv = [*STEP3, "--policy_loss", "toy"]
    args = step3_args(argv)
    assert "toy: the vanilla policy gradient" in help_text(step3_args, argv, capsys)
    # log pi = [-1, -2] and [-4, pad], A = 1 everywhere: token mean of [1, 2, 4] = 7/3; d/d log pi = -1/3 each.
    logprobs = t([-1.0, -2.0], [-4.0, 0.0]).requires_grad_()
    mask = t([1.0, 1.0], [1.0, 0.0])
    minibatch = SimpleNamespace(logprobs=logprobs.detach(), advantages=torch.ones(2, 2, dtype=torch.float64),
                                positive=None)
    loss, stats = PPOTrainer.actor_loss(trainer_with(args), logprobs, minibatch, mask)
    assert loss.item() == pytest.approx(7 / 3) and stats == {"toy_stat": 1.0}
    (grad,) = torch.autograd.grad(loss, logprobs)
    torch.testing.assert_close(grad, t([-1 / 3, -1 / 3], [-1 / 3, 0.0]))


def test_the_ppo_policy_loss_gets_its_clip_flags():
    """--policy_loss ppo (the default) is utils/rl/losses.py's policy_loss with --cliprange_low/high: the values of
    test_core_math.py's clip-higher test, -0.0825 with clipfrac 1/2."""
    args = step3_args([*STEP3, "--cliprange_high", "0.28"])
    assert args.policy_loss == "ppo"
    logprobs = torch.tensor([[1.25, 1.4, 0.7, 1.4]]).log()
    minibatch = SimpleNamespace(logprobs=torch.zeros(1, 4), advantages=torch.tensor([[1.0, 1.0, -1.0, -1.0]]),
                                positive=None)
    loss, stats = PPOTrainer.actor_loss(trainer_with(args), logprobs, minibatch, torch.ones(1, 4))
    assert loss.item() == pytest.approx(-0.0825) and stats["clipfrac"] == 0.5


def test_a_new_kl_estimator_is_a_choice_of_both_kl_flags_and_kl_penalty_uses_it(monkeypatch, capsys):
    monkeypatch.setitem(KL_ESTIMATORS, "toy", KLEstimator(torch.abs, "the absolute log ratio"))
    argv = [*STEP3, "--kl_estimator", "toy", "--kl_loss_estimator", "toy"]
    args = step3_args(argv)
    assert (args.kl_estimator, args.kl_loss_estimator) == ("toy", "toy")
    assert "toy: the absolute log ratio" in help_text(step3_args, argv, capsys)
    # r = ref - logprobs = [1, -ln 2]: |r| = [1, ln 2].
    logprobs, ref_logprobs = torch.tensor([[-2.0, -1.0]]), torch.tensor([[-1.0, -1.0 - math.log(2.0)]])
    torch.testing.assert_close(kl_penalty(logprobs, ref_logprobs, "toy"), torch.tensor([[1.0, math.log(2.0)]]))
    # In the reward (kl_coef 0.5, score 3 on the last token): [-0.5, 3 - 0.5 ln 2].
    rewards, _ = compute_rewards(logprobs, ref_logprobs, torch.tensor([3.0]), torch.ones(1, 2), 0.5, "toy")
    torch.testing.assert_close(rewards, torch.tensor([[-0.5, 3.0 - 0.5 * math.log(2.0)]]))


def test_a_new_loss_aggregation_is_a_flag_choice_and_the_losses_use_it(monkeypatch, capsys):
    monkeypatch.setitem(LOSS_AGG_MODES, "toy", LossAggregation(lambda losses, mask: masked_sum(losses, mask),
                                                               "the sum over all real tokens"))
    argv = [*STEP3, "--loss_agg_mode", "toy"]
    assert step3_args(argv).loss_agg_mode == "toy"
    assert "toy: the sum over all real tokens" in help_text(step3_args, argv, capsys)
    # Losses [1, 2, pad 50] and [4, pad, pad]: the sum over real tokens is 7; the policy loss at ratio 1 is -sum(A).
    losses, mask = t([1.0, 2.0, 50.0], [4.0, 50.0, 50.0]), t([1.0, 1.0, 0.0], [1.0, 0.0, 0.0])
    assert aggregate_loss(losses, mask, "toy").item() == 7.0
    loss, _ = policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), losses, mask, loss_agg_mode="toy")
    assert loss.item() == -7.0


def dpo_args(*extra):
    return dpo.parse_args(["--output_dir", "unused", *extra])


def test_a_new_preference_loss_is_a_flag_choice_builds_no_reference_and_dpo_calls_it(monkeypatch, capsys):
    def margin_hinge(policy_chosen, policy_rejected, ref_chosen, ref_rejected, chosen_lengths, rejected_lengths,
                     settings):
        """Reference-free hinge: mean(max(0, 1 - beta (log pi(y_w) - log pi(y_l))))."""
        chosen, rejected = settings.beta * policy_chosen, settings.beta * policy_rejected
        stats = {"margins": (chosen - rejected).detach().mean()}
        return torch.relu(1.0 - (chosen - rejected)).mean(), stats

    monkeypatch.setitem(PREFERENCE_LOSSES, "toy", PreferenceLoss(margin_hinge, "a hinge on the log-prob margin",
                                                                 needs_reference=False))
    args = dpo_args("--loss_type", "toy", "--beta", "0.5")
    assert not dpo.uses_reference(args)  # main() then loads no reference
    assert "toy: a hinge on the log-prob margin" in help_text(dpo.parse_args, ["--output_dir", "unused"], capsys)
    # Two pairs, log pi chosen [-1, -4], rejected [-3, -3]: beta 0.5 margins 1 and -0.5, hinge [0, 1.5], mean 0.75.
    logps = torch.tensor([-1.0, -4.0, -3.0, -3.0])
    monkeypatch.setattr(dpo, "answer_logps", lambda engine, batch: logps)
    batch = {"answer_mask": torch.ones(4, 2)}
    loss, stats = dpo.preference_batch_loss(None, None, batch, args)
    assert loss.item() == pytest.approx(0.75) and stats["margins"].item() == pytest.approx(0.25)
    # Its row says it takes no label smoothing and no reference: the flags that would need them are refused.
    from utils.runtime.errors import ConfigError

    with pytest.raises(ConfigError, match="--label_smoothing applies to --loss_type sigmoid and simpo, not toy"):
        dpo_args("--loss_type", "toy", "--label_smoothing", "0.1")
    with pytest.raises(ConfigError, match="--loss_type toy uses no reference model: drop --precompute_ref_logps"):
        dpo_args("--loss_type", "toy", "--precompute_ref_logps")


def test_dpo_builds_a_reference_exactly_for_the_losses_whose_row_needs_one():
    for name, row in PREFERENCE_LOSSES.items():
        assert dpo.uses_reference(dpo_args("--loss_type", name)) == row.needs_reference
