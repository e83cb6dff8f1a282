"""Step 3's flags (DeepSpeed-Chat's names) and their checks."""
import argparse
import math

from utils.rl.kl import KL_ESTIMATORS
from utils.rl.losses import LOSS_AGG_MODES
from utils.runtime.args import (AUTO, SCHEDULERS, ArgumentParser, add_checkpoint_args, add_data_args,
                                check_common_args, length_or_auto)
from utils.runtime.ds_utils import DTYPES
from utils.runtime.errors import ConfigError

ADVANTAGE_ESTIMATORS = ("gae", "grpo", "rloo", "reinforce_pp")
GROUP_ESTIMATORS = ("grpo", "rloo")


def uses_critic(args):
    """Only GAE learns a value function; the critic-free estimators create, train and save no critic."""
    return args.advantage_estimator == "gae"


def parse_args(argv=None):
    parser = ArgumentParser(description="Step 3: RLHF with PPO (or a critic-free estimator), from the step-1 actor "
                                        "and the step-2 reward model or a reward function.")
    add_data_args(parser)
    add = parser.add_argument
    add("--unsupervised_dataset_name", type=str, default=None,
        help="Plain text for the pretraining loss: 'builtin', a local .txt/.jsonl file, or a hub data set.")
    add("--unsupervised_dataset_config_name", type=str, default=None)
    add("--unsup_coef", type=float, default=27.8, help="Weight of the unsupervised loss (InstructGPT's gamma).")
    add("--actor_model_name_or_path", type=str, required=True, help="The step-1 model.")
    add("--critic_model_name_or_path", type=str, default=None,
        help="The step-2 reward model: the reward model, and the critic's start with --advantage_estimator gae "
             "(needed then); optional for a critic-free estimator with --reward_fn.")
    add("--num_padding_at_beginning", type=int, default=0)
    add("--trust_remote_code", action="store_true")
    # batches and lengths
    add("--per_device_generation_batch_size", type=int, default=16,
        help="Prompts per batch; each is answered --num_samples_per_prompt times.")
    add("--per_device_training_batch_size", type=int, default=16)
    add("--generation_batches", type=int, default=1, help="Prompt batches of experience per PPO round.")
    add("--ppo_epochs", type=int, default=1)
    add("--max_prompt_seq_len", type=length_or_auto, default=256,
        help="Longest prompt (longer ones are skipped), or auto: the longest prompt of the data.")
    add("--max_answer_seq_len", type=length_or_auto, default=256,
        help="Longest answer generated, or auto: twice the longest reference answer of the data.")
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
    add("--normalize_reward", action=argparse.BooleanOptionalAction, default=None,
        help="Normalise scores by the running mean and std of all scores seen (default: on with gae, off for the "
             "critic-free estimators, which normalise by their own baseline).")
    add("--whiten_advantages", action=argparse.BooleanOptionalAction, default=True, help="GAE's advantages.")
    add("--missing_eos_penalty", type=float, default=1.0,
        help="Subtracted from the score of an answer that never emits EOS (0: none).")
    add("--critic_warmup_steps", type=int, default=0, help="PPO rounds that train the critic only.")
    add("--cliprange", type=float, default=0.2)
    add("--cliprange_low", type=float, default=None, help="Lower clip of the ratio, 1 - this (default --cliprange).")
    add("--cliprange_high", type=float, default=None,
        help="Upper clip of the ratio, 1 + this (default --cliprange); larger: DAPO's clip-higher (e.g. 0.28).")
    add("--loss_agg_mode", type=str, default="token_mean", choices=LOSS_AGG_MODES,
        help="How per-token losses are averaged: over all tokens, or per answer (summed or averaged) then over "
             "answers (utils/rl/losses.py aggregate_loss).")
    add("--cliprange_value", type=float, default=0.2)
    add("--gamma", type=float, default=1.0)
    add("--lam", type=float, default=0.95)
    # critic-free estimators and reward functions
    add("--advantage_estimator", type=str, default="gae", choices=ADVANTAGE_ESTIMATORS,
        help="gae: PPO with a critic; grpo, rloo: group baselines over --num_samples_per_prompt answers; "
             "reinforce_pp: REINFORCE++ (KL in the reward, batch-whitened returns). Only gae creates a critic.")
    add("--num_samples_per_prompt", type=int, default=1, help="Answers sampled per prompt in one rollout.")
    add("--no_std_normalization", action="store_true",
        help="grpo: advantages r - group mean, without dividing by the group's std (Dr. GRPO).")
    add("--use_kl_loss", action="store_true",
        help="The KL to the reference as a loss term (--kl_loss_coef x --kl_loss_estimator) instead of a penalty "
             "in the reward (--kl_coef).")
    add("--kl_loss_coef", type=float, default=0.001)
    add("--kl_loss_estimator", type=str, default="k3", choices=KL_ESTIMATORS)
    add("--filter_zero_variance", action="store_true",
        help="Drop from the loss the groups whose answers all got the same score (DAPO's dynamic sampling); "
             "their count is logged as zero_variance_groups.")
    add("--overlong_penalty", type=float, default=0.0,
        help="Subtracted in full from the score of an answer that fills --max_answer_seq_len, in part from one "
             "within --overlong_buffer tokens of it (DAPO's soft overlong punishment; 0: none).")
    add("--overlong_buffer", type=int, default=1, help="Tokens before --max_answer_seq_len where it starts.")
    add("--reward_fn", type=str, default=None,
        help="Score answers with a function: 'builtin' (the built-in task's checker, [0, 1]), a registered name, "
             "package.module:function or path/to/file.py:function, called on (prompts, answers) -> floats "
             "(utils/rl/reward_fns.py).")
    add("--reward_fn_weight", type=float, default=1.0,
        help="The end score is reward_fn_weight x the reward function's score + reward_model_weight x the "
             "reward model's, of those given.")
    add("--reward_model_weight", type=float, default=1.0)
    add("--eval_interval", type=int, default=0,
        help="Every N steps (and before the first and after the last) score the actor on held-out prompts, "
             "sampled and greedy: the built-in task's with its checker, else the data's eval split (0: never).")
    add("--eval_prompts", type=int, default=100, help="How many held-out prompts --eval_interval scores.")
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
                 "ppo_epochs"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name} must be at least 1, not {getattr(args, name)}")
    check_rl_args(args)
    rollouts = args.per_device_generation_batch_size * args.num_samples_per_prompt
    if rollouts % args.per_device_training_batch_size:
        group = args.num_samples_per_prompt
        times = f" x --num_samples_per_prompt ({group})" if group > 1 else ""
        raise ConfigError(f"--per_device_generation_batch_size ({args.per_device_generation_batch_size}){times} must "
                          f"be a multiple of --per_device_training_batch_size ({args.per_device_training_batch_size})")
    if args.only_optimize_lora and args.actor_lora_dim <= 0 and args.critic_lora_dim <= 0:
        raise ConfigError("--only_optimize_lora needs --actor_lora_dim or --critic_lora_dim > 0")
    if args.inference_tp_size > 1 and args.actor_zero_stage != 3:
        raise ConfigError("--inference_tp_size > 1 needs --actor_zero_stage 3")
    if args.offload and 0 in (args.actor_zero_stage, args.critic_zero_stage if uses_critic(args) else 1):
        raise ConfigError("--offload needs --actor_zero_stage and --critic_zero_stage of 1, 2 or 3 (it moves "
                          "optimizer state to the CPU)")
    args.reward_clip = args.reward_clip or None


