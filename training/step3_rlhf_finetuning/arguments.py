"""Step 3's flags (DeepSpeed-Chat's names) and their checks."""
import argparse

from utils.rl.estimators import ESTIMATORS, uses_critic
from utils.rl.kl import KL_ESTIMATORS
from utils.rl.losses import LOSS_AGG_MODES
from utils.rl.policy_losses import POLICY_LOSSES
from utils.runtime.args import (ZERO_STAGES, ArgumentParser, add_checkpoint_args, add_data_args, add_eval_prompts_arg,
                                add_deepspeed_args, add_load_best_arg, add_logging_args,
                                add_num_padding_at_beginning_arg, add_offload_reference_model_arg,
                                add_only_optimize_lora_arg, add_reward_fn_arg, add_sampling_args, add_schedule_args,
                                add_tool_args, add_trust_remote_code_arg, check_common_args, is_auto, length_or_auto,
                                registry_help, rollouts_per_batch)
from utils.runtime.errors import ConfigError
from utils.runtime.tool_format import tool_use


def parse_args(argv=None):
    parser = ArgumentParser(description="Step 3: RLHF with PPO (or a critic-free estimator), from the step-1 actor "
                                        "and the step-2 reward model or a reward function.")
    add_data_args(parser, default_max_seq_len=None)
    add_model_args(parser)
    add_batch_args(parser)
    add_optimization_args(parser)
    add_engine_args(parser)
    add_lora_ema_args(parser)
    add_ppo_args(parser)
    add_critic_free_args(parser)
    add_tool_args(parser)
    add_output_args(parser)
    add_checkpoint_args(parser)
    args = parser.parse_args(argv)
    check_args(args)
    return args


def add_model_args(parser):
    group = parser.add_argument_group("models")
    add = group.add_argument
    add("--actor_model_name_or_path", type=str, required=True,
        help="The step-1 model (a folder, hub name or built-in name): the actor's start and the frozen reference.")
    add("--critic_model_name_or_path", type=str, default=None,
        help="The step-2 reward model: the reward model, and the critic's start with --advantage_estimator gae "
             "(needed then); optional for a critic-free estimator with --reward_fn.")
    add_num_padding_at_beginning_arg(group, passed_to="passed to the reward model and critic")
    add_trust_remote_code_arg(group)
    add("--unsupervised_dataset_name", type=str, default=None,
        help="Plain text for the pretraining loss: 'builtin', a local .txt file, a data file whose rows have a "
             "'text' field (.json, .jsonl, .parquet, .csv, .tsv), or a hub data set.")
    add("--unsupervised_dataset_config_name", type=str, default=None,
        help="The configuration name of a hub --unsupervised_dataset_name (via the datasets library).")
    add("--unsup_coef", type=float, default=27.8,
        help="Weight of the unsupervised loss (gamma in Equation 2 of the InstructGPT paper).")


def add_batch_args(parser):
    add = parser.add_argument_group("batches and lengths").add_argument
    add("--per_device_generation_batch_size", type=int, default=16,
        help="Prompts per batch (per device) for generation; each is answered --num_samples_per_prompt times.")
    add("--per_device_training_batch_size", type=int, default=16,
        help="Mini-batch size (per device) of the PPO training passes, in answers; must divide the rollouts of a "
             "prompt batch.")
    add("--generation_batches", type=int, default=1,
        help="Prompt batches of experience generated before each PPO round of training.")
    add("--ppo_epochs", type=int, default=1, help="For generated experience, how many PPO training epochs to run.")
    add("--max_prompt_seq_len", type=length_or_auto, default=256,
        help="The maximum prompt length in tokens (a longer prompt is skipped and counted), or auto: the 95th "
             "percentile of the data's prompt lengths, longer prompts dropped (auto:max the longest, auto:P the P-th), "
             "at most the model's context.")
    add("--max_answer_seq_len", type=length_or_auto, default=256,
        help="The maximum generated answer length in tokens, or auto: twice the 95th percentile of the reference "
             "answers' lengths (auto:max: twice the longest).")


