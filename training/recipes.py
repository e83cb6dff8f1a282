"""Flags `train.py` passes to each step, by model family, on top of the step's own defaults.

`tiny` is the built-in default, tuned to teach the built-in task on a 2-core CPU in minutes; `smollm2-135m`
is a real pretrained model trained with LoRA in bounded steps; `default` serves any other Hugging Face model
with DeepSpeed-Chat's settings for OPT-1.3b / OPT-350m. Flags given to train.py with --step{1,2,3}-args come
after these, so they win. An "eval" entry adds flags to the side-by-side evaluation train.py ends with, a "train"
entry flags of train.py itself (before the user's, so theirs win). "grpo_reward_fn" and "train_reward_fn" are
"grpo"'s and "train"'s where the reward is a reward function (`--reward-fn`), not a reward model.
`DATA_RECIPES` adds flags for one model family on one kind of data (after the model's, so they win there).
"""

# SmolLM2's steps on pairs (step 2, DPO): LoRA rank 16, 40 steps of 8 pairs.
SMOLLM2_PAIRS = ["--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "16", "--max_seq_len", "64",
                 "--learning_rate", "2e-4", "--lora_dim", "16", "--only_optimize_lora", "--lora_learning_rate",
                 "5e-4", "--max_steps", "40", "--num_warmup_steps", "5", "--print_interval", "10", "--dtype", "auto"]

# SmolLM2's critic-free RL on a verifier (a reasoning-gym task's, a user's reward function): 8 answers to each of 4
# prompts whose scores differ (dynamic sampling, up to 4 batches drawn), LoRA at 5e-4, no KL, until the command's
# time budget (or 400 rounds), stopping once 5 rounds in a row find no prompt whose answers differ
# (docs/panel.md).
SMOLLM2_VERIFIED_RL = ["--per_device_generation_batch_size", "4", "--num_samples_per_prompt", "8",
                       "--per_device_training_batch_size", "16", "--ppo_epochs", "1", "--kl_coef", "0",
                       "--actor_lora_learning_rate", "5e-4", "--max_steps", "400", "--print_interval", "1",
                       "--eval_interval", "20", "--eval_prompts", "50", "--filter_zero_variance",
                       "--max_generation_batches", "4", "--stop_after_idle_rounds", "5"]

