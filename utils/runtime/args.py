"""Command-line flags shared by the steps, under DeepSpeed-Chat's names."""
from pathlib import Path

from utils.runtime.ds_utils import DTYPES
from utils.runtime.errors import ArgumentParser, ConfigError  # noqa: F401 (ArgumentParser: the CLIs import it from here)

SCHEDULERS = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup")


def add_data_args(parser, default_max_seq_len=256):
    group = parser.add_argument_group("data")
    group.add_argument("--data_path", nargs="*", default=["builtin"],
                       help="Data sets: DeepSpeed-Chat registry names (e.g. Dahoas/rm-static), local/jsonfile, a "
                            "local folder or .json/.jsonl file, or 'builtin' (the built-in task, offline).")
    group.add_argument("--data_split", type=str, default="2,4,4",
                       help="Proportions of each data set for steps 1, 2 and 3, e.g. 2,4,4.")
    group.add_argument("--data_output_path", type=str, default="/tmp/data_files/",
                       help="Where the shuffled split indices are cached (a local, non-shared folder).")
    group.add_argument("--max_seq_len", type=int, default=default_max_seq_len,
                       help="Maximum tokens of prompt + answer.")
    return group


def add_model_args(parser):
    group = parser.add_argument_group("model")
    group.add_argument("--model_name_or_path", type=str, default="tiny",
                       help="A Hugging Face model name or folder, or a built-in name: tiny, smollm2-135m.")
    group.add_argument("--dropout", type=float, default=None,
                       help="Set every dropout probability of the model to this; unset keeps the model's own.")
    group.add_argument("--trust_remote_code", action="store_true",
                       help="Allow the model folder's own Python code to run (off by default).")
    return group


def add_training_args(parser, default_lr=1e-3, default_epochs=1):
    group = parser.add_argument_group("training")
    group.add_argument("--per_device_train_batch_size", type=int, default=16)
    group.add_argument("--per_device_eval_batch_size", type=int, default=16)
    group.add_argument("--learning_rate", type=float, default=default_lr)
    group.add_argument("--weight_decay", type=float, default=0.0)
    group.add_argument("--num_train_epochs", type=int, default=default_epochs)
    group.add_argument("--max_steps", type=int, default=0,
                       help="Stop after this many optimizer steps (0: run all epochs).")
    group.add_argument("--gradient_accumulation_steps", type=int, default=1)
    group.add_argument("--lr_scheduler_type", type=str, default="cosine", choices=SCHEDULERS)
    group.add_argument("--num_warmup_steps", type=int, default=0)
    group.add_argument("--seed", type=int, default=1234)
    group.add_argument("--gradient_checkpointing", action="store_true")
    group.add_argument("--output_dir", type=str, default=None, help="Where the trained model is saved.")
    return group


def add_deepspeed_args(parser):
    group = parser.add_argument_group("deepspeed")
    group.add_argument("--local_rank", type=int, default=-1, help="Set by the deepspeed launcher.")
    group.add_argument("--offload", action="store_true",
                       help="Offload optimizer state (and at ZeRO-3 parameters) to the CPU (DeepSpeedCPUAdam).")
    group.add_argument("--dtype", type=str, default="auto", choices=DTYPES,
                       help="Training precision; auto is fp16 on CUDA and fp32 elsewhere.")
    group.add_argument("--zero_stage", type=int, default=0, choices=(0, 1, 2, 3))
    import deepspeed

    deepspeed.add_config_arguments(parser)
    return group


def add_lora_args(parser):
    group = parser.add_argument_group("LoRA")
    group.add_argument("--lora_dim", type=int, default=0, help="LoRA rank; 0 disables LoRA.")
    group.add_argument("--lora_module_name", type=str, default="layers.",
                       help="Comma-separated parts of the names of the linear layers LoRA wraps.")
    group.add_argument("--only_optimize_lora", action="store_true", help="Train the LoRA factors only.")
    group.add_argument("--lora_learning_rate", type=float, default=5e-4)
    return group


def add_logging_args(parser):
    group = parser.add_argument_group("logging")
    group.add_argument("--enable_tensorboard", action="store_true")
    group.add_argument("--tensorboard_path", type=str, default="step_tensorboard")
    group.add_argument("--print_interval", type=int, default=10,
                       help="Optimizer steps between two loss/throughput lines.")
    return group


def add_eval_interval_args(group):
    """Step 2's and DPO's mid-run evaluations, on their logging group."""
    group.add_argument("--eval_interval", type=int, default=0,
                       help="Optimizer steps between evaluations (0: only before and after training).")
    group.add_argument("--eval_iters", type=int, default=0,
                       help="Eval batches per evaluation (0: the whole eval split).")
    return group


def add_checkpoint_args(parser):
    group = parser.add_argument_group("checkpoints")
    group.add_argument("--save_steps", type=_at_least(0), default=0,
                       help="Save a resumable checkpoint in <output_dir>/checkpoints/ every N optimizer steps (step 3: "
                            "prompt batches) and at the last one; 0: never.")
    group.add_argument("--save_total_limit", type=_at_least(1), default=2,
                       help="Keep the newest N checkpoints (older ones are deleted once a new one is complete).")
    group.add_argument("--resume", action="store_true",
                       help="Resume from the latest complete checkpoint in <output_dir>/checkpoints/ (start from "
                            "the beginning if there is none).")
    return group


def _at_least(minimum):
    """An argparse `type`: an int of at least `minimum` (else a one-line error naming the flag)."""
    from argparse import ArgumentTypeError

    def parse(text):
        value = int(text)
        if value < minimum:
            raise ArgumentTypeError(f"must be at least {minimum}, not {value}")
        return value

    parse.__name__ = "int"
    return parse


def check_common_args(args):
    """Flag combinations no step can run with, refused before any model is loaded."""
    positive = ["per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps",
                "max_seq_len", "num_train_epochs"]
    for name in positive:
        if hasattr(args, name) and getattr(args, name) < 1:
            raise ConfigError(f"--{name} must be at least 1, not {getattr(args, name)}")
    # Steps 1 and 2 have --lora_dim; step 3 has --actor_lora_dim / --critic_lora_dim and checks them itself.
    if getattr(args, "only_optimize_lora", False) and hasattr(args, "lora_dim") and args.lora_dim <= 0:
        raise ConfigError("--only_optimize_lora needs --lora_dim > 0")
    if getattr(args, "learning_rate", 1.0) <= 0:
        raise ConfigError(f"--learning_rate must be positive, not {args.learning_rate}")


def check_output_file(flag, path):
    """Refuse an output file whose folder does not exist, before any work that would be lost at the end."""
    if path and not Path(path).resolve().parent.is_dir():
        raise ConfigError(f"{flag} {path}: its folder {Path(path).resolve().parent} does not exist")