def check_rl_args(args):
    """The estimator, its reward sources and loss variants fit together."""
    estimator, group = args.advantage_estimator, args.num_samples_per_prompt
    if not args.critic_model_name_or_path:
        if uses_critic(args):
            raise ConfigError("--advantage_estimator gae needs --critic_model_name_or_path (the step-2 reward "
                              "model: the reward model and the critic's start)")
        if not args.reward_fn:
            raise ConfigError(f"--advantage_estimator {estimator} needs a reward: --reward_fn (e.g. builtin) or "
                              "--critic_model_name_or_path (a step-2 reward model), or both")
    if group < 1:
        raise ConfigError(f"--num_samples_per_prompt must be at least 1, not {group}")
    if estimator in GROUP_ESTIMATORS and group < 2:
        raise ConfigError(f"--advantage_estimator {estimator} compares the answers to one prompt: it needs "
                          f"--num_samples_per_prompt of at least 2, not {group}")
    if args.filter_zero_variance and group < 2:
        raise ConfigError("--filter_zero_variance needs --num_samples_per_prompt of at least 2 (groups to compare)")
    if args.critic_warmup_steps and not uses_critic(args):
        raise ConfigError(f"--critic_warmup_steps: --advantage_estimator {estimator} has no critic to warm up")
    for name in ("cliprange_low", "cliprange_high", "kl_loss_coef", "overlong_penalty"):
        value = getattr(args, name)
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise ConfigError(f"--{name} must be a finite number >= 0, not {value}")
    for name in ("reward_fn_weight", "reward_model_weight"):
        if not math.isfinite(getattr(args, name)):
            raise ConfigError(f"--{name} must be a finite number, not {getattr(args, name)}")
    longest = float("inf") if args.max_answer_seq_len == AUTO else args.max_answer_seq_len
    if not 1 <= args.overlong_buffer <= longest:
        raise ConfigError(f"--overlong_buffer must be in [1, --max_answer_seq_len {args.max_answer_seq_len}], not "
                          f"{args.overlong_buffer}")
    if args.eval_interval < 0 or args.eval_prompts < 1:
        raise ConfigError(f"--eval_interval must be >= 0 and --eval_prompts >= 1, not {args.eval_interval} and "
                          f"{args.eval_prompts}")
    if args.normalize_reward is None:
        args.normalize_reward = uses_critic(args)