RECIPES = {
    "tiny": {
        # Step 1: 2000 steps on a cosine: a longer SFT gives a better step-1 actor (docs/quickstart-results.md).
        1: ["--per_device_train_batch_size", "64", "--per_device_eval_batch_size", "64", "--max_seq_len", "64",
            "--learning_rate", "1e-3", "--num_warmup_steps", "50", "--num_train_epochs", "30",
            "--max_steps", "2000", "--lr_scheduler_type", "cosine", "--print_interval", "100"],
        # Step 2: 3200 steps, so the reward model ranks a right sum above a near miss (docs/quickstart-results.md).
        2: ["--per_device_train_batch_size", "32", "--per_device_eval_batch_size", "64", "--max_seq_len", "64",
            "--learning_rate", "3e-4", "--num_warmup_steps", "20", "--num_train_epochs", "8",
            "--max_steps", "3200", "--eval_interval", "800", "--print_interval", "100"],
        # Step 3 (PPO): kl_coef 0.2 (lower, PPO learns near misses the reward model cannot tell from right answers);
        # the rate decays on a cosine and the moving average (actor_ema) is the actor evaluated: at a constant rate
        # the last weights turn held-out sums into near misses (docs/defaults.md).
        3: ["--per_device_generation_batch_size", "64", "--per_device_training_batch_size", "32",
            "--ppo_epochs", "4", "--max_prompt_seq_len", "32", "--max_answer_seq_len", "12",
            "--actor_learning_rate", "3e-5", "--critic_learning_rate", "1e-4", "--kl_coef", "0.2",
            "--num_warmup_steps", "0", "--lr_scheduler_type", "cosine", "--enable_ema", "--num_train_epochs", "3",
            "--max_steps", "270",
            "--print_interval", "10"],
        # Critic-free RL (after step 3's): 16 prompts x 8, KL loss, cosine decay, EMA, the right answers' NLL.
        "grpo": ["--per_device_generation_batch_size", "16", "--per_device_training_batch_size", "64",
                 "--num_samples_per_prompt", "8", "--ppo_epochs", "2", "--use_kl_loss", "--kl_loss_coef", "0.2",
                 "--actor_learning_rate", "6e-5", "--lr_scheduler_type", "cosine", "--enable_ema",
                 "--positive_nll_coef", "1.0", "--max_steps", "540", "--eval_interval", "90"],
        # DPO on step 2's pairs: IPO at beta 0.1 for 300 steps, the best setting on fixed pairs (docs/algorithms.md).
        "dpo": ["--per_device_train_batch_size", "32", "--per_device_eval_batch_size", "64", "--max_seq_len", "64",
                "--num_warmup_steps", "10", "--loss_type", "ipo", "--beta", "0.1", "--max_steps", "300",
                "--print_interval", "50"],
        # --pair-judge's sampled pairs: the best and worst of 8 answers to each of 12000 part-2 prompts.
        "pairs": ["--samples_per_prompt", "8", "--max_prompts", "12000"],
        # DPO on sampled pairs (after "dpo"'s): IPO beta 0.3 gains over rounds, the chosen answers' NLL keeps skills.
        "dpo_pairs": ["--beta", "0.3", "--rpo_alpha", "2"],
        # KTO on the step-1 actor's judged answers (the best and worst of 8 as one desirable, one undesirable): 64
        # answers a step, beta 1 (at 0.1 the undesirable answers are pushed down without end, EOS with them, and
        # the held-out score fell 0.77 -> 0.48; docs/algorithms.md).
        "kto": ["--per_device_train_batch_size", "64", "--per_device_eval_batch_size", "64", "--max_seq_len", "64",
                "--num_warmup_steps", "10", "--beta", "1.0", "--max_steps", "300", "--print_interval", "50"],
        # ORPO from the base model: step 1's schedule and steps, 64 pairs a step (step 1's 64 answers as chosen);
        # lambda (--beta) 2.5: held-out sampled 0.823 against step 1's 0.774 (lambda 1: 0.800, 5: 0.812).
        "orpo": ["--per_device_train_batch_size", "64", "--per_device_eval_batch_size", "64", "--max_seq_len", "64",
                 "--learning_rate", "1e-3", "--num_warmup_steps", "50", "--num_train_epochs", "30",
                 "--max_steps", "2000", "--lr_scheduler_type", "cosine", "--print_interval", "100", "--beta", "2.5"],
    },
    "smollm2-135m": {
        # --dtype auto: bf16 only where the CPU has native bf16. Step 1: 60 LoRA steps of 8 (docs/smollm2.md).
        1: ["--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "16", "--max_seq_len", "64",
            "--learning_rate", "2e-4", "--lora_dim", "16", "--only_optimize_lora", "--lora_learning_rate", "5e-4",
            "--max_steps", "60", "--num_warmup_steps", "5", "--print_interval", "10", "--dtype", "auto"],
        # Step 2 (from the step-1 weights): 40 steps, by which accuracy has levelled off; no mid-run evaluation.
        2: SMOLLM2_PAIRS,
        # DPO from the step-1 actor: step 2's pairs, batches, lengths and LoRA (not yet measured on this model).
        "dpo": SMOLLM2_PAIRS,
        # Step 3: LoRA, KL 0.5: keeps PPO near the step-1 actor, since the reward model misjudges reversals.
        3: ["--per_device_generation_batch_size", "16", "--per_device_training_batch_size", "8",
            "--ppo_epochs", "2", "--max_prompt_seq_len", "48", "--max_answer_seq_len", "12",
            "--actor_lora_dim", "16", "--critic_lora_dim", "16", "--only_optimize_lora",
            "--actor_lora_learning_rate", "2e-4",
            "--critic_learning_rate", "1e-4", "--critic_lora_learning_rate", "5e-4", "--kl_coef", "0.5",
            "--num_warmup_steps", "0", "--lr_scheduler_type", "constant", "--max_steps", "20",
            "--print_interval", "5", "--dtype", "auto"],
        # The closing evaluation: 200 prompts x (2 samples + greedy), a few minutes (docs/smollm2.md).
        "eval": ["--num_prompts", "200", "--samples_per_prompt", "2", "--dtype", "auto"],
        # Critic-free RL keeps step 3's 16 rollouts a round: 4 prompts x 4 answers.
        "grpo": ["--per_device_generation_batch_size", "4", "--num_samples_per_prompt", "4"],
    },
    "default": {
        1: ["--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "8", "--max_seq_len", "512",
            "--learning_rate", "9.65e-6", "--weight_decay", "0.", "--num_train_epochs", "16",
            "--gradient_accumulation_steps", "1", "--lr_scheduler_type", "cosine", "--num_warmup_steps", "0",
            "--seed", "1234", "--gradient_checkpointing", "--lora_dim", "128"],
        2: ["--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "8", "--max_seq_len", "512",
            "--learning_rate", "5e-5", "--weight_decay", "0.1", "--num_train_epochs", "1",
            "--gradient_accumulation_steps", "1", "--lr_scheduler_type", "cosine", "--num_warmup_steps", "0",
            "--seed", "1234", "--gradient_checkpointing", "--num_padding_at_beginning", "1"],
        3: ["--per_device_generation_batch_size", "4", "--per_device_training_batch_size", "4",
            "--generation_batches", "1", "--ppo_epochs", "1", "--max_answer_seq_len", "256",
            "--max_prompt_seq_len", "256", "--actor_learning_rate", "9.65e-6", "--critic_learning_rate", "5e-6",
            "--actor_weight_decay", "0.", "--critic_weight_decay", "0.", "--num_train_epochs", "1",
            "--lr_scheduler_type", "cosine", "--gradient_accumulation_steps", "1",
            "--actor_gradient_checkpointing", "--critic_gradient_checkpointing", "--num_warmup_steps", "100",
            "--enable_hybrid_engine", "--num_padding_at_beginning", "1", "--actor_dropout", "0.0"],
        # Critic-free RL: 4 answers to each of step 3's 4 prompts a round.
        "grpo": ["--num_samples_per_prompt", "4"],
    },
}


