"""Step 3: RLHF with PPO, from the step-1 actor and the step-2 reward model.

Each step samples answers to a batch of prompts (--generation_batches batches make one round of experience),
scores them with the reward model, subtracts a KL penalty against the frozen reference, computes GAE advantages
with the critic, then runs --ppo_epochs passes of clipped-PPO updates over minibatches of the experience
(plus, with --unsupervised_dataset_name, a language-modelling step on plain text per minibatch, scaled by
--unsup_coef). Saves `actor/`, `critic/` and, with --enable_ema, `actor_ema/` in --output_dir.
With --save_steps N a resumable checkpoint (both engines, the EMA, the KL controller, reward moments, minibatch
shuffler and metric history) is written between PPO rounds every N prompt batches, and --resume continues from
the latest one exactly as the uninterrupted run would have gone on.
"""
import argparse
import itertools
import math
import random
import time

import torch

from training.step3_rlhf_finetuning import ppo_math
from training.step3_rlhf_finetuning.ppo_trainer import PPOTrainer, split_experience
from training.step3_rlhf_finetuning.rlhf_engine import DeepSpeedRLHFEngine, moving_average
from utils.args import ArgumentParser, SCHEDULERS, add_checkpoint_args, add_data_args, check_common_args
from utils.checkpoint import (Checkpointer, CountingIterator, TrainingPosition, python_random_state,
                              set_python_random_state)
from utils.data_utils import (DataCollatorRLHF, DataCollatorSFT, create_prompt_dataset, create_unsupervised_dataset,
                              make_dataloader)
