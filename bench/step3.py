"""Step 3 on the tiny model, through the real RLHF engine and PPO trainer with the tiny recipe's flags: rollout
throughput against plain Hugging Face `generate`, and where the time of a PPO step goes."""
import itertools
import random
import time

import torch

from bench.measure import paired_rates
from bench.models import model_path, reward_model_path
from inference.generation import load_causal_lm
from training.recipes import recipe_flags
from training.step3_rlhf_finetuning.arguments import parse_args
from utils.data.data_utils import DataCollatorRLHF, create_prompt_dataset, make_dataloader
from utils.model.model_utils import load_tokenizer
from utils.runtime.ds_utils import resolve_dtype
from utils.runtime.progress import progress
from utils.trainer.ppo_trainer import PPOTrainer, answer_action_mask
from utils.trainer.rlhf_engine import DeepSpeedRLHFEngine


def step3_args(actor_path, critic_path, dtype="auto"):
    """Step 3's parsed flags as `train.py` passes them for the tiny model (training/recipes.py)."""
    args = parse_args(["--actor_model_name_or_path", actor_path, "--critic_model_name_or_path", critic_path,
                       "--output_dir", "unused", "--dtype", dtype, *recipe_flags("tiny", 3)])
    args.dtype = resolve_dtype(args.dtype)
    return args


def build_trainer(model_name="tiny", dtype="auto"):
    """(trainer, args, tokenizer): the RLHF engine and PPO trainer as step 3's main builds them, the actor from
    the bench model and the critic and reward model from a reward-model folder on its backbone."""
    actor_path = model_path(model_name)
    critic_path = reward_model_path(actor_path)
    tokenizer = load_tokenizer(actor_path)
    args = step3_args(actor_path, critic_path, dtype)
    engine = DeepSpeedRLHFEngine(actor_path, critic_path, tokenizer, args, actor_steps=10 ** 6, critic_steps=10 ** 6, world_size=1)
    return PPOTrainer(engine, args), args, tokenizer


def prompt_batches(args, tokenizer, count):
    """`count` prompt batches of step 3's data, as its loader yields them."""
    dataset, _ = create_prompt_dataset(args.data_path, args.data_split, args.data_output_path, 3, args.seed,
                                       tokenizer, args.max_prompt_seq_len)
    loader = make_dataloader(dataset, DataCollatorRLHF(tokenizer.pad_token_id), args.per_device_generation_batch_size,
                             True, args.seed)
    return list(itertools.islice(loader, count))


# ---- rollouts -------------------------------------------------------------------------------------------------

def plain_generate(model, args, tokenizer, prompts, prompt_mask):
    """The baseline: Hugging Face `generate` with its KV cache, sampling with the same temperature and top-p (and
    top-k off, as ours), nothing else set."""
    return model.generate(input_ids=prompts, attention_mask=prompt_mask, max_new_tokens=args.max_answer_seq_len,
                          do_sample=True, temperature=args.temperature, top_p=args.top_p, top_k=0, use_cache=True,
                          eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)


def rollout_runner(generate, batches, seed, eos_token_id, outputs):
    """`() -> (units, seconds)` generating for every prompt batch in turn, each from a fixed seed, so ours and the
    baseline sample the same answers; units are the generated tokens (up to and including the first EOS, as step
    3 counts them). The sequences are appended to `outputs`."""
    def run():
        tokens = seconds = 0.0
        for index, batch in enumerate(batches):
            torch.manual_seed(seed + index)
            start = time.perf_counter()
            with torch.no_grad():
                seq = generate(batch["prompt"], batch["prompt_att_mask"])
            seconds += time.perf_counter() - start
            outputs.append(seq)
            tokens += answer_action_mask(seq[:, batch["prompt"].shape[1]:], eos_token_id).sum().item()
        return {"tokens": tokens}, seconds

    return run


