"""The registry of advantage estimators (`--advantage_estimator`): one row each, from which the flag's choices, the
critic's creation, the group checks and the trainer's dispatch are derived.

A new estimator is its function in `utils/rl/advantages.py` and one row here:

    ESTIMATORS["my_estimator"] = Estimator(my_advantages, help="...")

where `my_advantages(rewards, values, action_mask, settings, batch_sum)` returns (advantages (B, A), returns (B, A) or None).
`rewards` are the per-token rewards of `utils/rl/rewards.compute_rewards` (the KL penalty on every token, the
shaped score on the last), `values` the critic's (None without one), `settings` step 3's parsed flags (gamma,
lam, whiten_advantages, num_samples_per_prompt, no_std_normalization) and `batch_sum` a function summing a
tensor over every rank's batch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from utils.rl.advantages import (gae_advantages_and_returns, grpo_advantages, reinforce_pp_advantages, rloo_advantages,
                                 sequence_advantages)
from utils.rl.tokens import masked_whiten


@dataclass(frozen=True)
class Estimator:
    """How an answer is credited."""
    advantages: Callable  # (rewards, values, action_mask, settings, batch_sum) -> (advantages, returns or None)
    help: str  # one phrase for --advantage_estimator's help
    needs_critic: bool = False  # learns a value function: step 3 creates, trains and saves a critic
    groups: bool = False  # compares the --num_samples_per_prompt answers to one prompt (needs at least 2)


def _gae(rewards, values, action_mask, settings, batch_sum):
    advantages, returns = gae_advantages_and_returns(values, rewards, action_mask, settings.gamma, settings.lam)
    return (masked_whiten(advantages, action_mask) if settings.whiten_advantages else advantages), returns


def _group_scores(rewards, settings):
    """(B / group, group): each answer's sequence reward (its score minus its KL penalty), a row per prompt."""
    return rewards.sum(1).view(-1, settings.num_samples_per_prompt)


def _grpo(rewards, values, action_mask, settings, batch_sum):
    advantages = grpo_advantages(_group_scores(rewards, settings),
                                 std_normalization=not settings.no_std_normalization)
    return sequence_advantages(advantages.reshape(-1), action_mask), None


def _rloo(rewards, values, action_mask, settings, batch_sum):
    return sequence_advantages(rloo_advantages(_group_scores(rewards, settings)).reshape(-1), action_mask), None


def _reinforce_pp(rewards, values, action_mask, settings, batch_sum):
    return reinforce_pp_advantages(rewards, action_mask, settings.gamma, batch_sum=batch_sum), None


ESTIMATORS = {
    "gae": Estimator(_gae, "PPO with a critic (GAE)", needs_critic=True),
    "grpo": Estimator(_grpo, "GRPO: the group's mean (and std) as baseline", groups=True),
    "rloo": Estimator(_rloo, "RLOO: the mean of the group's other answers as baseline", groups=True),
    "reinforce_pp": Estimator(_reinforce_pp, "REINFORCE++: KL in the reward, batch-whitened returns"),
}
CRITIC_FREE = tuple(name for name, estimator in ESTIMATORS.items() if not estimator.needs_critic)


def uses_critic(args):
    """Whether step 3 with these flags learns a value function (creates, trains and saves a critic)."""
    return ESTIMATORS[args.advantage_estimator].needs_critic
