"""Flags `train.py` passes to each step, by model family, on top of the step's own defaults.

`tiny` is the built-in default, tuned to teach the built-in task on a 2-core CPU in minutes; `smollm2-135m`
is a real pretrained model trained with LoRA in bounded steps; `default` serves any other Hugging Face model
with DeepSpeed-Chat's settings for OPT-1.3b / OPT-350m. Flags given to train.py with --step{1,2,3}-args come
after these, so they win. An "eval" entry adds flags to the side-by-side evaluation train.py ends with.
`DATA_RECIPES` adds flags for one model family on one kind of data (after the model's, so they win there).
"""

# SmolLM2's steps on pairs (step 2, DPO): LoRA rank 16, 40 steps of 8 pairs.
SMOLLM2_PAIRS = ["--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "16", "--max_seq_len", "64",
                 "--learning_rate", "2e-4", "--lora_dim", "16", "--only_optimize_lora", "--lora_learning_rate",
                 "5e-4", "--max_steps", "40", "--num_warmup_steps", "5", "--print_interval", "10", "--dtype", "auto"]

RECIPES = {
    "tiny": {
        # Measured with 1 thread per run, two runs at a time. Step 1: 2000 steps rather than 1200 raise the held-out
        # checker score of the step-1 actor (4 samples per prompt / greedy) from 0.684 / 0.899 to 0.715 / 0.906
        # (measured with an earlier tokenizer).
        1: ["--per_device_train_batch_size", "64", "--per_device_eval_batch_size", "64", "--max_seq_len", "64",
            "--learning_rate", "1e-3", "--num_warmup_steps", "50", "--num_train_epochs", "30",
            "--max_steps", "2000", "--lr_scheduler_type", "cosine", "--print_interval", "100"],
        # Step 2: 3200 steps rather than 1600 (same step-1 actor, PPO at kl_coef 0.2): the reward model tells a
        # right held-out sum from one off by one or two in 0.93 of pairs instead of 0.90, and PPO's held-out gain
        # is +0.121 (sums +0.108) instead of +0.111 / +0.114 (two seeds; sums +0.05 / +0.08).
        2: ["--per_device_train_batch_size", "32", "--per_device_eval_batch_size", "64", "--max_seq_len", "64",
            "--learning_rate", "3e-4", "--num_warmup_steps", "20", "--num_train_epochs", "8",
            "--max_steps", "3200", "--eval_interval", "800", "--print_interval", "100"],
        # kl_coef 0.2: held-out sampled gain of the step-3 actor +0.121 at 0.2 against +0.105 at 0.3 (greedy
        # 0.953 -> 0.950 and -> 0.963). Below 0.2 PPO turned unseen sums and words into confident near misses the
        # reward model could not tell from the right answer (0.05: no gain at all; measured with an earlier
        # tokenizer, as +0.095 / +0.086 at 0.2 against +0.083 at 0.3).
        3: ["--per_device_generation_batch_size", "64", "--per_device_training_batch_size", "32",
            "--ppo_epochs", "4", "--max_prompt_seq_len", "32", "--max_answer_seq_len", "12",
            "--actor_learning_rate", "3e-5", "--critic_learning_rate", "1e-4", "--kl_coef", "0.2",
            "--num_warmup_steps", "0", "--lr_scheduler_type", "constant", "--num_train_epochs", "3",
            "--max_steps", "270",
            "--print_interval", "10"],
        # Critic-free RL (flags after step 3's): 16 prompts x 8 answers = 128 rollouts a step in minibatches of 64 (4
        # optimizer steps a round, as with 64 rollouts in 32s), the KL as a loss term, 2 epochs, the learning rate
        # decaying to 0 on a cosine, the actor's moving average (--enable_ema), which train.py evaluates, and the
        # NLL of the right answers sampled (--positive_nll_coef 1, VAPO's positive-example LM loss).
        # Held-out sampled gain of the moving average from the step-1 actor on a Zen 4 CPU in bf16 (README, "Beyond
        # PPO"): +0.177 / +0.171 / +0.174 / +0.176 / +0.176 / +0.178 / +0.173 (seeds 1234, 2-7), every greedy skill
        # at or above the step-1 actor's in six of the seven (seed 5: upper-casing 0.978 -> 0.975).
        # Without the NLL: +0.154 / +0.152 / +0.148 / +0.160 / +0.150 / +0.157, every greedy skill kept in two seeds
        # of six (the others lose one upper-casing prompt); at --positive_nll_coef 0.1 (VAPO's weight), seed 1234:
        # +0.161, upper-casing still falls. At a constant rate (no NLL) the last weights swing on held-out sums
        # (0.815-0.955 greedy) while the rate stays up.
        "grpo": ["--per_device_generation_batch_size", "16", "--per_device_training_batch_size", "64",
                 "--num_samples_per_prompt", "8", "--ppo_epochs", "2", "--use_kl_loss", "--kl_loss_coef", "0.2",
                 "--actor_learning_rate", "6e-5", "--lr_scheduler_type", "cosine", "--enable_ema",
                 "--positive_nll_coef", "1.0", "--max_steps", "540", "--eval_interval", "90"],
        # DPO from the step-1 actor on step 2's pairs: IPO at beta 0.1 for 300 steps gave the best held-out sampled
        # score of the DPO runs (0.839 against 0.823 for sigmoid at beta 1.0, 200 steps; greedy 0.948 both).
        "dpo": ["--per_device_train_batch_size", "32", "--per_device_eval_batch_size", "64", "--max_seq_len", "64",
                "--num_warmup_steps", "10", "--loss_type", "ipo", "--beta", "0.1", "--max_steps", "300",
                "--print_interval", "50"],
        # The sampled pairs of --pair-judge (inference/sample_pairs.py): the best and worst of 8 answers to each of
        # 12000 part-2 prompts. DPO above (beta 0.1) on them, judged by the checker, from the same 0.752 / 0.941
        # step-1 actor (README, "Beyond PPO"): held-out sampled / greedy 0.884 / 0.958 with 8 answers per prompt
        # (11090 pairs), 0.865 / 0.956 with 4 (9130 pairs), against 0.839 / 0.948 on the data set's fixed pairs;
        # greedy sums still fall (0.945 -> 0.895 / 0.885 / 0.900).
        "pairs": ["--samples_per_prompt", "8", "--max_prompts", "12000"],
        # DPO on those pairs (train.py --pair-judge; after "dpo"'s flags): IPO at beta 0.3 moves the actor less in
        # a round than 0.1 and gains over rounds (--pair-rounds); the chosen answers' NLL at weight 2 (--rpo_alpha,
        # RPO: the best of 8 sampled answers is right 96% of the time) keeps greedy skills from sliding. From the
        # step-1 actor on a Zen 4 CPU in bf16 (README, "Iterative DPO"), four rounds: held-out sampled +0.175 /
        # +0.164 / +0.166 / +0.171 / +0.172 / +0.162 (seeds 1234, 2, 3, 4, 5, 6), every greedy skill kept in four of
        # the six (seed 2 loses one sum, seed 3 one upper-casing prompt); at weight 1 +0.155 / +0.168 / +0.164 /
        # +0.164 (seeds 1234-4), none keeping every skill; without the NLL +0.156 / +0.163 / +0.159 / +0.151, greedy
        # sums 0.970 / 0.915 / 0.930 / 0.970 from 0.950. One round, beta 0.3: +0.086 with greedy sums 0.945 (beta
        # 0.1: +0.085 and 0.797).
        "dpo_pairs": ["--beta", "0.3", "--rpo_alpha", "2"],
    },
    "smollm2-135m": {
        # --dtype auto (utils.runtime.ds_utils.choose_dtype): bf16 where the CPU has native bf16, else fp32.
        # Measured on a shared 2-core CPU with AMX (load 4-7): bf16 trains 2-2.5x faster than fp32 at the same
        # losses (step 3: 61 s vs 130 s for 4 rounds) and its fused LoRA saves without loss (fp32 perplexity of
        # the saved step-1 model 7.0); on a 2-core AVX2-only AMD EPYC bf16 ran ~15x slower than fp32 (step 1 of
        # a 6.9M OPT: 3.35 against 49.5 samples/s). The times below are the AMX machine's, in bf16. Sequences are
        # short: the chat-template prompts of the built-in task are 37-43 tokens, answers at most 10 (+ EOS).
        # Step 1: 60 LoRA steps of 8 (~2 min) take eval perplexity 258 -> 6.9 and the greedy checker score 0 -> 0.48.
        1: ["--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "16", "--max_seq_len", "64",
            "--learning_rate", "2e-4", "--lora_dim", "16", "--only_optimize_lora", "--lora_learning_rate", "5e-4",
            "--max_steps", "60", "--num_warmup_steps", "5", "--print_interval", "10", "--dtype", "auto"],
        # Step 2 (from the step-1 weights): accuracy 0.18 -> 0.88 by step 30 (0.89 at 60), so 40 steps (0.20 ->
        # 0.86, ~3 min), and no mid-run evaluation (each pass over the 400 eval pairs costs about a minute). Per
        # skill (all 1,000 eval pairs, fp32 re-run): add 0.76, reverse 0.74, capital 0.94, upper 0.89; a right sum or
        # reversal above a near miss only 0.45 / 0.55, and on held-out reversals it scores a copy of the word or
        # the uppercase reversal above the right one (79% / 93% of prompts): it cannot judge reversals.
        2: SMOLLM2_PAIRS,
        # DPO from the step-1 actor: step 2's pairs, batches, lengths and LoRA (not yet measured on this model).
        "dpo": SMOLLM2_PAIRS,
        # Step 3: prompts fit in 48 tokens (43 at most), answers in 12; rounds of 16 rollouts, 2 PPO epochs of 2
        # minibatches. New LoRA factors on actor and critic only; the critic's value head, the one non-LoRA weight
        # trained, learns at --critic_learning_rate. KL coefficient 0.5 for 20 rounds: at 0.1 for 30 rounds (KL
        # 0.66 nats per answer) PPO followed that reward model into uppercase and copied reversals (greedy checker
        # score 0.476 -> 0.417, reversals 0.355 -> 0.085, bf16 run); at 0.5 the KL stays at 0.05-0.13 nats and
        # no skill's greedy score falls (held-out, 100 prompts, fp32: 0.513 -> 0.515, reversals 0.38 -> 0.39) while
        # every skill's sampled one rises (0.268 -> 0.300). ~40 s a round in fp32 on a 2-core AVX2 CPU at load 2-4.
        3: ["--per_device_generation_batch_size", "16", "--per_device_training_batch_size", "8",
            "--ppo_epochs", "2", "--max_prompt_seq_len", "48", "--max_answer_seq_len", "12",
            "--actor_lora_dim", "16", "--critic_lora_dim", "16", "--only_optimize_lora",
            "--actor_lora_learning_rate", "2e-4",
            "--critic_learning_rate", "1e-4", "--critic_lora_learning_rate", "5e-4", "--kl_coef", "0.5",
            "--num_warmup_steps", "0", "--lr_scheduler_type", "constant", "--max_steps", "20",
            "--print_interval", "5", "--dtype", "auto"],
        # The closing evaluation: 400 prompts x (4 samples + greedy) x 2 actors would take ~10 min here; 200
        # prompts x (2 samples + greedy) in bf16 (AMX) take 3 (1 min per 100 prompts x 2 decodings x 2 actors).
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
    # SmolLM2 on reasoning-gym tasks (any task and settings): short answers, so every length is the data's own;
    # a step 1 short enough to leave the verifier room, critic-free RL on many answers per prompt (each prompt run
    # once for its 8 answers), the held-out curve every 10 rounds. Measured (README, "A real pretrained model,
    # offline"), RL's held-out gain over the step-1 actor, sampled / greedy, seeds 1234 and 2: chain_sum (2 terms of
    # up to 2 digits) +0.230 / +0.128 and +0.235 / +0.173 in 22 min of CPU (fp32, AVX2); needle_haystack (2-4
    # statements) +0.470 / +0.260, +0.449 / +0.330 (and +0.523 / +0.380, seed 3) in 14 min or less (bf16, Zen 4).
    # spell_backward's +0.1 was the word copied back (partial credit), not reversed; 20 rounds gained chain_sum
    # +0.159 / +0.128.
    ("smollm2-135m", "reasoning_gym"): {
        1: ["--max_seq_len", "auto", "--max_steps", "24", "--num_train_epochs", "100", "--num_warmup_steps", "2",
            "--print_interval", "4"],
        3: ["--max_prompt_seq_len", "auto", "--max_answer_seq_len", "auto", "--num_train_epochs", "100"],
        "grpo": ["--per_device_generation_batch_size", "4", "--num_samples_per_prompt", "8",
                 "--per_device_training_batch_size", "16", "--ppo_epochs", "1", "--kl_coef", "0",
                 "--actor_lora_learning_rate", "5e-4", "--max_steps", "40", "--print_interval", "1",
                 "--eval_interval", "10", "--eval_prompts", "50"],
        "eval": ["--num_prompts", "100", "--samples_per_prompt", "4", "--max_new_tokens", "auto"],
    },
}
"""Flags for (model family, data kind), after the model's recipe: data kinds are those of `data_kind`."""


def data_kind(data_paths):
    """The kind of data a run trains on, for DATA_RECIPES: "reasoning_gym" when every data path is a reasoning-gym
    spec, else None."""
    if data_paths and all(path.startswith("reasoning_gym:") for path in data_paths):
        return "reasoning_gym"
    return None


def recipe_flags(model, step, data_paths=None):
    """The recipe flags of `step` (1, 2, 3, "grpo", "dpo", "pairs", "dpo_pairs", or "eval": prompt_eval.py's at the
    end of train.py) for `model` (a built-in name, a hub name or a folder) on `data_paths` (None: each step's
    default data): the model's recipe, then its data recipe's."""
    flags = list(RECIPES.get(model, RECIPES["default"]).get(step, []))
    return flags + list(DATA_RECIPES.get((model, data_kind(data_paths)), {}).get(step, []))