DATA_RECIPES = {
    # SmolLM2 on reasoning-gym tasks: lengths `auto`; a step 1 that trains until its eval loss stops improving
    # (three evaluations 10 steps apart without a new best) or 6 minutes are spent; GRPO on 8 answers a prompt
    # until the whole command's 27 minutes leave only what saving and the closing evaluation need (or 400 rounds;
    # docs/panel.md), each round 4 prompts whose answers' scores differ, drawn from up to 4 batches (dynamic
    # sampling: a syllogism actor stops answering "Yes" to all), stopping once 5 rounds in a row found none (the
    # actor answers alike: nothing left to learn).
    ("smollm2-135m", "reasoning_gym"): {
        1: ["--max_seq_len", "auto", "--max_steps", "300", "--num_train_epochs", "100", "--num_warmup_steps", "2",
            "--print_interval", "10", "--eval_interval", "10", "--eval_iters", "4", "--early_stopping_patience", "3",
            "--max_train_minutes", "6"],
        3: ["--max_prompt_seq_len", "auto", "--max_answer_seq_len", "auto", "--num_train_epochs", "100"],
        "grpo": SMOLLM2_VERIFIED_RL,
        "eval": ["--num_prompts", "100", "--samples_per_prompt", "4", "--max_new_tokens", "auto"],
        "train": ["--time-budget", "27"],
    },
    # SmolLM2 on the user's own data (dialogues, hub data sets): every length from the data (its 95th percentile; a
    # dialogue's earlier turns give way first), at most 256 tokens, the bound of a step's time on a 2-core CPU;
    # epochs enough that the recipe's step counts are the bound (each step's log warns where an epoch caps them).
    # Critic-free RL on the user's reward function: the reasoning-gym recipe's RL and time budget (docs/smollm2.md:
    # on a file of questions and a TRL-form checker it gains where step 3's 20 rounds barely move).
    ("smollm2-135m", "user"): {
        **dict.fromkeys((1, 2, "dpo"), ["--max_seq_len", "auto", "--max_auto_len", "256", "--num_train_epochs", "100"]),
        3: ["--max_prompt_seq_len", "auto", "--max_answer_seq_len", "auto", "--max_auto_len", "256",
            "--num_train_epochs", "100"],
        "grpo_reward_fn": SMOLLM2_VERIFIED_RL,
        "train_reward_fn": ["--time-budget", "27"],
    },
    # The tiny model on the user's own data and on reasoning-gym tasks: lengths from the data (its recipe's 64 suits
    # the built-in task only: a graph_color prompt is 363 tokens).
    **dict.fromkeys((("tiny", "user"), ("tiny", "reasoning_gym")), {
        **dict.fromkeys((1, 2, "dpo", "kto", "orpo"), ["--max_seq_len", "auto"]),
        3: ["--max_prompt_seq_len", "auto", "--max_answer_seq_len", "auto"],
    }),
}
"""Flags for (model family, data kind), after the model's recipe: data kinds are those of `data_kind`."""


def data_kind(data_paths):
    """The kind of data a run trains on, for DATA_RECIPES: None for the built-in task (the recipes' own, also when
    no data path is given), "reasoning_gym" when every data path is a reasoning-gym spec, else "user" (the user's
    files, hub data sets, mixes)."""
    if not data_paths or list(data_paths) == ["builtin"]:
        return None
    if all(path.startswith("reasoning_gym:") for path in data_paths):
        return "reasoning_gym"
    return "user"


def recipe_flags(model, step, data_paths=None):
    """The recipe flags of `step` (1, 2, 3, "grpo", "dpo", "pairs", "dpo_pairs", "train": train.py's own, or "eval":
    prompt_eval.py's at the end of train.py) for `model` (a built-in name, a hub name or a folder) on `data_paths` (None: each step's
    default data): the model's recipe, then its data recipe's."""
    flags = list(RECIPES.get(model, RECIPES["default"]).get(step, []))
    return flags + list(DATA_RECIPES.get((model, data_kind(data_paths)), {}).get(step, []))