def measure_rollout(trainer, args, tokenizer, batches, repeats, warmup):
    """Generated tokens/s of `PPOTrainer.generate_sequence` against plain `generate` on a separately loaded copy
    of the same model, in pairs; and whether the two sampled the very same tokens."""
    baseline_model, _ = load_causal_lm(args.actor_model_name_or_path, args.dtype)
    trainer.actor.eval()
    ours_out, base_out = [], []
    rates = paired_rates(
        rollout_runner(trainer.generate_sequence, batches, args.seed, tokenizer.eos_token_id, ours_out),
        rollout_runner(lambda p, m: plain_generate(baseline_model, args, tokenizer, p, m), batches, args.seed,
                       tokenizer.eos_token_id, base_out), repeats, warmup, desc="rollouts")
    trainer.actor.train()
    rates["same_tokens"] = all(torch.equal(a, b) for a, b in zip(ours_out, base_out))
    rates.update(batch_size=args.per_device_generation_batch_size, max_prompt_len=args.max_prompt_seq_len,
                 max_new_tokens=args.max_answer_seq_len, dtype=args.dtype)
    return rates


# ---- PPO steps ------------------------------------------------------------------------------------------------

class ExperienceTimers:
    """Times the forward passes of experience making (actor and reference log-probs, critic values, reward
    score) by wrapping the trainer's calls; records only while `active`, since training calls some of them too."""

    def __init__(self, trainer):
        self.active, self.seconds = False, {}
        trainer.answer_logprobs = self._wrap(trainer.answer_logprobs,
                                             lambda model, *a, **k: "actor" if model is trainer.actor else "ref")
        trainer.answer_values = self._wrap(trainer.answer_values, lambda *a, **k: "critic")
        reward = trainer.reward.module
        reward.forward_value = self._wrap(reward.forward_value, lambda *a, **k: "reward")

    def _wrap(self, fn, name_of):
        def timed_call(*args, **kwargs):
            if not self.active:
                return fn(*args, **kwargs)
            start = time.perf_counter()
            result = fn(*args, **kwargs)
            name = name_of(*args, **kwargs)
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
            return result

        return timed_call

    def collect(self):
        seconds, self.seconds = self.seconds, {}
        return seconds


def ppo_step(trainer, args, batch, timers, shuffler):
    """One step of step 3's loop (one batch of experience, then `PPOTrainer.train_round`), timed part by part: seconds of
    generation, of each experience forward pass, of training, and the rest, and the step's wall time."""

    start = time.perf_counter()
    timers.active = True
    experience = trainer.generate_experience(batch["prompt"], batch["prompt_att_mask"])
    timers.active = False
    stats = trainer.train_round([experience], None, shuffler, train_actor=True)
    if "kl" in stats:
        trainer.kl_controller.update(stats["kl"], args.per_device_generation_batch_size * args.generation_batches)
    total = time.perf_counter() - start
    parts = {"generation": stats["generate_time"]}
    parts.update({f"experience_{name}": seconds for name, seconds in timers.collect().items()})
    parts["training"] = stats["train_time"]
    parts["other"] = total - sum(parts.values())
    return parts, total


def measure_ppo(trainer, args, batches, repeats, warmup):
    """Seconds per PPO step by part (and each part's share of the step), and samples/s end to end."""
    timers = ExperienceTimers(trainer)
    shuffler = random.Random(args.seed)
    stream = itertools.cycle(batches)
    for _ in progress(range(warmup), desc="ppo warm-up", unit="step"):
        ppo_step(trainer, args, next(stream), timers, shuffler)
    result = {"seconds": {}, "share": {}, "samples_per_s": [], "step_seconds": []}
    for _ in progress(range(repeats), desc="ppo", unit="step"):
        parts, total = ppo_step(trainer, args, next(stream), timers, shuffler)
        for name, seconds in parts.items():
            result["seconds"].setdefault(name, []).append(seconds)
            result["share"].setdefault(name, []).append(seconds / total)
        result["step_seconds"].append(total)
        result["samples_per_s"].append(args.per_device_generation_batch_size * args.generation_batches / total)
    result.update(generation_batch_size=args.per_device_generation_batch_size,
                  training_batch_size=args.per_device_training_batch_size, ppo_epochs=args.ppo_epochs,
                  max_prompt_len=args.max_prompt_seq_len, max_new_tokens=args.max_answer_seq_len, dtype=args.dtype)
    return result
