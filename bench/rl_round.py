"""A critic-free RL round (bench section `grpo`): step 3 as the SmolLM2 reasoning-gym recipe runs it (GRPO, 4
prompts x 8 answers, training minibatches of 16, one epoch, a LoRA actor, no reference model), on the built-in
task's prompts with its checker as the reward. Ours takes the old policy's log-probs from the sampler
(`--rollout_logprobs`), the baseline from a forward pass of the actor over the rollouts; the rounds keep every
group (no --filter_zero_variance), so both sides train on the same number of rows."""
import random
import time

import torch

from bench.measure import paired_rates
from bench.models import model_path
from bench.step3 import prompt_batches
from training.recipes import SMOLLM2_VERIFIED_RL
from training.step3_rlhf_finetuning.arguments import parse_args
from utils.model.model_utils import load_tokenizer
from utils.rl.reward_fns import load_reward_fn
from utils.runtime.ds_utils import resolve_dtype
from utils.trainer.ppo_trainer import PPOTrainer
from utils.trainer.rlhf_engine import DeepSpeedRLHFEngine

DYNAMIC_SAMPLING = ("--filter_zero_variance", "--max_generation_batches", "--stop_after_idle_rounds")
ROUNDS = 2  # prompt batches (rounds) per timed run


def recipe_flags_without_dynamic_sampling():
    """The recipe's RL flags less dynamic sampling's (whose rounds would train on a varying number of rows)."""
    flags, skip = [], 0
    for flag in SMOLLM2_VERIFIED_RL:
        if skip:
            skip -= 1
        elif flag in DYNAMIC_SAMPLING:
            skip = 0 if flag == "--filter_zero_variance" else 1
        else:
            flags.append(flag)
    return flags


def build_grpo_trainer(model_name, dtype="auto"):
    """(trainer, args, tokenizer) of a critic-free GRPO step 3 on `model_name`, the reward the built-in checker."""
    actor_path = model_path(model_name)
    tokenizer = load_tokenizer(actor_path)
    args = parse_args(["--actor_model_name_or_path", actor_path, "--output_dir", "unused", "--dtype", dtype,
                       *recipe_flags_without_dynamic_sampling(), "--advantage_estimator", "grpo",
                       "--reward_fn", "builtin", "--actor_lora_dim", "16", "--only_optimize_lora",
                       "--max_prompt_seq_len", "64", "--max_answer_seq_len", "12", "--num_warmup_steps", "0"])
    args.dtype = resolve_dtype(args.dtype)
    engine = DeepSpeedRLHFEngine(actor_path, None, tokenizer, args, actor_steps=10 ** 6, critic_steps=0,
                                 world_size=1)
    return PPOTrainer(engine, args, load_reward_fn(args.reward_fn, args)), args, tokenizer


def round_runner(trainer, batches, seed, shuffler, rollout_logprobs):
    """`() -> ({"rollouts": n}, seconds)`: one RL round (experience, then the update) per prompt batch, each
    batch's sampling from a fixed seed, with --rollout_logprobs set as given."""
    def run():
        trainer.args.rollout_logprobs = rollout_logprobs
        rows = seconds = 0.0
        for index, batch in enumerate(batches):
            torch.manual_seed(seed + index)
            start = time.perf_counter()
            experience = trainer.generate_experience(batch["prompt"], batch["prompt_att_mask"],
                                                      batch["prompt_text"])
            stats = trainer.train_round([experience], None, shuffler, train_actor=True)
            seconds += time.perf_counter() - start
            rows += stats["trained_rows"]
        return {"rollouts": rows}, seconds

    return run


def measure_grpo_round(model_name, repeats, warmup):
    """Rollouts/s of RL rounds with the sampler's log-probs against a forward pass's, in pairs."""
    trainer, args, tokenizer = build_grpo_trainer(model_name)
    batches = prompt_batches(args, tokenizer, ROUNDS)
    shuffler = random.Random(args.seed)
    rates = paired_rates(round_runner(trainer, batches, args.seed, shuffler, True),
                         round_runner(trainer, batches, args.seed, shuffler, False), repeats, warmup,
                         desc=f"grpo round, {model_name}")
    rates.update(prompts=args.per_device_generation_batch_size, group=args.num_samples_per_prompt,
                 training_batch_size=args.per_device_training_batch_size, max_new_tokens=args.max_answer_seq_len,
                 rounds=ROUNDS, dtype=args.dtype)
    return rates