def add_optimization_args(parser):
    group = parser.add_argument_group("optimisation")
    add = group.add_argument
    add_schedule_args(group, default_warmup_steps=100, steps="prompt batches")
    add("--actor_learning_rate", type=float, default=9.65e-6,
        help="Initial actor learning rate (after the potential warmup period) to use; default %(default)s.")
    add("--actor_weight_decay", type=float, default=0.0, help="Weight decay of the actor (AdamW's).")
    add("--actor_gradient_checkpointing", action="store_true",
        help="Enable HF gradient checkpointing for the actor: less memory for more time.")
    add("--critic_learning_rate", type=float, default=5e-6,
        help="Initial critic learning rate (after the potential warmup period) to use; default %(default)s.")
    add("--critic_weight_decay", type=float, default=0.0, help="Weight decay of the critic (AdamW's).")
    add("--critic_gradient_checkpointing", action="store_true",
        help="Enable HF gradient checkpointing for the critic: less memory for more time.")
    add("--actor_dropout", type=float, default=0.0,
        help="Dropout of actor and reference (default 0: off, as PPO wants experience and training to see the "
             "same function).")
    add("--critic_dropout", type=float, default=0.0, help="Dropout of critic and reward model (default 0: off).")


def add_engine_args(parser):
    group = add_deepspeed_args(
        parser, zero_stage=False,
        config_applies_to="both trained engines, the actor's and the critic's (the frozen reference, reward and "
                          "EMA models keep their inference configs)")
    add = group.add_argument
    add("--actor_zero_stage", type=int, default=0, choices=ZERO_STAGES,
        help="ZeRO optimization stage of the actor (and of its clones, the reference and the EMA): 0 to 3.")
    add("--critic_zero_stage", type=int, default=0, choices=ZERO_STAGES,
        help="ZeRO optimization stage of the critic (and of the reward model): 0 to 3.")
    add("--enable_hybrid_engine", action="store_true",
        help="Actor as a DeepSpeedHybridEngine (inference kernels for generation on CUDA; native generate on CPU).")
    add("--unpin_actor_parameters", action="store_true",
        help="Hybrid engine: unpin the actor's parameters during generation (slower generation, less memory).")
    add("--release_inference_cache", action="store_true",
        help="Hybrid engine: release the memory cache used for inference after each generation (slower "
             "preparation, room for larger batches).")
    add("--inference_tp_size", type=int, default=1,
        help="Hybrid engine: tensor-parallelism degree of generation (> 1 needs --actor_zero_stage 3).")
    add("--tp_gather_partition_size", type=int, default=8,
        help="Hybrid engine: layers gathered at a time for tensor-parallel generation (with --inference_tp_size "
             "> 1).")
    add_offload_reference_model_arg(group)
    add("--offload_reward_model", action="store_true",
        help="Enable ZeRO Offload for the frozen reward model: its parameters on the CPU.")


def add_lora_ema_args(parser):
    group = parser.add_argument_group("LoRA and EMA")
    add = group.add_argument
    add("--actor_lora_dim", type=int, default=0, help="LoRA rank of the actor; 0 disables LoRA.")
    add("--actor_lora_module_name", type=str, default="layers.",
        help="The scope of the actor's LoRA: comma-separated parts of the names of the linear layers it wraps.")
    add("--actor_lora_learning_rate", type=float, default=5e-4,
        help="Initial actor LoRA learning rate (after the potential warmup period) to use.")
    add("--critic_lora_dim", type=int, default=0, help="LoRA rank of the critic; 0 disables LoRA.")
    add("--critic_lora_module_name", type=str, default="layers.",
        help="The scope of the critic's LoRA: comma-separated parts of the names of the linear layers it wraps.")
    add("--critic_lora_learning_rate", type=float, default=5e-4,
        help="Initial critic LoRA learning rate (after the potential warmup period) to use.")
    add_only_optimize_lora_arg(group)
    add("--enable_ema", action="store_true",
        help="Keep an exponential moving average of the actor (actor_ema/), in fp32 whatever --dtype (in bf16 "
             "most of each small update would be rounded away).")
    add("--ema_beta", type=float, default=0.992,
        help="EMA decay: after each actor step, ema <- beta x ema + (1 - beta) x actor.")


