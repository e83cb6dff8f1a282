"""Flags `train.py` passes to each step, by model family, on top of the step's own defaults.

`tiny` is the built-in default, tuned to teach the built-in task on a 2-core CPU in minutes; `smollm2-135m`
is a real pretrained model trained with LoRA in bounded steps; `default` serves any other Hugging Face model
with DeepSpeed-Chat's settings for OPT-1.3b / OPT-350m. Flags given to train.py with --step{1,2,3}-args come
after these, so they win.
"""

RECIPES = {
    "tiny": {
        1: ["--per_device_train_batch_size", "64", "--per_device_eval_batch_size", "64", "--max_seq_len", "64",
            "--learning_rate", "1e-3", "--num_warmup_steps", "50", "--num_train_epochs", "30",
            "--max_steps", "1200", "--lr_scheduler_type", "cosine", "--print_interval", "100"],
        2: ["--per_device_train_batch_size", "32", "--per_device_eval_batch_size", "64", "--max_seq_len", "64",
            "--learning_rate", "3e-4", "--num_warmup_steps", "20", "--num_train_epochs", "8",
            "--max_steps", "1600", "--eval_interval", "400", "--print_interval", "100"],
        3: ["--per_device_generation_batch_size", "64", "--per_device_training_batch_size", "32",
            "--ppo_epochs", "4", "--max_prompt_seq_len", "32", "--max_answer_seq_len", "12",
            "--actor_learning_rate", "3e-5", "--critic_learning_rate", "1e-4", "--kl_coef", "0.2",
            "--num_warmup_steps", "0", "--lr_scheduler_type", "constant", "--num_train_epochs", "3",
            "--max_steps", "270",
            "--print_interval", "10"],
    },
    "smollm2-135m": {
        1: ["--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "16", "--max_seq_len", "64",
            "--learning_rate", "2e-4", "--lora_dim", "16", "--only_optimize_lora", "--lora_learning_rate", "5e-4",
            "--max_steps", "60", "--num_warmup_steps", "5", "--print_interval", "10"],
        2: ["--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "16", "--max_seq_len", "64",
            "--learning_rate", "2e-4", "--lora_dim", "16", "--only_optimize_lora", "--lora_learning_rate", "5e-4",
            "--max_steps", "60", "--num_warmup_steps", "5", "--eval_interval", "30", "--print_interval", "10"],
        3: [],
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
    },
}


def recipe_flags(model, step):
    """The recipe flags of `step` for `model` (a built-in name, a hub name or a folder)."""
    return list(RECIPES.get(model, RECIPES["default"])[step])