from utils.ds_utils import DTYPES
from utils.engine import start_run, write_metrics
from utils.errors import ConfigError, cli_entry
from utils.model_utils import is_reward_model_folder, load_tokenizer, resolve_model_path
from utils.monitor import Monitor, format_scalars
from utils.save import save_hf_model
from utils.utils import all_reduce_mean, print_rank_0, to_device


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    add_data_args(parser)
    add = parser.add_argument
    add("--unsupervised_dataset_name", type=str, default=None,
        help="Plain text for the pretraining loss: 'builtin', a local .txt/.jsonl file, or a hub data set.")
    add("--unsupervised_dataset_config_name", type=str, default=None)
    add("--unsup_coef", type=float, default=27.8, help="Weight of the unsupervised loss (InstructGPT's gamma).")
    add("--actor_model_name_or_path", type=str, required=True, help="The step-1 model.")
    add("--critic_model_name_or_path", type=str, required=True, help="The step-2 reward model.")
    add("--num_padding_at_beginning", type=int, default=0)
    add("--trust_remote_code", action="store_true")
    # batches and lengths
    add("--per_device_generation_batch_size", type=int, default=16)
    add("--per_device_training_batch_size", type=int, default=16)
    add("--generation_batches", type=int, default=1, help="Prompt batches of experience per PPO round.")
    add("--ppo_epochs", type=int, default=1)
    add("--max_prompt_seq_len", type=int, default=256)
    add("--max_answer_seq_len", type=int, default=256)
    add("--num_train_epochs", type=int, default=1)
    add("--max_steps", type=int, default=0, help="Stop after this many prompt batches (0: all epochs).")
    add("--gradient_accumulation_steps", type=int, default=1)
    # optimisation
    add("--actor_learning_rate", type=float, default=9.65e-6)
    add("--critic_learning_rate", type=float, default=5e-6)
    add("--actor_weight_decay", type=float, default=0.0)
    add("--critic_weight_decay", type=float, default=0.0)
    add("--lr_scheduler_type", type=str, default="cosine", choices=SCHEDULERS)
    add("--num_warmup_steps", type=int, default=100)
    add("--seed", type=int, default=1234)
    # DeepSpeed and memory
    add("--local_rank", type=int, default=-1)
    add("--enable_hybrid_engine", action="store_true",
        help="Actor as a DeepSpeedHybridEngine (inference kernels for generation on CUDA; native generate on CPU).")
    add("--unpin_actor_parameters", action="store_true")
    add("--release_inference_cache", action="store_true")
    add("--inference_tp_size", type=int, default=1)
    add("--tp_gather_partition_size", type=int, default=8)
    add("--offload", action="store_true")
    add("--offload_reference_model", action="store_true")
    add("--offload_reward_model", action="store_true")
    add("--dtype", type=str, default="auto", choices=DTYPES)
    add("--actor_zero_stage", type=int, default=0, choices=(0, 1, 2, 3))
    add("--critic_zero_stage", type=int, default=0, choices=(0, 1, 2, 3))
    add("--actor_gradient_checkpointing", action="store_true")
    add("--critic_gradient_checkpointing", action="store_true")
    add("--actor_dropout", type=float, default=0.0, help="Dropout of actor and reference (0: off, as PPO wants).")
    add("--critic_dropout", type=float, default=0.0, help="Dropout of critic and reward model.")
    # LoRA
    add("--actor_lora_dim", type=int, default=0)
    add("--actor_lora_module_name", type=str, default="layers.")
    add("--critic_lora_dim", type=int, default=0)
    add("--critic_lora_module_name", type=str, default="layers.")
    add("--only_optimize_lora", action="store_true")
    add("--actor_lora_learning_rate", type=float, default=5e-4)
    add("--critic_lora_learning_rate", type=float, default=5e-4)
    add("--enable_ema", action="store_true", help="Keep an exponential moving average of the actor (actor_ema/).")
    add("--ema_beta", type=float, default=0.992)
    # PPO
    add("--temperature", type=float, default=1.0, help="Sampling temperature of rollouts and of their log-probs.")
    add("--top_p", type=float, default=1.0, help="Nucleus sampling of rollouts.")
    add("--generation_backend", type=str, default="native", choices=("native", "hf"),
        help="Rollout sampler: native (inference/sampling.py: a KV-cache loop that drops finished rows, runs a "
             "shared prompt prefix once and draws one uniform per row; faster on CPU) or hf (Hugging Face "
             "generate). Models whose forward takes no position_ids always use hf.")
    add("--kl_coef", type=float, default=0.1, help="KL penalty coefficient (initial value if adaptive).")
    add("--kl_estimator", type=str, default="k1", choices=("k1", "k2", "k3"))
    add("--adaptive_kl_target", type=float, default=0.0,
        help="Target KL (nats per sequence) of the adaptive KL controller; 0 keeps --kl_coef fixed.")
    add("--adaptive_kl_horizon", type=float, default=10000)
    add("--reward_clip", type=float, default=5.0, help="Clip the score to [-c, c] (0: no clipping).")
    add("--normalize_reward", action=argparse.BooleanOptionalAction, default=True,
        help="Normalise scores by the running mean and std of all scores seen.")
    add("--whiten_advantages", action=argparse.BooleanOptionalAction, default=True)
    add("--missing_eos_penalty", type=float, default=1.0,
        help="Subtracted from the score of an answer that never emits EOS (0: none).")
    add("--critic_warmup_steps", type=int, default=0, help="PPO rounds that train the critic only.")
    add("--cliprange", type=float, default=0.2)
    add("--cliprange_value", type=float, default=0.2)
    add("--gamma", type=float, default=1.0)
    add("--lam", type=float, default=0.95)
    # output
    add("--output_dir", type=str, required=True)
    add("--enable_tensorboard", action="store_true")
    add("--tensorboard_path", type=str, default="step3_tensorboard")
    add("--print_answers", action="store_true")
    add("--print_answers_interval", type=int, default=10)
    add("--print_interval", type=int, default=1)
    add_checkpoint_args(parser)
    args = parser.parse_args(argv)
    check_args(args)
    return args


def check_args(args):
    check_common_args(args)
    for name in ("per_device_generation_batch_size", "per_device_training_batch_size", "generation_batches",
                 "ppo_epochs", "max_prompt_seq_len", "max_answer_seq_len"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name} must be at least 1, not {getattr(args, name)}")
    if args.per_device_generation_batch_size % args.per_device_training_batch_size:
        raise ConfigError(f"--per_device_generation_batch_size ({args.per_device_generation_batch_size}) must be a "
                          f"multiple of --per_device_training_batch_size ({args.per_device_training_batch_size})")
    if args.only_optimize_lora and args.actor_lora_dim <= 0 and args.critic_lora_dim <= 0:
        raise ConfigError("--only_optimize_lora needs --actor_lora_dim or --critic_lora_dim > 0")
    if args.inference_tp_size > 1 and args.actor_zero_stage != 3:
        raise ConfigError("--inference_tp_size > 1 needs --actor_zero_stage 3")
    if args.offload and 0 in (args.actor_zero_stage, args.critic_zero_stage):
        raise ConfigError("--offload needs --actor_zero_stage and --critic_zero_stage of 1, 2 or 3 (it moves "
                          "optimizer state to the CPU)")
    if args.temperature <= 0 or not 0 < args.top_p <= 1:
        raise ConfigError("--temperature must be positive and --top_p in (0, 1]")
    args.reward_clip = args.reward_clip or None