def add_ppo_args(parser):
    group = parser.add_argument_group("PPO")
    add = group.add_argument
    add_sampling_args(group, what="the rollouts", temperature_also=" and of their log-probs")
    add("--generation_backend", type=str, default="native", choices=("native", "hf"),
        help="Rollout sampler: native (inference/sampling.py: a KV-cache loop that drops finished rows, runs a "
             "shared prompt prefix once and draws one uniform per row; faster on CPU) or hf (Hugging Face "
             "generate). Models whose forward takes no position_ids always use hf.")
    add("--rollout_logprobs", action="store_true",
        help="Take the actor's log-probs before the update (PPO's old policy) from the native sampler's own "
             "logits instead of a forward pass over the rollouts: one forward pass of the actor fewer a round. "
             "They differ from a training pass's by rounding (most in bf16, where the sampler's cached decoding "
             "and a whole forward pass round apart); where the sampler does not decode (--generation_backend hf, "
             "a model it does not support), the forward pass runs as without the flag.")
    add("--kl_coef", type=float, default=0.1, help="KL penalty coefficient (initial value if adaptive); 0, without "
        "--use_kl_loss: no reference model is made or run (utils/rl/kl.py uses_reference).")
    add("--kl_estimator", type=str, default="k1", choices=tuple(KL_ESTIMATORS),
        help="Per-token estimate of KL(actor || reference) in the reward penalty (Schulman 2020); default "
             "%(default)s. " + registry_help(KL_ESTIMATORS, "utils/rl/kl.py"))
    add("--adaptive_kl_target", type=float, default=0.0,
        help="Target KL (nats per sequence) of the adaptive KL controller; 0 keeps --kl_coef fixed.")
    add("--adaptive_kl_horizon", type=float, default=10000,
        help="Adaptive KL controller's horizon, in samples: the coefficient moves by at most 20%% per horizon.")
    add("--reward_clip", type=float, default=5.0, help="Clip the score to [-c, c] (0: no clipping).")
    add("--normalize_reward", action=argparse.BooleanOptionalAction, default=None,
        help="Normalise scores by the running mean and std of all scores seen (default: on with gae, off for the "
             "critic-free estimators, which normalise by their own baseline).")
    add("--whiten_advantages", action=argparse.BooleanOptionalAction, default=True,
        help="Whiten GAE's advantages over the batch (mean 0, std 1); default on.")
    add("--missing_eos_penalty", type=float, default=1.0,
        help="Subtracted from the score of an answer that never emits EOS (0: none).")
    add("--critic_warmup_steps", type=int, default=0, help="PPO rounds that train the critic only.")
    add("--policy_loss", type=str, default="ppo", choices=tuple(POLICY_LOSSES),
        help="The actor's loss; default %(default)s. " + registry_help(POLICY_LOSSES, "utils/rl/policy_losses.py"))
    add("--cliprange", type=float, default=0.2,
        help="PPO's clip of the probability ratio of the actor to [1 - c, 1 + c].")
    add("--cliprange_low", type=float, default=None, help="Lower clip of the ratio, 1 - this (default --cliprange).")
    add("--cliprange_high", type=float, default=None,
        help="Upper clip of the ratio, 1 + this (default --cliprange); larger: DAPO's clip-higher (e.g. 0.28).")
    add("--loss_agg_mode", type=str, default="token_mean", choices=tuple(LOSS_AGG_MODES),
        help="How the actor's per-token losses are made one number; default %(default)s. " +
             registry_help(LOSS_AGG_MODES, "utils/rl/losses.py"))
    add("--cliprange_value", type=float, default=0.2,
        help="Clip of the critic's new values to within c of the old ones in the value loss.")
    add("--gamma", type=float, default=1.0, help="GAE's discount factor per token.")
    add("--lam", type=float, default=0.95, help="GAE's lambda (bias-variance trade-off of the advantages).")


