"""PPO on the RLHF engine: make experience (sampled rollouts scored by the reward model, a reward function, or
both), then update the actor with the clipped policy loss and, with a critic, the critic with the clipped value
loss. The math is in `utils/rl/`, the shapes of a batch of experience in `utils/rl/experience.py`. A row whose
first answer token is EOS is an empty answer: it is kept, scored and penalised like any other, never dropped.

--advantage_estimator chooses how an answer is credited: a row of `utils/rl/estimators.py` (GAE with a critic,
DeepSpeed-Chat's; GRPO, RLOO and REINFORCE++ without one); --policy_loss how the actor learns from the advantages:
a row of `utils/rl/policy_losses.py` (PPO's clipped surrogate).

Each prompt is repeated --num_samples_per_prompt times in a row inside this rank's batch, so a group never
spans two ranks.

With --tools the rollouts are multi-turn (inference/tool_rollout.py): an answer's tool outputs are in `seq` and
attended to, but their action-mask entries are 0, so no loss, KL, advantage or reward lands on them; the
reward function scores the final answer (the text after the last tool output). Without --tools the action mask
is the contiguous answer up to its EOS, as before.
"""
import time

import torch

from inference.evaluation import DECODINGS, answer_scalars, evaluate_models
from inference.generation import NEUTRAL_PROCESSORS, NEUTRAL_SAMPLING
from inference.sampling import sample, supports_native_sampling
from inference.tool_rollout import tool_rollout
from utils.model.model_utils import answer_logprobs, causal_lm_loss, model_forward_kwargs
from utils.model.reward_model import score_answers
from utils.rl.entropy_control import make_entropy_coef
from utils.rl.estimators import ESTIMATORS
from utils.rl.experience import Experience, answer_action_mask, concat_experiences
from utils.rl.kl import make_kl_controller
from utils.rl.losses import aggregate_loss, kl_loss, positive_nll, value_loss
from utils.rl.policy_losses import POLICY_LOSSES
from utils.rl.reward_fns import call_reward_fn
from utils.rl.rewards import RunningMoments, compute_rewards, overlong_fraction
from utils.rl.tokens import masked_mean
from utils.runtime.args import BATCH_SIZE, rollouts_per_batch
from utils.runtime.dist import all_reduce_mean, all_reduce_min, all_reduce_sum, assert_finite, to_device
from utils.runtime.errors import ConfigError
from utils.runtime.tool_format import tool_use
from utils.trainer.frozen import moving_average
from utils.trainer.monitor import peak_memory
from utils.trainer.rlhf_engine import gathered_for_generation