def resolve_step_models(args):
    """The actor must be a causal LM (step 1 output) and the critic a reward model (step 2 output)."""
    actor_path = resolve_model_path(args.actor_model_name_or_path)
    critic_path = resolve_model_path(args.critic_model_name_or_path)
    if is_reward_model_folder(actor_path):
        raise ConfigError(f"--actor_model_name_or_path {actor_path} is a reward model (step 2 output); pass the "
                          "step-1 actor")
    if not is_reward_model_folder(critic_path):
        raise ConfigError(f"--critic_model_name_or_path {critic_path} is not a reward model folder (step 2 output)")
    return actor_path, critic_path


def make_kl_controller(args):
    if args.adaptive_kl_target > 0:
        return ppo_math.AdaptiveKLController(args.kl_coef, args.adaptive_kl_target, args.adaptive_kl_horizon)
    return ppo_math.FixedKLController(args.kl_coef)


@cli_entry
def main(argv=None):
    args = parse_args(argv)
    start_time = time.time()
    _, world_size, device = start_run(args)

    # Data
    actor_path, critic_path = resolve_step_models(args)
    tokenizer = load_tokenizer(actor_path, args.trust_remote_code)
    prompt_dataset, _ = create_prompt_dataset(args.data_path, args.data_split, args.data_output_path, 3, args.seed,
                                              tokenizer, args.max_prompt_seq_len)
    prompt_loader = make_dataloader(prompt_dataset, DataCollatorRLHF(tokenizer.pad_token_id),
                                    args.per_device_generation_batch_size, True, args.seed)
    unsup_batches = None
    if args.unsupervised_dataset_name:
        unsup_dataset = create_unsupervised_dataset(args.unsupervised_dataset_name,
                                                    args.unsupervised_dataset_config_name, tokenizer,
                                                    args.max_prompt_seq_len + args.max_answer_seq_len, args.seed)
        unsup_batches = CountingIterator(itertools.cycle(make_dataloader(
            unsup_dataset, DataCollatorSFT(tokenizer.pad_token_id), args.per_device_training_batch_size, True,
            args.seed)))

    # Models
    steps_per_epoch = len(prompt_loader) // args.generation_batches * args.generation_batches
    total_steps = args.num_train_epochs * steps_per_epoch
    total_steps = min(total_steps, args.max_steps) if args.max_steps else total_steps
    minibatches = args.per_device_generation_batch_size // args.per_device_training_batch_size
    num_total_iters = math.ceil(total_steps * minibatches * args.ppo_epochs / args.gradient_accumulation_steps)
    engine = DeepSpeedRLHFEngine(actor_path, critic_path, tokenizer, args, num_total_iters, world_size)
    trainer = PPOTrainer(engine, args, make_kl_controller(args), ppo_math.RunningMoments())
    print_rank_0(f"PPO: {len(prompt_dataset)} prompts, {total_steps} steps of {args.per_device_generation_batch_size}"
                 f" x {world_size} rollouts, {args.ppo_epochs} PPO epoch(s) of {minibatches} minibatch(es)")

    # Loop (resumed from the latest checkpoint with --resume; checkpoints are written between PPO rounds)
    position = TrainingPosition(prompt_loader)
    checkpointer = Checkpointer(args.output_dir, args.save_steps, args.save_total_limit,
                                {"actor": engine.actor, "critic": engine.critic}, position,
                                weights={"actor_ema": engine.actor_ema})
    shuffler = random.Random(args.seed)
    history, experiences, step = [], [], 0
    resumed = checkpointer.resume() if args.resume else None
    if resumed:
        step, history = resumed["step"], resumed["history"]
        trainer.load_state_dict(resumed["trainer"])
        set_python_random_state(resumed["shuffler"], shuffler)
        if unsup_batches is not None:
            unsup_batches.skip(resumed["unsup_batches_drawn"])
    monitor = Monitor(args.enable_tensorboard, args.tensorboard_path, "step3_ppo")
    for epoch in position.epochs(args.num_train_epochs):
        for _, batch in position.batches(epoch):
            if step >= total_steps:
                break
            batch = to_device(batch, device)
            experiences.append(trainer.generate_experience(batch["prompt"], batch["prompt_att_mask"]))
            step += 1
            if len(experiences) < args.generation_batches:
                continue
            stats = ppo_round(trainer, experiences, args, unsup_batches, engine, shuffler,
                              train_actor=step > args.critic_warmup_steps * args.generation_batches)
            trainer.kl_controller.update(stats["kl"], args.per_device_generation_batch_size * world_size
                                         * args.generation_batches)
            stats["kl_coef"] = trainer.kl_controller.value
            history.append(stats)
            if step % args.print_interval == 0 or step == total_steps:
                recent = mean_stats(history[-max(1, args.print_interval // args.generation_batches):])
                window = f" (mean of the last {args.print_interval})" if args.print_interval > 1 else ""
                print_rank_0(f"epoch {epoch + 1} step {step}/{total_steps}{window}: {format_scalars(**recent)}")
            monitor.write(step, "ppo", **stats)
            if args.print_answers and step % args.print_answers_interval == 0:
                print_sample(experiences[0], tokenizer)
            experiences = []
            checkpointer.save_if_due(step, total_steps, {
                "history": history, "trainer": trainer.state_dict(), "shuffler": python_random_state(shuffler),
                "unsup_batches_drawn": unsup_batches.drawn if unsup_batches is not None else 0})
    monitor.close()

    # Save
    for name, model_engine in (("actor", engine.actor), ("critic", engine.critic), ("actor_ema", engine.actor_ema)):
        if model_engine is not None:
            save_hf_model(model_engine.module, tokenizer, f"{args.output_dir}/{name}",
                          model_engine.zero_optimization_stage())
    metrics = summarize(history, time.time() - start_time)
    write_metrics(args.output_dir, metrics)
    print_rank_0(f"saved {args.output_dir}; {format_scalars(**metrics)}")


def ppo_round(trainer, experiences, args, unsup_batches, engine, shuffler, train_actor):
    """ppo_epochs passes over the minibatches of this round's experience; the round's mean statistics."""
    minibatches = [mb for exp in experiences for mb in split_experience(exp, args.per_device_training_batch_size)]
    train_start = time.perf_counter()
    step_stats = []
    for _ in range(args.ppo_epochs):
        shuffler.shuffle(minibatches)
        for minibatch in minibatches:
            stats = trainer.train_rlhf(minibatch, train_actor)
            if unsup_batches is not None and train_actor:  # critic warm-up rounds leave the actor alone
                batch = to_device(next(unsup_batches), trainer.actor.device)
                stats["unsup_loss"] = trainer.train_unsupervised(batch, args.unsup_coef)
            if engine.actor_ema is not None:
                moving_average(engine.actor.module, engine.actor_ema.module, args.ema_beta)
            step_stats.append(stats)
    train_time = time.perf_counter() - train_start
    round_stats = {key: sum(s[key] for s in step_stats) / len(step_stats) for key in step_stats[0]}
    for key in experiences[0]["stats"]:
        round_stats[key] = sum(exp["stats"][key] for exp in experiences) / len(experiences)
    generate_time = sum(exp["stats"]["generate_time"] for exp in experiences)
    round_stats["tokens_per_s"] = sum(exp["stats"]["generated_tokens"] for exp in experiences) / generate_time
    round_stats["generate_time"], round_stats["train_time"] = generate_time, train_time
    del round_stats["generated_tokens"]
    # Every rank reports the same numbers: the mean over ranks.
    return {key: all_reduce_mean(torch.tensor(float(value))).item() for key, value in round_stats.items()}


def print_sample(experience, tokenizer):
    prompt_len = experience["prompt_len"]
    seq, mask = experience["seq"][0], experience["attention_mask"][0]
    prompt = tokenizer.decode(seq[:prompt_len][mask[:prompt_len].bool()], skip_special_tokens=True)
    answer = tokenizer.decode(seq[prompt_len:][mask[prompt_len:].bool()], skip_special_tokens=False)
    print_rank_0(f"  prompt: {prompt!r}\n  answer: {answer!r}")


def mean_stats(rows):
    """The mean of each statistic over the rows that have it."""
    keys = dict.fromkeys(key for row in rows for key in row)
    return {key: sum(row[key] for row in rows if key in row) / sum(key in row for row in rows) for key in keys}


def summarize(history, wall_time):
    """Mean reward-model score and KL over the first and last tenth of the run, and the wall time."""
    if not history:
        return {"wall_time_s": wall_time}
    window = max(1, len(history) // 10)
    first, last = mean_stats(history[:window]), mean_stats(history[-window:])
    return {"score_start": first["score"], "score_end": last["score"], "reward_start": first["reward"],
            "reward_end": last["reward"], "kl_end": last["kl"], "answer_length_end": last["answer_length"],
            "eos_fraction_end": last["eos_fraction"], "steps": len(history), "wall_time_s": wall_time}


if __name__ == "__main__":
    main()