def add_critic_free_args(parser):
    group = parser.add_argument_group("critic-free estimators and reward functions")
    add = group.add_argument
    add("--advantage_estimator", type=str, default="gae", choices=tuple(ESTIMATORS),
        help="How an answer is credited; only an estimator with a critic creates one, group estimators compare "
             "--num_samples_per_prompt answers; default %(default)s. " +
             registry_help(ESTIMATORS, "utils/rl/estimators.py"))
    add("--num_samples_per_prompt", type=int, default=1, help="Answers sampled per prompt in one rollout.")
    add("--no_std_normalization", action="store_true",
        help="grpo: advantages r - group mean, without dividing by the group's std (Dr. GRPO).")
    add("--use_kl_loss", action="store_true",
        help="The KL to the reference as a loss term (--kl_loss_coef x --kl_loss_estimator) instead of a penalty "
             "in the reward (--kl_coef).")
    add("--kl_loss_coef", type=float, default=0.001, help="Weight of the KL loss term of --use_kl_loss.")
    add("--kl_loss_estimator", type=str, default="k3", choices=tuple(KL_ESTIMATORS),
        help="Per-token KL estimate of --use_kl_loss, one of --kl_estimator's (default k3: unbiased and never "
             "negative).")
    add("--positive_nll_coef", type=float, default=0.0,
        help="Weight of the negative log-likelihood of the sampled answers scored at least "
             "--positive_score_threshold, added to the policy loss (VAPO's positive-example LM loss; 0: none). "
             "Groups dropped by --filter_zero_variance are left out of it too.")
    add("--entropy_coef", type=float, default=0.0,
        help="Weight of the answer tokens' entropy (aggregated by --loss_agg_mode), subtracted from the actor's "
             "loss: an entropy bonus that keeps the policy sampling different answers (verl's entropy_coeff, "
             "OpenRLHF's --entropy_loss_coef; 0: none). With --target_entropy, the coefficient of the first round.")
    add("--target_entropy", type=float, default=0.0,
        help="Steer the entropy bonus's coefficient towards this answer-token entropy (nats per token; Skywork-OR1's "
             "adaptive entropy control): after each round it rises by --entropy_coef_step while the round's entropy "
             "is below the target and falls by it otherwise, within [0, --max_entropy_coef], and the bonus applies "
             "only in rounds after one below the target (0: off, --entropy_coef fixed).")
    add("--entropy_coef_step", type=float, default=0.005,
        help="--target_entropy: the coefficient's change after each round.")
    add("--max_entropy_coef", type=float, default=0.1,
        help="--target_entropy: the most the coefficient may reach.")
    add("--positive_score_threshold", type=float, default=1.0,
        help="The end score (before normalisation and penalties) from which an answer counts as positive for "
             "--positive_nll_coef (1.0: a right answer for the built-in checker or a 0/1 verifier).")
    add("--filter_zero_variance", action="store_true",
        help="Drop the groups whose answers all got the same score before the forward passes of the update (DAPO's "
             "dynamic sampling): they have nothing to teach a group-relative estimator. Their count is logged as "
             "zero_variance_groups, the rollouts trained on as trained_rows.")
    add("--max_generation_batches", type=int, default=0,
        help="With --filter_zero_variance, a round draws more prompt batches until the groups it keeps fill "
             "--generation_batches batches, at most this many in all (0: --generation_batches, no refill; verl's "
             "max_num_gen_batches). Steps count the batches trained, so a round advances them by "
             "--generation_batches whatever it drew.")
    add("--stop_after_idle_rounds", type=int, default=0,
        help="With --filter_zero_variance, stop when this many rounds in a row found no group whose answers' scores "
             "differ (every prompt answered alike, right or wrong: nothing left to train on; 0: never).")
    add("--deadline", type=float, default=0,
        help="A wall-clock time (seconds since the epoch, as `date +%%s` prints) by which this step and the "
             "evaluation after it must end: training stops at the end of the first round past which the time left is "
             "what the step still needs to save and run --reserve_answers answers, estimated from its own setup, "
             "rounds and held-out evaluations (train.py's --time-budget sets it; 0: none).")
    add("--reserve_answers", type=int, default=0,
        help="With --deadline: answers decoded after this step (train.py's closing evaluation), whose time is "
             "reserved at the rate this step's held-out evaluations (else its rollouts) decode.")
    add("--reserve_greedy_answers", type=int, default=None,
        help="Of --reserve_answers, how many are greedy: those are reserved at the rate of this step's greedy "
             "decoding, the others at its sampled one's (default: all at the evaluations' mean rate).")
    add("--overlong_penalty", type=float, default=0.0,
        help="Subtracted in full from the score of an answer that fills --max_answer_seq_len, in part from one "
             "within --overlong_buffer tokens of it (DAPO's soft overlong punishment; 0: none).")
    add("--overlong_buffer", type=int, default=1, help="Tokens before --max_answer_seq_len where it starts.")
    add_reward_fn_arg(group, role="Score answers with a function")
    add("--reward_fn_weight", type=float, default=1.0,
        help="The end score is reward_fn_weight x the reward function's score + reward_model_weight x the "
             "reward model's, of those given.")
    add("--reward_model_weight", type=float, default=1.0,
        help="Weight of the reward model's score in the end score (see --reward_fn_weight).")
    add("--answer_base_rate", type=int, default=0,
        help="Subtract from each answer's --reward_fn score its mean score on this many training prompts drawn "
             "at the start (its own left out): what it earns without reading the question, so that saying the most "
             "common answer to every question earns nothing (utils/rl/base_rate.py; 0: off).")
    add("--eval_interval", type=int, default=0,
        help="Every N steps (and before the first and after the last) score the actor on held-out prompts, "
             "sampled and greedy: the built-in task's or a reasoning-gym spec's with its checker, else the data's "
             "eval split (0: never).")
    add_eval_prompts_arg(group, 100, "How many held-out prompts --eval_interval scores.")
    add_load_best_arg(group, "With --eval_interval: score the data's eval split (validation prompts, never trained "
                             "on; for a reasoning-gym spec or the built-in task apart from the held-out questions "
                             "the closing evaluation scores) instead of the held-out prompts, and save the actor as "
                             "it was at its best evaluation (the mean of the sampled and greedy scores; a tie keeps "
                             "the earlier, so RL that never beats the starting actor returns it) rather than as it "
                             "ends. The critic is saved as it ends.")


