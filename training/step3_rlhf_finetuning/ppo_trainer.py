"""PPO on the RLHF engine: make experience (sampled rollouts scored by the reward model), then update the actor
with the clipped policy loss and the critic with the clipped value loss. The math is in `utils/rl/`, the shapes
of a batch of experience in `utils/rl/experience.py`. A row whose first answer token is EOS is an empty answer: it
is kept, scored and penalised like any other, never dropped.
"""
import time

import torch

from inference.generation import NEUTRAL_PROCESSORS, NEUTRAL_SAMPLING
from utils.model.model_utils import model_forward_kwargs
from utils.rl.advantages import gae_advantages_and_returns
from utils.rl.experience import Experience, answer_action_mask
from utils.rl.frozen import moving_average
from utils.rl.kl import make_kl_controller
from utils.rl.losses import policy_loss, value_loss
from utils.rl.rewards import RunningMoments, compute_rewards
from utils.rl.tokens import entropy_from_logits, logprobs_from_logits, masked_mean, masked_whiten
from utils.runtime.dist import all_reduce_mean, assert_finite, to_device


class PPOTrainer:

    def __init__(self, rlhf_engine, args):
        self.engine = rlhf_engine
        self.actor, self.ref, self.critic, self.reward = (rlhf_engine.actor, rlhf_engine.ref, rlhf_engine.critic,
                                                          rlhf_engine.reward)
        self.tokenizer = rlhf_engine.tokenizer
        self.args = args
        self.kl_controller = make_kl_controller(args.kl_coef, args.adaptive_kl_target, args.adaptive_kl_horizon)
        self.reward_moments = RunningMoments()
        self.zero3_generation = args.actor_zero_stage == 3 and torch.distributed.get_world_size() > 1

    def state_dict(self):
        """What PPO carries from round to round besides the models: the KL coefficient and the reward moments."""
        return {"kl_controller": self.kl_controller.state_dict(), "reward_moments": self.reward_moments.state_dict()}

    def load_state_dict(self, state):
        self.kl_controller.load_state_dict(state["kl_controller"])
        self.reward_moments.load_state_dict(state["reward_moments"])

    # ---- experience -------------------------------------------------------------------------------------------

    def generate_sequence(self, prompts, prompt_mask):
        """Sampled answers (temperature, top-p, nothing else, whatever the model's generation_config says):
        (B, P + A) token ids; A <= max_answer_seq_len."""
        args = self.args
        with torch.no_grad():
            seq = self.actor.module.generate(
                input_ids=prompts, attention_mask=prompt_mask, max_new_tokens=args.max_answer_seq_len,
                do_sample=True, temperature=args.temperature, top_p=args.top_p,
                eos_token_id=self.tokenizer.eos_token_id, pad_token_id=self.tokenizer.pad_token_id,
                synced_gpus=self.zero3_generation, use_cache=True, **NEUTRAL_PROCESSORS, **NEUTRAL_SAMPLING)
        return seq

    def answer_logprobs(self, model, seq, attention_mask, prompt_len, with_entropy=False):
        """log pi(a_t | s_t) of every answer token at the rollout temperature (and the entropy if asked)."""
        logits = model(input_ids=seq, use_cache=False, **model_forward_kwargs(model.module, attention_mask)).logits
        logits = logits[:, prompt_len - 1:-1]
        logprobs = logprobs_from_logits(logits, seq[:, prompt_len:], self.args.temperature)
        if with_entropy:
            return logprobs, entropy_from_logits(logits.detach(), self.args.temperature)
        return logprobs

    def answer_values(self, critic, seq, attention_mask, prompt_len):
        """V(s_t) for each answer position t: the critic's value at the token before it."""
        values, _ = critic.forward_value(seq, attention_mask)
        return values[:, prompt_len - 1:-1]

    def generate_experience(self, prompts, prompt_mask):
        """One batch of experience with everything PPO needs, computed with every model in eval mode."""
        args = self.args
        generate_start = time.perf_counter()
        self.actor.eval()
        seq = self.generate_sequence(prompts, prompt_mask)
        generate_time = time.perf_counter() - generate_start

        prompt_len = prompts.shape[1]
        answers = seq[:, prompt_len:]
        action_mask = answer_action_mask(answers, self.tokenizer.eos_token_id)
        attention_mask = torch.cat([prompt_mask, action_mask.to(prompt_mask.dtype)], dim=1)
        self.critic.eval()
        with torch.no_grad():
            logprobs = self.answer_logprobs(self.actor, seq, attention_mask, prompt_len)
            ref_logprobs = self.answer_logprobs(self.ref, seq, attention_mask, prompt_len)
            values = self.answer_values(self.critic.module, seq, attention_mask, prompt_len) * action_mask
            _, raw_scores = self.reward.module.forward_value(seq, attention_mask)
            raw_scores = raw_scores.float()
            scores = self.shape_scores(raw_scores, action_mask, answers)
            rewards, kl = compute_rewards(logprobs, ref_logprobs, scores, action_mask,
                                          self.kl_controller.value, args.kl_estimator, args.reward_clip)
            advantages, returns = gae_advantages_and_returns(values, rewards, action_mask, args.gamma, args.lam)
            if args.whiten_advantages:
                advantages = masked_whiten(advantages, action_mask)
        self.actor.train()
        self.critic.train()
        lengths = action_mask.sum(1)
        has_eos = (answers == self.tokenizer.eos_token_id).any(1)
        return Experience(
            seq=seq, attention_mask=attention_mask, action_mask=action_mask, prompt_len=prompt_len,
            logprobs=logprobs, ref_logprobs=ref_logprobs, values=values, advantages=advantages, returns=returns,
            stats={"score": raw_scores.mean().item(), "reward": (rewards.sum(1)).mean().item(),
                      "kl": kl.sum(1).mean().item(), "answer_length": lengths.float().mean().item(),
                      "eos_fraction": has_eos.float().mean().item(),
                      "empty_fraction": (answers[:, 0] == self.tokenizer.eos_token_id).float().mean().item(),
                   "generate_time": generate_time, "generated_tokens": int(lengths.sum().item())})

    def shape_scores(self, raw_scores, action_mask, answers):
        """The score the policy is rewarded with: the reward model's end score, normalised by the running
        moments of all scores seen (all ranks), minus a penalty for answers that never emit EOS."""
        scores = raw_scores
        if self.args.normalize_reward:
            self.reward_moments.update(gather_all(raw_scores))
            scores = self.reward_moments.normalise(raw_scores)
        if self.args.missing_eos_penalty:
            has_eos = (answers == self.tokenizer.eos_token_id).any(1)
            scores = scores - self.args.missing_eos_penalty * (~has_eos).float()
        return scores

    # ---- update -----------------------------------------------------------------------------------------------

    def train_rlhf(self, minibatch, train_actor=True):
        """One clipped-PPO step of the actor (unless still warming up the critic) and of the critic."""
        args = self.args
        seq, attention_mask, action_mask = minibatch.seq, minibatch.attention_mask, minibatch.action_mask
        prompt_len = minibatch.prompt_len
        stats = {}
        if train_actor:
            logprobs, entropy = self.answer_logprobs(self.actor, seq, attention_mask, prompt_len, with_entropy=True)
            actor_loss, policy_stats = policy_loss(logprobs, minibatch.logprobs, minibatch.advantages, action_mask,
                                                   args.cliprange)
            assert_finite(actor_loss, "the actor loss")
            self.actor.backward(actor_loss)
            self.actor.step()
            stats.update(actor_loss=actor_loss.item(), entropy=masked_mean(entropy, action_mask).item(),
                         **{k: v.item() for k, v in policy_stats.items()})
        values = self.answer_values(self.critic, seq, attention_mask, prompt_len)
        critic_loss, value_stats = value_loss(values, minibatch.values, minibatch.returns, action_mask,
                                              args.cliprange_value)
        assert_finite(critic_loss, "the critic loss")
        self.critic.backward(critic_loss)
        self.critic.step()
        stats.update(critic_loss=critic_loss.item(), **{k: v.item() for k, v in value_stats.items()})
        return stats

    def train_round(self, experiences, unsup_batches, shuffler, train_actor):
        """ppo_epochs passes over the minibatches of this round's experience (each followed, with an unsupervised
        data set, by a language-modelling step, and by the EMA update); the round's mean statistics."""
        args = self.args
        minibatches = [mb for exp in experiences for mb in exp.split(args.per_device_training_batch_size)]
        train_start = time.perf_counter()
        step_stats = []
        for _ in range(args.ppo_epochs):
            shuffler.shuffle(minibatches)
            for minibatch in minibatches:
                stats = self.train_rlhf(minibatch, train_actor)
                if unsup_batches is not None and train_actor:  # critic warm-up rounds leave the actor alone
                    batch = to_device(next(unsup_batches), self.actor.device)
                    stats["unsup_loss"] = self.train_unsupervised(batch, args.unsup_coef)
                if self.engine.actor_ema is not None:
                    moving_average(self.actor.module, self.engine.actor_ema.module, args.ema_beta)
                step_stats.append(stats)
        train_time = time.perf_counter() - train_start
        round_stats = {key: sum(s[key] for s in step_stats) / len(step_stats) for key in step_stats[0]}
        for key in experiences[0].stats:
            round_stats[key] = sum(exp.stats[key] for exp in experiences) / len(experiences)
        generate_time = sum(exp.stats["generate_time"] for exp in experiences)
        round_stats["tokens_per_s"] = sum(exp.stats["generated_tokens"] for exp in experiences) / generate_time
        round_stats["generate_time"], round_stats["train_time"] = generate_time, train_time
        del round_stats["generated_tokens"]
        # Every rank reports the same numbers: the mean over ranks.
        return {key: all_reduce_mean(torch.tensor(float(value))).item() for key, value in round_stats.items()}

    def train_unsupervised(self, batch, unsup_coef):
        """One step of the pretraining (language-modelling) loss on the actor, scaled by unsup_coef."""
        outputs = self.actor(input_ids=batch["input_ids"], labels=batch["labels"], use_cache=False,
                             **model_forward_kwargs(self.actor.module, batch["attention_mask"]))
        loss = outputs.loss * unsup_coef
        assert_finite(loss, "the unsupervised loss")
        self.actor.backward(loss)
        self.actor.step()
        return outputs.loss.item()


def gather_all(values):
    """Concatenate a 1-D tensor across ranks (itself on a world of one)."""
    if not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
        return values.detach()
    parts = [torch.zeros_like(values) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(parts, values.detach().contiguous())
    return torch.cat(parts)
