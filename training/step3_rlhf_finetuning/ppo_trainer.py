"""PPO on the RLHF engine: make experience (sampled rollouts scored by the reward model), then update the actor
with the clipped policy loss and the critic with the clipped value loss. The math is in `ppo_math.py`.

Shapes: `seq` is (B, P + A): P left-padded prompt columns, then A answer columns. Per-token tensors of the
answer (logprobs, values, rewards, advantages) are (B, A); `action_mask` marks the real answer tokens, the first
EOS included, so the model is rewarded (or not) for stopping. A row whose first answer token is EOS is an empty
answer: it is kept, scored and penalised like any other, never dropped.
"""
import time

import torch

from inference.generation import NEUTRAL_PROCESSORS, NEUTRAL_SAMPLING
from inference.sampling import sample, supports_native_sampling
from training.step3_rlhf_finetuning import ppo_math
from utils.model_utils import model_forward_kwargs
from utils.utils import assert_finite


def answer_action_mask(answers, eos_token_id):
    """1 on each answer token up to and including the first EOS (all tokens when there is none)."""
    is_eos = answers == eos_token_id
    positions = torch.arange(answers.shape[1], device=answers.device)
    first_eos = torch.where(is_eos.any(1), is_eos.float().argmax(1), answers.shape[1])
    return (positions.unsqueeze(0) <= first_eos.unsqueeze(1)).to(torch.float32)


def split_experience(experience, minibatch_size):
    """Cut an experience batch into minibatches of `minibatch_size` rows (the row count must divide)."""
    rows = experience["seq"].shape[0]
    return [{key: value[start:start + minibatch_size] if torch.is_tensor(value) else value
             for key, value in experience.items()} for start in range(0, rows, minibatch_size)]


class PPOTrainer:

    def __init__(self, rlhf_engine, args, kl_controller, reward_moments):
        self.engine = rlhf_engine
        self.actor, self.ref, self.critic, self.reward = (rlhf_engine.actor, rlhf_engine.ref, rlhf_engine.critic,
                                                          rlhf_engine.reward)
        self.tokenizer = rlhf_engine.tokenizer
        self.args = args
        self.kl_controller = kl_controller
        self.reward_moments = reward_moments
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
        (B, P + A) token ids; A <= max_answer_seq_len. `--generation_backend native` samples with
        `inference.sampling.sample` (same distribution and layout, faster), `hf` with Hugging Face `generate`."""
        args = self.args
        if args.generation_backend == "native" and supports_native_sampling(self.actor.module):
            return sample(self.actor.module, prompts, prompt_mask, args.max_answer_seq_len, args.temperature,
                          args.top_p, self.tokenizer.eos_token_id, self.tokenizer.pad_token_id,
                          synced=self.zero3_generation)
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
        logprobs = ppo_math.logprobs_from_logits(logits, seq[:, prompt_len:], self.args.temperature)
        if with_entropy:
            return logprobs, ppo_math.entropy_from_logits(logits.detach(), self.args.temperature)
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
            rewards, kl = ppo_math.compute_rewards(logprobs, ref_logprobs, scores, action_mask,
                                                   self.kl_controller.value, args.kl_estimator, args.reward_clip)
            advantages, returns = ppo_math.gae_advantages_and_returns(values, rewards, action_mask, args.gamma,
                                                                      args.lam)
            if args.whiten_advantages:
                advantages = ppo_math.masked_whiten(advantages, action_mask)
        self.actor.train()
        self.critic.train()
        lengths = action_mask.sum(1)
        has_eos = (answers == self.tokenizer.eos_token_id).any(1)
        return {
            "seq": seq, "attention_mask": attention_mask, "action_mask": action_mask, "prompt_len": prompt_len,
            "logprobs": logprobs, "ref_logprobs": ref_logprobs, "values": values, "advantages": advantages,
            "returns": returns,
            "stats": {"score": raw_scores.mean().item(), "reward": (rewards.sum(1)).mean().item(),
                      "kl": kl.sum(1).mean().item(), "answer_length": lengths.float().mean().item(),
                      "eos_fraction": has_eos.float().mean().item(),
                      "empty_fraction": (answers[:, 0] == self.tokenizer.eos_token_id).float().mean().item(),
                      "generate_time": generate_time, "generated_tokens": int(lengths.sum().item())},
        }

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
        seq, attention_mask, action_mask = minibatch["seq"], minibatch["attention_mask"], minibatch["action_mask"]
        prompt_len = minibatch["prompt_len"]
        stats = {}
        if train_actor:
            logprobs, entropy = self.answer_logprobs(self.actor, seq, attention_mask, prompt_len, with_entropy=True)
            actor_loss, policy_stats = ppo_math.policy_loss(logprobs, minibatch["logprobs"], minibatch["advantages"],
                                                            action_mask, args.cliprange)
            assert_finite(actor_loss, "the actor loss")
            self.actor.backward(actor_loss)
            self.actor.step()
            stats.update(actor_loss=actor_loss.item(), entropy=ppo_math.masked_mean(entropy, action_mask).item(),
                         **{k: v.item() for k, v in policy_stats.items()})
        values = self.answer_values(self.critic, seq, attention_mask, prompt_len)
        critic_loss, value_stats = ppo_math.value_loss(values, minibatch["values"], minibatch["returns"], action_mask,
                                                       args.cliprange_value)
        assert_finite(critic_loss, "the critic loss")
        self.critic.backward(critic_loss)
        self.critic.step()
        stats.update(critic_loss=critic_loss.item(), **{k: v.item() for k, v in value_stats.items()})
        return stats

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