def add_output_args(parser):
    group = add_logging_args(parser, default_tensorboard_path="step3_tensorboard", default_print_interval=1,
                             steps="prompt batches")
    group.add_argument("--print_answers", action="store_true",
                       help="Print a prompt and its sampled answer during training.")
    group.add_argument("--print_answers_interval", type=int, default=10,
                       help="If --print_answers enabled, print every this many prompt batches.")


def check_args(args):
    check_common_args(args)  # the ranges of single flags (utils/runtime/args.py FLAG_RANGES), then how flags combine
    check_rl_args(args)
    tool_use(args)  # --tool_tags
    if rollouts_per_batch(args) % args.per_device_training_batch_size:
        group = args.num_samples_per_prompt
        times = f" x --num_samples_per_prompt ({group})" if group > 1 else ""
        raise ConfigError(f"--per_device_generation_batch_size ({args.per_device_generation_batch_size}){times} must "
                          f"be a multiple of --per_device_training_batch_size ({args.per_device_training_batch_size})")
    if args.load_best_model_at_end and args.enable_ema:
        raise ConfigError("--load_best_model_at_end keeps the actor's best weights, not the moving average's: drop "
                          "--enable_ema or --load_best_model_at_end")
    if args.target_entropy and args.entropy_coef > args.max_entropy_coef:
        raise ConfigError(f"--entropy_coef {args.entropy_coef} (with --target_entropy, the first round's coefficient) "
                          f"is above --max_entropy_coef {args.max_entropy_coef}")
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
            raise ConfigError(f"--advantage_estimator {estimator} needs --critic_model_name_or_path (the step-2 "
                              "reward model: the reward model and the critic's start)")
        if not args.reward_fn:
            raise ConfigError(f"--advantage_estimator {estimator} needs a reward: --reward_fn (e.g. builtin) or "
                              "--critic_model_name_or_path (a step-2 reward model), or both")
    if args.answer_base_rate and not args.reward_fn:
        raise ConfigError("--answer_base_rate corrects the --reward_fn score: give --reward_fn")
    if ESTIMATORS[estimator].groups and group < 2:
        raise ConfigError(f"--advantage_estimator {estimator} compares the answers to one prompt: it needs "
                          f"--num_samples_per_prompt of at least 2, not {group}")
    if args.filter_zero_variance and group < 2:
        raise ConfigError("--filter_zero_variance needs --num_samples_per_prompt of at least 2 (groups to compare)")
    if args.max_generation_batches and not args.filter_zero_variance:
        raise ConfigError(f"--max_generation_batches {args.max_generation_batches} needs --filter_zero_variance "
                          "(the batches a round may draw to replace the groups it drops)")
    if args.stop_after_idle_rounds and not args.filter_zero_variance:
        raise ConfigError(f"--stop_after_idle_rounds {args.stop_after_idle_rounds} needs --filter_zero_variance "
                          "(a round is idle when every group it drew was dropped)")
    if args.reserve_answers and not args.deadline:
        raise ConfigError(f"--reserve_answers {args.reserve_answers} needs --deadline (the time it is reserved "
                          "before)")
    if args.reserve_greedy_answers is not None and not 0 <= args.reserve_greedy_answers <= args.reserve_answers:
        raise ConfigError(f"--reserve_greedy_answers must be in [0, --reserve_answers {args.reserve_answers}], not "
                          f"{args.reserve_greedy_answers}")
    if args.critic_warmup_steps and not uses_critic(args):
        raise ConfigError(f"--critic_warmup_steps: --advantage_estimator {estimator} has no critic to warm up")
    longest = float("inf") if is_auto(args.max_answer_seq_len) else args.max_answer_seq_len
    if not 1 <= args.overlong_buffer <= longest:
        raise ConfigError(f"--overlong_buffer must be in [1, --max_answer_seq_len {args.max_answer_seq_len}], not "
                          f"{args.overlong_buffer}")
    if args.normalize_reward is None:
        args.normalize_reward = uses_critic(args)
