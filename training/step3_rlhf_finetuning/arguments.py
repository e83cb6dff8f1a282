"""Step 3's flags (DeepSpeed-Chat's names) and their checks."""
import argparse

from utils.runtime.args import SCHEDULERS, ArgumentParser, add_checkpoint_args, add_data_args, check_common_args
from utils.runtime.ds_utils import DTYPES
from utils.runtime.errors import ConfigError


def parse_args(argv=None):
    parser = ArgumentParser(description="Step 3: RLHF with PPO, from the step-1 actor and the step-2 reward model.")
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
    args.reward_clip = args.reward_clip or None