class PPOTrainer:

    def __init__(self, rlhf_engine, args, reward_fn=None, base_rate=None):
        """reward_fn: a function of utils/rl/reward_fns.py (--reward_fn), or None for the reward model alone;
        base_rate: its AnswerBaseRate (utils/rl/base_rate.py, --answer_base_rate), subtracted from the reward."""
        self.engine = rlhf_engine
        self.actor, self.ref, self.critic, self.reward = (rlhf_engine.actor, rlhf_engine.ref, rlhf_engine.critic,
                                                          rlhf_engine.reward)
        self.tokenizer = rlhf_engine.tokenizer
        self.args = args
        self.reward_fn, self.base_rate = reward_fn, base_rate
        self.kl_controller = make_kl_controller(args.kl_coef, args.adaptive_kl_target, args.adaptive_kl_horizon)
        self.entropy_coef = make_entropy_coef(args.entropy_coef, args.target_entropy, args.entropy_coef_step,
                                              args.max_entropy_coef)
        self.reward_moments = RunningMoments()
        self.zero3_generation = args.actor_zero_stage == 3 and torch.distributed.get_world_size() > 1
        self.tools = tool_use(args)
        if self.tools is not None and self.zero3_generation:
            raise ConfigError("--tools runs each rank's turns on its own: it cannot run with --actor_zero_stage 3 "
                              "over several processes, whose forward passes must stay in step")

    STATE_SHAPE = {"kl_controller": {"value": 0.0}, "entropy_coef": {"value": 0.0},
                   "reward_moments": {"count": 0.0, "mean": 0.0, "m2": 0.0}}
    """The shape of state_dict() (utils.trainer.checkpoint.json_shape_problem), checked before a resume."""

    def state_dict(self):
        """What PPO carries from round to round besides the models: the KL and entropy coefficients and the reward
        moments."""
        return {"kl_controller": self.kl_controller.state_dict(), "entropy_coef": self.entropy_coef.state_dict(),
                "reward_moments": self.reward_moments.state_dict()}

    def load_state_dict(self, state):
        self.kl_controller.load_state_dict(state["kl_controller"])
        self.entropy_coef.load_state_dict(state["entropy_coef"])
        self.reward_moments.load_state_dict(state["reward_moments"])

    # ---- experience -------------------------------------------------------------------------------------------

    def generate_sequence(self, prompts, prompt_mask):
        """Sampled answers (temperature, top-p, nothing else, whatever the model's generation_config says):
        (B, P + A) token ids; A <= max_answer_seq_len. `--generation_backend native` samples with
        `inference.sampling.sample` (same distribution and layout, faster), `hf` with Hugging Face `generate`."""
        args = self.args
        if self.native_sampling():
            return self.sample_natively(prompts, prompt_mask)
        with torch.no_grad(), gathered_for_generation(self.actor):
            seq = self.actor.module.generate(
                input_ids=prompts, attention_mask=prompt_mask, max_new_tokens=args.max_answer_seq_len,
                do_sample=True, temperature=args.temperature, top_p=args.top_p,
                eos_token_id=self.tokenizer.eos_token_id, pad_token_id=self.tokenizer.pad_token_id,
                synced_gpus=self.zero3_generation, use_cache=True, **NEUTRAL_PROCESSORS, **NEUTRAL_SAMPLING)
        return seq

    def native_sampling(self):
        """Whether the rollouts are `inference.sampling.sample`'s: --generation_backend native, on a model it
        supports."""
        return self.args.generation_backend == "native" and supports_native_sampling(self.actor.module)

    def sample_natively(self, prompts, prompt_mask, return_logprobs=False):
        """`inference.sampling.sample`'s rollouts of the actor (and, with `return_logprobs`, their log-probs)."""
        args = self.args
        with gathered_for_generation(self.actor):
            return sample(self.actor.module, prompts, prompt_mask, args.max_answer_seq_len, args.temperature,
                          args.top_p, self.tokenizer.eos_token_id, self.tokenizer.pad_token_id,
                          synced=self.zero3_generation, return_logprobs=return_logprobs)

    def sample_with_logprobs(self, prompts, prompt_mask):
        """--rollout_logprobs: (seq, the sampler's log-probs of the answer tokens (B, A)) where the native sampler
        decodes, else (generate_sequence's seq, None)."""
        if not self.native_sampling():
            return self.generate_sequence(prompts, prompt_mask), None
        return self.sample_natively(prompts, prompt_mask, return_logprobs=True)

    def answer_logprobs(self, model, seq, attention_mask, prompt_len, with_entropy=False):
        """log pi(a_t | s_t) of every answer token at the rollout temperature (and the entropy if asked): a group's
        prompt runs once, and the answers' logits are never held whole (`answer_logprobs`)."""
        logprobs, entropy = answer_logprobs(model, seq, attention_mask, prompt_len, self.args.temperature,
                                            with_entropy, entropy_grad=self.entropy_bonus_on())
        return (logprobs, entropy) if with_entropy else logprobs

    def entropy_bonus_on(self):
        """Whether the entropy's gradient is wanted: a fixed --entropy_coef above 0, or --target_entropy."""
        return bool(self.args.entropy_coef or self.args.target_entropy)

    def answer_values(self, critic, seq, attention_mask, prompt_len):
        """V(s_t) for each answer position t: the critic's value at the token before it."""
        values, _ = critic.forward_value(seq, attention_mask)
        return values[:, prompt_len - 1:-1]

    def generate_experience(self, prompts, prompt_mask, prompt_texts=None):
        """One batch of experience with everything the update needs, computed with every model in eval mode.
        prompt_texts: the data set's prompts as text, for a reward function."""
        args = self.args
        group = args.num_samples_per_prompt
        if group > 1:
            prompts, prompt_mask = prompts.repeat_interleave(group, 0), prompt_mask.repeat_interleave(group, 0)
            prompt_texts = None if prompt_texts is None else [text for text in prompt_texts for _ in range(group)]
        generate_start = time.perf_counter()
        self.actor.eval()
        tool_stats, sampled_logprobs = {}, None  # the sampler's own log-probs, with --rollout_logprobs
        if self.tools is None:
            if args.rollout_logprobs:
                seq, sampled_logprobs = self.sample_with_logprobs(prompts, prompt_mask)
            else:
                seq = self.generate_sequence(prompts, prompt_mask)
            action_mask = answer_action_mask(seq[:, prompts.shape[1]:], self.tokenizer.eos_token_id)
            attention_mask = torch.cat([prompt_mask, action_mask.to(prompt_mask.dtype)], dim=1)
        else:
            rollout = self.generate_with_tools(prompts, prompt_mask)
            seq, action_mask, attention_mask, tool_stats = (rollout.seq, rollout.action_mask, rollout.attention_mask,
                                                            rollout.stats())
            sampled_logprobs = rollout.logprobs if args.rollout_logprobs else None
        generate_time = time.perf_counter() - generate_start

        prompt_len = prompts.shape[1]
        answers = seq[:, prompt_len:]
        lengths = action_mask.sum(1)
        has_eos = (answers == self.tokenizer.eos_token_id).any(1)
        with torch.no_grad():
            raw_scores, score_stats, base_rates = self.score(seq, attention_mask, action_mask, prompt_len,
                                                             prompt_texts)
        scores = self.shape_scores(raw_scores - base_rates, action_mask, answers)
        stats = {"score": raw_scores.mean().item(), **score_stats, **tool_stats,
                 "answer_length": lengths.float().mean().item(), "eos_fraction": has_eos.float().mean().item(),
                 "empty_fraction": (answers[:, 0] == self.tokenizer.eos_token_id).float().mean().item()}
        keep = torch.ones(seq.shape[0], dtype=torch.bool, device=seq.device)
        if group > 1:
            equal = self.equal_score_groups(scores)
            stats["zero_variance_groups"] = float(equal.sum().item())
            if args.filter_zero_variance:  # DAPO's dynamic sampling: such a group has nothing to teach
                keep = (~equal).repeat_interleave(group)
        logprobs, ref_logprobs, values = self.old_policy(seq, attention_mask, prompt_len, keep, sampled_logprobs)
        seq, attention_mask, action_mask = seq[keep], attention_mask[keep], action_mask[keep]
        raw_scores, scores = raw_scores[keep], scores[keep]
        if values is not None:
            values = values * action_mask
        with torch.no_grad():
            rewards, kl = compute_rewards(logprobs, ref_logprobs, scores, action_mask, self.reward_kl_coef(),
                                          args.kl_estimator, args.reward_clip)
            advantages, returns = self.estimate_advantages(rewards, values, action_mask)
        positive = raw_scores >= args.positive_score_threshold if args.positive_nll_coef else None
        self.actor.train()
        if self.critic is not None:
            self.critic.train()
        kept = seq.shape[0] > 0  # the mean reward and KL of the answers kept (0 when none is)
        stats["reward"] = rewards.sum(1).mean().item() if kept else 0.0
        if self.ref is not None:  # without a reference there is no KL to log
            stats["kl"] = kl.sum(1).mean().item() if kept else 0.0
        if positive is not None:
            stats["positive_fraction"] = positive.float().mean().item() if kept else 0.0
        return Experience(
            seq=seq, attention_mask=attention_mask, action_mask=action_mask, prompt_len=prompt_len,
            logprobs=logprobs, ref_logprobs=ref_logprobs, values=values, advantages=advantages, returns=returns,
            positive=positive,
            stats={**stats, "generate_time": generate_time, "generated_tokens": int(lengths.sum().item())})

    def old_policy(self, seq, attention_mask, prompt_len, keep, sampled_logprobs=None):
        """(logprobs, ref_logprobs, values) of the rows `keep` marks, (B', A) each (values None without a critic),
        from the actor, reference and critic before the update; the actor's are `sampled_logprobs` (the sampler's
        own, --rollout_logprobs) where given. The rows dropped by --filter_zero_variance cost no forward pass,
        except under ZeRO-3 over several processes, whose forward passes must stay in step: there every row runs
        and the kept ones are picked after."""
        runs = torch.ones_like(keep) if self.zero3_generation else keep
        seq, attention_mask, picked = seq[runs], attention_mask[runs], keep[runs]
        if seq.shape[0] == 0:  # nothing kept on this process (a forward pass takes no empty batch)
            empty = seq.new_zeros((0, seq.shape[1] - prompt_len), dtype=torch.float32)
            return empty, empty.clone(), None if self.critic is None else empty.clone()
        if self.critic is not None:
            self.critic.eval()
        with torch.no_grad():
            logprobs = (sampled_logprobs[keep].float() if sampled_logprobs is not None
                        else self.answer_logprobs(self.actor, seq, attention_mask, prompt_len)[picked])
            ref_logprobs = (logprobs if self.ref is None  # no KL term: a KL of 0 that nothing reads
                            else self.answer_logprobs(self.ref, seq, attention_mask, prompt_len)[picked])
            values = None
            if self.critic is not None:
                values = self.answer_values(self.critic.module, seq, attention_mask, prompt_len)[picked]
        return logprobs, ref_logprobs, values

    def generate_with_tools(self, prompts, prompt_mask):
        """Multi-turn rollouts with --tools (inference/tool_rollout.py): a ToolRollout whose answers hold at most
        --max_answer_seq_len tokens, the model's and the tool outputs' together."""
        args, tools = self.args, self.tools
        if not supports_native_sampling(self.actor.module):
            raise ConfigError("--tools needs an actor the native sampler can drive (its forward takes position ids "
                              "and a cache object)")
        with gathered_for_generation(self.actor):
            return tool_rollout(self.actor.module, self.tokenizer, prompts, prompt_mask, args.max_answer_seq_len,
                                tools.run, tools.format, tools.max_calls, tools.timeout, args.temperature,
                                args.top_p, self.tokenizer.eos_token_id, self.tokenizer.pad_token_id)

    def score(self, seq, attention_mask, action_mask, prompt_len, prompt_texts):
        """(end scores, stats, base rates), each (B,) but stats: the reward model's score times
        --reward_model_weight plus the reward function's times --reward_fn_weight, of whichever are given; and,
        when both are, each mean. The base rates are the reward function's AnswerBaseRate times its weight (0
        without --answer_base_rate), which the policy's reward leaves out. With --tools the reward function reads
        the final answer: the answer's text (tool outputs included) after its last tool output."""
        args = self.args
        parts, base_rates = {}, torch.zeros(seq.shape[0], device=seq.device)
        if self.reward is not None:
            _, model_scores = self.reward.module.forward_value(seq, attention_mask)
            parts["reward_model_score"] = (args.reward_model_weight, model_scores.float())
        if self.reward_fn is not None:
            if self.tools is None:
                answers = [self.tokenizer.decode(row[mask.bool()], skip_special_tokens=True)
                           for row, mask in zip(seq[:, prompt_len:], action_mask)]
            else:
                answers = [self.tools.format.final_answer(self.tokenizer.decode(row[mask.bool()],
                                                                                skip_special_tokens=True))
                           for row, mask in zip(seq[:, prompt_len:], attention_mask[:, prompt_len:])]
            fn_scores = call_reward_fn(self.reward_fn, args.reward_fn, prompt_texts, answers).to(seq.device)
            parts["reward_fn_score"] = (args.reward_fn_weight, fn_scores)
            if self.base_rate is not None:
                base_rates = args.reward_fn_weight * self.base_rate(prompt_texts, answers).to(seq.device)
        scores = sum(weight * part for weight, part in parts.values())
        stats = {name: part.mean().item() for name, (_, part) in parts.items()} if len(parts) > 1 else {}
        if self.base_rate is not None:
            stats["answer_base_rate"] = base_rates.mean().item()
        return scores, stats, base_rates

    def score_texts(self, prompts, answers):
        """The same end scores (one float each) for answers given as text to data-set prompts (evaluation)."""
        args = self.args
        scores = [0.0] * len(answers)
        if self.reward is not None:
            model_scores = score_answers(self.reward.module, self.tokenizer, prompts, answers)
            scores = [s + args.reward_model_weight * float(r) for s, r in zip(scores, model_scores)]
        if self.reward_fn is not None:
            fn_scores = call_reward_fn(self.reward_fn, args.reward_fn, prompts, answers)
            scores = [s + args.reward_fn_weight * float(r) for s, r in zip(scores, fn_scores)]
        return scores

    def shape_scores(self, raw_scores, action_mask, answers):
        """The score the policy is rewarded with: the end score, normalised by the running moments of all scores
        seen (all ranks), minus a penalty for answers that never emit EOS and one for answers near or at
        --max_answer_seq_len (DAPO's soft overlong punishment)."""
        args = self.args
        scores = raw_scores
        if args.normalize_reward:
            self.reward_moments.update(gather_all(raw_scores))
            scores = self.reward_moments.normalise(raw_scores)
        if args.missing_eos_penalty:  # (a tool output holds no EOS: output_token_ids takes special tokens out)
            has_eos = (answers == self.tokenizer.eos_token_id).any(1)
            scores = scores - args.missing_eos_penalty * (~has_eos).to(scores.dtype)
        if args.overlong_penalty:
            scores = scores - args.overlong_penalty * overlong_fraction(action_mask.sum(1), args.max_answer_seq_len,
                                                                        args.overlong_buffer).to(scores.dtype)
        return scores

    def reward_kl_coef(self):
        """The KL penalty's weight in the reward: the controller's, or 0 when the KL is a loss term instead."""
        return 0.0 if self.args.use_kl_loss else self.kl_controller.value

    def equal_score_groups(self, scores):
        """(B / group,) bool: the prompts whose --num_samples_per_prompt answers all got the same score."""
        groups = scores.view(-1, self.args.num_samples_per_prompt)
        return (groups == groups[:, :1]).all(1)

    def estimate_advantages(self, rewards, values, action_mask):
        """(advantages, returns) by --advantage_estimator; returns (the critic's targets) is None without a
        critic. `rewards` are compute_rewards' per-token rewards: the KL penalty on every token, the shaped
        score on the last, so an answer's sequence reward rewards.sum(1) is its score minus its KL penalty."""
        return ESTIMATORS[self.args.advantage_estimator].advantages(rewards, values, action_mask, self.args,
                                                                     all_reduce_sum)

    # ---- update -----------------------------------------------------------------------------------------------

    def train_rlhf(self, minibatch, train_actor=True):
        """One clipped-PPO step of the actor (unless still warming up the critic) and, with GAE, of the critic."""
        args = self.args
        seq, attention_mask, action_mask = minibatch.seq, minibatch.attention_mask, minibatch.action_mask
        prompt_len = minibatch.prompt_len
        stats = {}
        if train_actor:
            logprobs, entropy = self.answer_logprobs(self.actor, seq, attention_mask, prompt_len, with_entropy=True)
            actor_loss, actor_stats = self.actor_loss(logprobs, minibatch, action_mask, entropy)
            assert_finite(actor_loss, "the actor loss")
            self.actor.backward(actor_loss)
            self.actor.step()
            stats.update(actor_loss=actor_loss.item(), entropy=masked_mean(entropy.detach(), action_mask).item(),
                         **actor_stats)
        if self.critic is not None:
            values = self.answer_values(self.critic, seq, attention_mask, prompt_len)
            critic_loss, value_stats = value_loss(values, minibatch.values, minibatch.returns, action_mask,
                                                  args.cliprange_value)
            assert_finite(critic_loss, "the critic loss")
            self.critic.backward(critic_loss)
            self.critic.step()
            stats.update(critic_loss=critic_loss.item(), **{k: v.item() for k, v in value_stats.items()})
        return stats

    def actor_loss(self, logprobs, minibatch, action_mask, entropy=None):
        """The actor's loss on a minibatch, with the gradient through `logprobs` (the actor's now) and `entropy`
        (its answer tokens' entropy), and its stats (floats): the --policy_loss row's loss
        (utils/rl/policy_losses.py), plus --kl_loss_coef x the KL to the reference with --use_kl_loss and
        --positive_nll_coef x the NLL of the positive answers, less the entropy bonus's coefficient (--entropy_coef,
        or --target_entropy's this round) x the entropy."""
        args = self.args
        loss, policy_stats = POLICY_LOSSES[args.policy_loss].loss(logprobs, minibatch.logprobs, minibatch.advantages,
                                                                  action_mask, args)
        stats = {name: value.item() for name, value in policy_stats.items()}
        if args.use_kl_loss:
            kl_term = kl_loss(logprobs, minibatch.ref_logprobs, action_mask, args.kl_loss_estimator,
                              args.loss_agg_mode)
            loss = loss + args.kl_loss_coef * kl_term
            stats["kl_loss"] = kl_term.item()
        if minibatch.positive is not None:
            nll = positive_nll(logprobs, action_mask, minibatch.positive, args.loss_agg_mode)
            loss = loss + args.positive_nll_coef * nll
            stats["positive_nll"] = nll.item()
        if entropy is not None and self.entropy_coef.bonus:
            loss = loss - self.entropy_coef.bonus * aggregate_loss(entropy, action_mask, args.loss_agg_mode)
        return loss, stats

    def round_rows(self):
        """The rows a round trains on: --generation_batches prompt batches' rollouts."""
        args = self.args
        return args.generation_batches * rollouts_per_batch(args)

    def round_ready(self, experiences):
        """Whether the prompt batches drawn make a whole round: --generation_batches of them; with
        --filter_zero_variance, as many as it takes for every process to keep a round's rows (`round_rows`) of
        groups that teach something, up to --max_generation_batches (DAPO's dynamic sampling: verl's
        max_num_gen_batches)."""
        args = self.args
        if not args.filter_zero_variance:
            return len(experiences) >= args.generation_batches
        if len(experiences) >= max(args.max_generation_batches, args.generation_batches):
            return True
        fewest = all_reduce_min(torch.tensor(sum(exp.rows for exp in experiences), device=self.actor.device))
        return fewest.item() >= self.round_rows()

    def round_minibatches(self, experiences):
        """The round's training minibatches of --per_device_training_batch_size rows. With --filter_zero_variance
        the groups kept from every prompt batch drawn make one experience, cut to `round_rows` and to the rows the
        process with the fewest has (so every process makes the same optimizer steps); a short round's last
        minibatch is smaller."""
        args = self.args
        size = args.per_device_training_batch_size
        if not args.filter_zero_variance:
            return [mb for exp in experiences for mb in exp.split(size)]
        merged = concat_experiences(experiences, self.tokenizer.pad_token_id)
        rows = min(self.round_rows(), int(all_reduce_min(torch.tensor(merged.rows, device=self.actor.device)).item()))
        return merged.select(slice(0, rows)).split(size, ragged=True) if rows else []

    def train_round(self, experiences, unsup_batches, shuffler, train_actor):
        """ppo_epochs passes over the minibatches of this round's experience (each followed, with an unsupervised
        data set, by a language-modelling step, and by the EMA update); the round's mean statistics, with
        `trained_rows` (the rollouts trained on) and `drawn_batches` (the prompt batches sampled for them)."""
        args = self.args
        minibatches = self.round_minibatches(experiences)
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
        round_stats = mean_stats(step_stats)
        for key in experiences[0].stats:
            round_stats[key] = sum(exp.stats[key] for exp in experiences) / len(experiences)
        generate_time = sum(exp.stats["generate_time"] for exp in experiences)
        round_stats["tokens_per_s"] = sum(exp.stats["generated_tokens"] for exp in experiences) / generate_time
        round_stats["generate_time"], round_stats["train_time"] = generate_time, train_time
        round_stats["trained_rows"] = sum(minibatch.rows for minibatch in minibatches)
        round_stats["drawn_batches"] = len(experiences)
        round_stats.update(peak_memory())  # on CUDA
        del round_stats["generated_tokens"]
        # Every rank reports the same numbers: the mean over ranks (a tensor on the device: NCCL reduces no other).
        device = self.actor.device
        return {key: all_reduce_mean(torch.tensor(float(value), device=device)).item()
                for key, value in round_stats.items()}

    def train_unsupervised(self, batch, unsup_coef):
        """One step of the pretraining (language-modelling) loss on the actor, scaled by unsup_coef."""
        lm_loss = causal_lm_loss(self.actor, {"input_ids": batch["input_ids"], "labels": batch["labels"],
                                              **model_forward_kwargs(self.actor.module, batch["attention_mask"])})
        loss = lm_loss * unsup_coef
        assert_finite(loss, "the unsupervised loss")
        self.actor.backward(loss)
        self.actor.step()
        return lm_loss.item()

    # ---- evaluation -------------------------------------------------------------------------------------------

    def evaluate(self, prompts, checker=None):
        """The actor's scores on held-out `prompts` as it is now, by `inference.evaluation.evaluate_models`: one
        sampled answer each (at the rollout temperature and top-p, from --seed, so every evaluation of a run
        samples alike) and the greedy one, up to --max_answer_seq_len tokens, in batches of a round's rollouts or
        BATCH_SIZE rows, the larger (decoding holds far less per row than training); `checker`'s scores ("all" and per
        group, e.g. a reasoning-gym verifier's `summarize`, by task; by default the built-in task's checker on its
        prompts), and "reward", the mean end score of the reward sources.
        Every rank runs it (ZeRO-3 gathers the weights collectively); random states are left as they were.
        Returns {"sampled": scores, "greedy": scores}, each with `answer_scalars`' figures (the best constant
        answer's score, distinct answers, the most frequent one's share, answers cut at the limit)."""
        args = self.args
        self.actor.eval()
        with gathered_for_generation(self.actor):
            results = evaluate_models({"actor": (self.actor.module, self.tokenizer)}, prompts,
                                      max_new_tokens=args.max_answer_seq_len, temperature=args.temperature,
                                      top_p=args.top_p, seed=args.seed, reward_fn=self.score_texts,
                                      checker=checker, batch_size=max(rollouts_per_batch(args), BATCH_SIZE),
                                      tools=self.tools)
        self.actor.train()
        self.evaluation_seconds = results["actor"]["seconds"]  # each decoding's, for --deadline's reserve
        stats = results["actor"]["answer_stats"]
        return {decoding: {**results["actor"][decoding], **answer_scalars(stats[decoding])} for decoding in DECODINGS}


def mean_stats(rows):
    """The mean of each statistic over the rows that have it (a skipped minibatch has no losses)."""
    keys = dict.fromkeys(key for row in rows for key in row)
    return {key: sum(row[key] for row in rows if key in row) / sum(key in row for row in rows) for key in keys}


def gather_all(values):
    """Concatenate a 1-D tensor across ranks (itself on a world of one)."""
    if not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
        return values.detach()
    parts = [torch.zeros_like(values) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(parts, values.detach().contiguous())
    return torch.cat(parts)
