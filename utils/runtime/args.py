"""Command-line flags shared by the steps and tools, under DeepSpeed-Chat's names: each flag is declared once, in a
group function (or a one-flag function where scripts place it in different groups), and every numeric flag's range
is one row of FLAG_RANGES."""
import argparse
import json
import math
from pathlib import Path

from utils.runtime.ds_utils import DTYPES
from utils.runtime.errors import (ArgumentParser,  # noqa: F401 (ArgumentParser: the CLIs import it from here)
                                  ConfigError)
from utils.runtime.paths import check_writable_folder
from utils.runtime.trackers import NONE, TRACKERS, check_run_group, resolve_report_to
from utils.runtime.sandbox import TOOLS
from utils.runtime.tool_format import DEFAULT_TAGS

SCHEDULERS = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup")
ZERO_STAGES = (0, 1, 2, 3)
AUTO = "auto"
"""A length flag's value asking for the data's own length (utils.data.data_utils.fit_auto_lengths); also
`auto:max` and `auto:P` (is_auto)."""
AUTO_FORMS = "auto, auto:max or auto:P with P in (0, 100]"


def is_auto(value):
    """True for a length flag's `auto`, `auto:max` or `auto:P`: the data's own length, measured once the tokenizer
    is loaded (length_or_auto checks the form; utils.data.data_utils.auto_percentile reads it)."""
    return isinstance(value, str) and (value == AUTO or value.startswith(AUTO + ":"))


def registry_help(rows, source):
    """A registry flag's help: each name of `rows` ({name: row with a `help` phrase}) with its phrase, and the file
    that holds the rows (a phrase's % kept as itself by argparse)."""
    return "; ".join(f"{name}: {row.help}" for name, row in rows.items()).replace("%", "%%") + f" ({source})."


DATA_SPLIT = "2,4,4"
"""Every step's default --data_split (DeepSpeed-Chat's): step N trains on part N of each data set."""


def add_data_args(parser, default_max_seq_len=256, data_path_nargs="*"):
    """The data sets and their split (`utils/data/data_utils.py`), with --max_seq_len unless default_max_seq_len is
    None."""
    group = parser.add_argument_group("data")
    add_data_path_arg(group, nargs=data_path_nargs)
    group.add_argument("--data_split", type=str, default=DATA_SPLIT,
                       help="Proportions of each data set for steps 1, 2 and 3, e.g. 2,4,4.")
    group.add_argument("--data_output_path", type=str, default="/tmp/data_files/",
                       help="Where the shuffled split indices are cached (a local, non-shared folder).")
    if default_max_seq_len is not None:  # step 3 has --max_prompt_seq_len and --max_answer_seq_len instead
        add_max_seq_len_arg(group, default_max_seq_len)
        group.add_argument("--answer_filter_fn", default=None, metavar="FN",
                           help="Train only on the rows whose chosen answer this reward function (as --reward_fn "
                                "names them: builtin, reasoning_gym, module:function...) gives full marks (1), "
                                "and, for pairs, whose rejected answer it scores lower; the rest are skipped and "
                                "counted. For data whose chosen answers are partly wrong and a checker at hand.")
    group.add_argument("--max_auto_len", type=int, default=None,
                       help="The most tokens a length flag's auto may take: a bound of memory and time (default: "
                            "the model's context as its tokenizer states it).")
    add_column_args(parser)
    return group


COLUMN_FLAG_SUFFIX = "_key"


COLUMN_FIELDS = {
    "prompt": "The column holding the prompt (a string, or a list of chat messages).",
    "chosen": "The column holding the chosen answer (or the whole chosen dialogue or conversation).",
    "rejected": "The column holding the rejected answer (or the whole rejected dialogue or conversation).",
    "completion": "The column holding a prompt's one answer (TRL's prompt-completion form, as SFT data; KTO's "
                  "labelled answer).",
    "label": "The column holding KTO's label: true for a desirable completion, false for an undesirable one.",
    "messages": "The column holding a whole chat (a list of messages) whose last message is the answer.",
    "better_response_id": "The column saying which of two responses is the better (PKU-SafeRLHF's layout): "
                          "--better_response_id_key safer_response_id prefers the safer response.",
}
"""The fields of the row shapes (utils/data/pair_formats.py) whose column a --<field>_key flag names."""


def add_column_args(parser, dashes=False, description=None):
    """The "data columns" group: --<field>_key names the column of the user's data holding field <field> of the
    row shapes (utils/data/pair_formats.py); the columns are renamed to the fields before the shape is read.
    `dashes`: spelt --<field>-key (train.py's flags), with `description` as the group's."""
    group = parser.add_argument_group(
        "data columns", description or "Which columns of a local file, a hub data set or a save_to_disk folder "
                                       "hold the fields of the row shapes (as OpenRLHF's --prompt_key; default: the "
                                       "field's own name). Not for the DeepSpeed-Chat registry names, builtin or "
                                       "reasoning_gym, whose fields are fixed.")
    for field, help in COLUMN_FIELDS.items():
        flag = column_flag(field)
        group.add_argument(flag.replace("_", "-") if dashes else flag, dest=flag[2:], default=None, metavar="COLUMN",
                           help=help)
    return group


def column_flag(field):
    """The flag that names the column of `field`: --prompt_key for prompt."""
    return f"--{field}{COLUMN_FLAG_SUFFIX}"


def column_keys(args):
    """{field: column} of the data-columns flags given (`--prompt_key question`: {"prompt": "question"}); two
    fields in one column are refused."""
    keys = {dest[:-len(COLUMN_FLAG_SUFFIX)]: column for dest, column in sorted(vars(args).items())
            if dest.endswith(COLUMN_FLAG_SUFFIX) and column is not None}
    fields = {}
    for field, column in keys.items():
        if not column:
            raise ConfigError(f"{column_flag(field)} must name a column, not an empty string")
        if column in fields:
            raise ConfigError(f"{column_flag(fields[column])} and {column_flag(field)} both name column '{column}'; "
                              "a column holds one field")
        fields[column] = field
    return keys


def add_data_path_arg(group, nargs="*", help=None):
    group.add_argument("--data_path", nargs=nargs, default=["builtin"],
                       help=help or "Data sets: DeepSpeed-Chat registry names (e.g. Dahoas/rm-static), local/jsonfile, "
                                    "a local folder or .json/.jsonl/.parquet/.csv file, a save_to_disk folder, any hub "
                                    "data set datasets.load_dataset reads (offline: from the Hugging Face cache), "
                                    "'builtin' (the built-in task, offline), or reasoning-gym tasks, "
                                    "'reasoning_gym:<task>[?key=value&...][,<task>...]' (the gym extra).")


def add_max_seq_len_arg(group, default=256, auto=True, default_help="%(default)s"):
    """The longest sample in tokens (auto: also `auto`, `auto:max`, `auto:P`: the data's own); `default_help` says
    what the default is."""
    auto_help = (", or auto: the 95th percentile of the data's prompt + answer lengths, longer rows dropped (auto:max "
                 "the longest, auto:P the P-th), at most the model's context") if auto else ""
    group.add_argument("--max_seq_len", type=length_or_auto if auto else int, default=default,
                       help="Maximum tokens of prompt + answer + EOS: a longer sample or pair is skipped and counted "
                            f"(an answer is never cut before its EOS){auto_help}; default {default_help}.")


def add_model_args(parser):
    group = parser.add_argument_group("model")
    add_model_name_or_path_arg(group)
    group.add_argument("--dropout", type=float, default=None,
                       help="Set every dropout probability of the model to this; unset keeps the model's own.")
    add_trust_remote_code_arg(group)
    return group


def add_model_name_or_path_arg(group, help="A Hugging Face model name or folder, or a built-in name: tiny, "
                                           "smollm2-135m.", required=False):
    """The model a script trains or runs (default tiny, unless required)."""
    group.add_argument("--model_name_or_path", type=str, required=required, default=None if required else "tiny",
                       help=help)


def add_trust_remote_code_arg(group):
    group.add_argument("--trust_remote_code", action="store_true",
                       help="Allow the model folder's own Python code to run (off by default).")


def add_dtype_arg(group, inference=False):
    """The precision of a step's engines or (inference: the tools that run a model on the CPU) of that model."""
    group.add_argument("--dtype", type=str, default="auto", choices=DTYPES,
                       help="Precision; auto is bf16 where the hardware runs it natively (" + (
                           "a CPU with AMX or AVX-512 BF16), else fp32 (said at start-up)." if inference else
                           "a GPU with bf16, a CPU with AMX or AVX-512 BF16), else fp16 on CUDA and fp32 on a CPU."))


def add_seed_arg(group, default=1234, covers="the data split and order, the initialisation and the sampling"):
    group.add_argument("--seed", type=int, default=default,
                       help=f"Random seed of {covers}, for reproducible runs; default %(default)s.")


def rollouts_per_batch(args):
    """Step 3's rollouts of one prompt batch on one process: --per_device_generation_batch_size prompts x
    --num_samples_per_prompt answers each."""
    return args.per_device_generation_batch_size * args.num_samples_per_prompt


BATCH_SIZE = 64
"""Rows a tool that runs a model (an evaluation, a scoring) takes at once. Decoding a small model on a CPU is bound
by reading its weights once a step, whatever the rows, so more rows answer more per second (64 against 32 on
SmolLM2-135M: docs/tools.md)."""


def add_batch_size_arg(group, what="Prompts generated together"):
    """The batch of a tool that runs a model (the steps have --per_device_*_batch_size)."""
    group.add_argument("--batch_size", type=int, default=BATCH_SIZE, help=f"{what}; default %(default)s.")


def add_output_dir_arg(group, help="Where to store the model (a Hugging Face folder; required).", required=False):
    group.add_argument("--output_dir", type=str, required=required, default=None, help=help)


def add_output_json_arg(group, what="the scores"):
    """An evaluation's result file (check it with utils.runtime.paths' `check_output_file("--output_json", ...)`)."""
    group.add_argument("--output_json", type=str, default=None, help=f"Write {what} here (JSON).")


def add_reward_fn_arg(group, role, required=False):
    """A reward function (utils/rl/reward_fns.py) by its spec; `role` says what the script does with it."""
    group.add_argument("--reward_fn", type=str, required=required, default=None,
                       help=f"{role}: builtin (the built-in task's checker, [0, 1]), reasoning_gym (the verifier of "
                            "--data_path's reasoning-gym tasks), a registered name, package.module:function or "
                            "path/to/file.py:function, called on (prompts, answers) -> floats "
                            "(utils/rl/reward_fns.py).")


def add_num_padding_at_beginning_arg(group, passed_to="recorded in the saved config"):
    group.add_argument("--num_padding_at_beginning", type=int, default=0,
                       help=f"DeepSpeed-Chat's flag for OPT-style tokenizers (padding tokens a sequence starts with), "
                            f"{passed_to}; the end score is found from the attention mask, so padding never moves it.")


def add_offload_reference_model_arg(group):
    group.add_argument("--offload_reference_model", action="store_true",
                       help="Enable ZeRO Offload for the frozen reference model: its parameters on the CPU (ZeRO-3).")


def add_sampling_args(group, what="the answers", temperature_also=""):
    """Temperature and nucleus top-p of sampled answers (step 3's rollouts, the tools' answers)."""
    group.add_argument("--temperature", type=float, default=1.0,
                       help=f"Sampling temperature of {what}{temperature_also} (> 0); default %(default)s.")
    group.add_argument("--top_p", type=float, default=1.0,
                       help=f"Nucleus sampling of {what}: keep the smallest set of tokens whose probability reaches "
                            "this (1: off); default %(default)s.")


def add_tool_args(parser):
    """The actor's tool calls (inference/tool_rollout.py), in one "tools" group: step 3's rollouts and
    evaluations, prompt_eval.py, chat.py."""
    group = parser.add_argument_group("tools")
    group.add_argument("--tools", type=str, default=None, choices=tuple(TOOLS),
                       help="Let the actor call a tool: an answer may hold a call (--tool_tags), generation stops "
                            "at its end, the tool runs it and its output is appended as context (never trained on), "
                            "and the answer goes on; evaluations report the score with and without it and how "
                            "often it was called and ran cleanly. " + registry_help(TOOLS, "utils/runtime/sandbox.py"))
    group.add_argument("--max_tool_calls", type=int, default=2,
                       help="--tools: the most calls in one answer; default %(default)s.")
    group.add_argument("--tool_timeout", type=float, default=5.0,
                       help="--tools: the wall-clock seconds a call may run before it is killed (its answer then "
                            "reads the word timeout); default %(default)s.")
    group.add_argument("--tool_tags", nargs=4, default=list(DEFAULT_TAGS),
                       metavar=("CALL_OPEN", "CALL_CLOSE", "OUTPUT_OPEN", "OUTPUT_CLOSE"),
                       help="--tools: the tags around a call and around its output; default %(default)s.")
    return group


def add_generation_args(parser, *, fallback_length=16, auto_length=False, greedy=False, samples_per_prompt=None,
                        samples_help="", batch_size=True, covers="the sampling"):
    """The flags of a tool that answers prompts with a model on the CPU (chat.py, prompt_eval.py, sample_pairs.py),
    in one "generation" group, returned: --max_new_tokens (default None: the answer length the model was trained to,
    else `fallback_length`; auto_length: also `auto`), --temperature, --top_p, --greedy (if `greedy`),
    --samples_per_prompt (if a default is given; `samples_help` ends its help), --batch_size (if `batch_size`),
    --seed (`covers`: what it seeds), --dtype and --trust_remote_code. A tool sets other defaults with
    parser.set_defaults."""
    group = parser.add_argument_group("generation")
    group.add_argument("--max_new_tokens", type=length_or_auto if auto_length else int, default=None,
                       help="The longest answer, in tokens" + (
                           ", or auto: twice the 95th percentile of the reference answers' lengths of --data_path "
                           "(auto:max: twice the longest)" if auto_length else "") +
                            " (default: the answer length the model was trained to, from its saved settings; else "
                            f"{fallback_length}).")
    add_sampling_args(group)
    if greedy:
        group.add_argument("--greedy", action="store_true",
                           help="Greedy decoding only: the most likely token at each step instead of sampling.")
    if samples_per_prompt is not None:
        group.add_argument("--samples_per_prompt", type=int, default=samples_per_prompt,
                           help=f"Answers sampled per prompt{samples_help}; default %(default)s.")
    if batch_size:
        add_batch_size_arg(group)
    add_seed_arg(group, covers=covers)
    add_dtype_arg(group, inference=True)
    add_trust_remote_code_arg(group)
    return group


def add_training_args(parser, default_lr=1e-3, default_epochs=1):
    group = parser.add_argument_group("training")
    group.add_argument("--per_device_train_batch_size", type=int, default=16,
                       help="Batch size (per device) for the training dataloader: sequences (step 2, DPO: pairs) "
                            "per micro-batch of each process.")
    group.add_argument("--per_device_eval_batch_size", type=int, default=16,
                       help="Batch size (per device) for the evaluation dataloader.")
    group.add_argument("--learning_rate", type=float, default=default_lr,
                       help="Initial learning rate (after the potential warmup period) to use; default %(default)s.")
    group.add_argument("--weight_decay", type=float, default=0.0,
                       help="Weight decay to use (AdamW's, not on biases and norms).")
    group.add_argument("--gradient_checkpointing", action="store_true",
                       help="Enable HF gradient checkpointing for the model: recompute activations in the backward "
                            "pass, less memory for more time.")
    group.add_argument("--compile", action="store_true",
                       help="torch.compile the model (TorchInductor, forward and backward; evaluations stay eager). "
                            "The first step compiles, and the first batch of a new length again (minutes on a CPU, "
                            "seconds from TorchInductor's cache); pays on small models over long runs "
                            "(docs/performance.md).")
    add_schedule_args(group, default_epochs)
    return group


def add_schedule_args(group, default_epochs=1, default_warmup_steps=0, steps="optimizer steps"):
    """The flags of how long a step trains, its learning-rate schedule, its seed and its output, which every step
    has. `steps`: the unit a step counts in (step 3: prompt batches)."""
    group.add_argument("--num_train_epochs", type=int, default=default_epochs,
                       help="Total number of training epochs to perform (passes over the training split).")
    group.add_argument("--max_steps", type=int, default=0,
                       help=f"Stop after this many {steps} (0: run all epochs).")
    group.add_argument("--max_train_minutes", type=float, default=0,
                       help=f"Stop training at the end of the first of its {steps} that ends past this many "
                            f"minutes in its loop (0: no time budget); a resumed run counts its earlier minutes. "
                            f"The learning-rate schedule stays that of the whole step budget.")
    group.add_argument("--gradient_accumulation_steps", type=int, default=1,
                       help="Number of micro-batches whose gradients are accumulated before each optimizer step.")
    group.add_argument("--lr_scheduler_type", type=str, default="cosine", choices=SCHEDULERS,
                       help="The scheduler type to use (transformers' get_scheduler); default cosine, to 0 at the "
                            "last optimizer step.")
    group.add_argument("--num_warmup_steps", type=int, default=default_warmup_steps,
                       help="Number of optimizer steps for the warmup in the lr scheduler; default %(default)s.")
    add_seed_arg(group)
    add_output_dir_arg(group)
    return group


def add_deepspeed_args(parser, zero_stage=True, config_applies_to="the model's training engine"):
    """The flags of the DeepSpeed engines. zero_stage: the one model's --zero_stage (a step that trains several
    models, step 3, declares a stage per model in the returned group). config_applies_to: which engines a
    --deepspeed_config file configures."""
    group = parser.add_argument_group("deepspeed")
    group.add_argument("--local_rank", type=int, default=-1,
                       help="local_rank for distributed training (set by the deepspeed launcher; -1: not launched).")
    group.add_argument("--offload", action="store_true",
                       help="Enable ZeRO Offload techniques: optimizer state (and at ZeRO-3 parameters) on the CPU "
                            "(DeepSpeedCPUAdam); needs ZeRO stage 1, 2 or 3.")
    add_dtype_arg(group)
    if zero_stage:
        group.add_argument("--zero_stage", type=int, default=0, choices=ZERO_STAGES,
                           help="ZeRO optimization stage of the model: 0 none, 1 partitions optimizer state across "
                                "processes, 2 also gradients, 3 also parameters.")
    import deepspeed

    deepspeed.add_config_arguments(parser)
    describe_deepspeed_config_args(parser, config_applies_to)
    return group


DEEPSPEED_CONFIG_HELP = {
    "deepspeed": "Accepted for DeepSpeed-Chat's scripts (which pass it); no effect: every step runs on DeepSpeed.",
    "deepspeed_config": "A DeepSpeed JSON config file laid key by key over the config the flags build, for {}. Its "
                        "batch sizes must agree with the flags, and it may not have optimizer or scheduler sections "
                        "(the flags build those).",
    "deepscale": "Deprecated name of --deepspeed (no effect).",
    "deepscale_config": "Deprecated name of --deepspeed_config (not read: use --deepspeed_config).",
}


def describe_deepspeed_config_args(parser, config_applies_to):
    """deepspeed.add_config_arguments's flags, told what they do here."""
    for action in parser._actions:
        if action.dest in DEEPSPEED_CONFIG_HELP:
            action.help = DEEPSPEED_CONFIG_HELP[action.dest].format(config_applies_to)


def add_lora_args(parser):
    group = parser.add_argument_group("LoRA")
    group.add_argument("--lora_dim", type=int, default=0, help="LoRA rank; if > 0, use LoRA for efficient training.")
    group.add_argument("--lora_module_name", type=str, default="layers.",
                       help="The scope of LoRA: comma-separated parts of the names of the linear layers it wraps.")
    add_only_optimize_lora_arg(group)
    group.add_argument("--lora_learning_rate", type=float, default=5e-4,
                       help="Initial LoRA learning rate (after the potential warmup period) to use.")
    return group


def add_only_optimize_lora_arg(group):
    group.add_argument("--only_optimize_lora", action=argparse.BooleanOptionalAction, default=False,
                       help="Only optimize the LoRA parameters (the rest stays frozen); --no-only_optimize_lora "
                            "undoes a recipe's, to train every weight with --lora_dim 0.")


def add_logging_args(parser, default_tensorboard_path="step_tensorboard", default_print_interval=10,
                     steps="optimizer steps"):
    group = parser.add_argument_group("logging")
    group.add_argument("--report_to", nargs="+", choices=(*TRACKERS, NONE), default=[NONE], metavar="TRACKER",
                       help="Where the losses, learning rate, throughput and evaluations go besides the console, one "
                            "or more of: " + registry_help(TRACKERS, "utils/runtime/trackers.py")[:-1]
                            + f"; {NONE} (the default): none of them.")
    group.add_argument("--enable_tensorboard", action="store_true",
                       help="Add tensorboard to --report_to.")
    group.add_argument("--tensorboard_path", type=str, default=default_tensorboard_path,
                       help="Folder of the TensorBoard event files; default %(default)s.")
    group.add_argument("--tracking_dir", type=str, default=None,
                       help="Folder of the W&B offline runs (wandb/) and the MLflow file store (mlruns/) unless "
                            "WANDB_DIR or MLFLOW_TRACKING_URI say otherwise; default --output_dir.")
    group.add_argument("--run_group", type=str, default=None,
                       help="Groups this run with the other stages of a pipeline (train.py passes one): its W&B "
                            "group, its MLflow parent run; default none.")
    group.add_argument("--print_interval", type=int, default=default_print_interval,
                       help=f"{steps.capitalize()} between two loss/throughput lines; default %(default)s.")
    return group


def add_eval_interval_args(group):
    """The mid-run evaluations of steps 1 and 2, DPO and KTO, and the early stopping they allow, on their logging
    group."""
    group.add_argument("--eval_interval", type=int, default=0,
                       help="Optimizer steps between evaluations (0: only before and after training).")
    group.add_argument("--eval_iters", type=int, default=0,
                       help="Eval batches per evaluation (0: the whole eval split).")
    group.add_argument("--early_stopping_patience", type=int, default=0,
                       help="Stop training when the eval loss has not improved for this many --eval_interval "
                            "evaluations in a row (0: never), as transformers' EarlyStoppingCallback.")
    add_load_best_arg(group, "Save the model as it was at its best evaluation (the lowest eval loss; step 1 with "
                             "--early_stopping_metric score: the highest score) rather than as it ends, the "
                             "evaluation after training among them (needs --eval_interval), as transformers' flag "
                             "of that name.")
    return group


def add_load_best_arg(group, help):
    """--load_best_model_at_end: the model of a step's best evaluation is the one saved (utils/trainer/best.py)."""
    group.add_argument("--load_best_model_at_end", action="store_true", help=help)


def add_eval_prompts_arg(group, default, help):
    """--eval_prompts: how many questions a mid-run evaluation answers (step 3's held-out scores, step 1's
    --early_stopping_metric score)."""
    group.add_argument("--eval_prompts", type=int, default=default, help=help)


def add_checkpoint_args(parser):
    group = parser.add_argument_group("checkpoints")
    group.add_argument("--save_steps", type=int, default=0,
                       help="Save a resumable checkpoint in <output_dir>/checkpoints/ every N optimizer steps (step 3: "
                            "prompt batches) and at the last one; 0: never.")
    group.add_argument("--save_total_limit", type=int, default=2,
                       help="Keep the newest N checkpoints (older ones are deleted once a new one is complete).")
    group.add_argument("--resume", action="store_true",
                       help="Resume from the latest complete checkpoint in <output_dir>/checkpoints/ (start from "
                            "the beginning if there is none).")
    group.add_argument("--overwrite_output_dir", action="store_true",
                       help="Start over in an --output_dir that holds an earlier run's checkpoints, deleting them "
                            "(without it, or --resume, such a folder is refused).")
    return group


# Flags that may differ between a run and its --resume: they change what is printed, logged or saved when, or how
# fast it runs, never the weights a run ends with (--compile: only by float rounding). Every other flag shapes
# training and is checked against the checkpoint's.
RESUME_MAY_CHANGE = ("resume", "overwrite_output_dir", "save_steps", "save_total_limit", "print_interval",
                     "print_answers", "print_answers_interval", "report_to", "enable_tensorboard", "tensorboard_path",
                     "tracking_dir", "run_group", "per_device_eval_batch_size", "eval_iters", "data_output_path",
                     "local_rank", "deepspeed", "deepscale", "compile")


def training_flags(args, step):
    """The flags that shape step `step`'s training (every flag but RESUME_MAY_CHANGE), as JSON values, for a
    checkpoint to record: a --deepspeed_config file by its content."""
    flags = {"step": step}
    for name, value in sorted(vars(args).items()):
        if name in RESUME_MAY_CHANGE:
            continue
        if name in ("deepspeed_config", "deepscale_config") and value:
            value = json.loads(Path(value).read_text())
        flags[name] = value
    return json.loads(json.dumps(flags))


def length_or_auto(text):
    """An argparse `type` of a length flag: a positive number of tokens, or `auto`, `auto:max`, `auto:P` with P in
    (0, 100] (the data's own length, fixed once the tokenizer is loaded: utils.data.data_utils.fit_auto_lengths)."""
    from argparse import ArgumentTypeError

    if is_auto(text):
        spec = text[len(AUTO) + 1:]
        try:
            percentile = 100.0 if text == AUTO or spec == "max" else float(spec)
        except ValueError:
            percentile = float("nan")
        if not 0 < percentile <= 100:
            raise ArgumentTypeError(f"must be a positive number of tokens or {AUTO}, not {text!r} ({AUTO}'s forms: "
                                    f"{AUTO_FORMS})")
        return text
    try:
        value = int(text)
    except ValueError:
        raise ArgumentTypeError(f"must be a positive number of tokens or {AUTO}, not {text!r} ({AUTO}'s forms: "
                                f"{AUTO_FORMS})") from None
    if value < 1:
        raise ArgumentTypeError(f"must be at least 1 (or {AUTO}), not {value}")
    return value


length_or_auto.__name__ = "length"


def _positive(value):
    return value > 0


MAX_TIMEOUT_SECONDS = 10 ** 6
"""The longest timeout taken (11.6 days, longer than any run): the clocks that keep one (a timer, faulthandler)
overflow at 1e10 seconds or so."""


def _timeout(value):
    return 0 < value <= MAX_TIMEOUT_SECONDS


def _non_negative(value):
    return value >= 0


# The range of each numeric flag a script may have, checked for the flags it has (a name means the same thing in
# every script that has it). Written as comparisons that a NaN fails (NaN > 0 and NaN <= 0 are both false), and
# every value must be finite, so NaN and inf are refused everywhere. Checks that relate two flags, or that depend
# on another flag's value, stay with the script.
FLAG_RANGES = {
    **dict.fromkeys(("learning_rate", "lora_learning_rate", "actor_learning_rate", "critic_learning_rate",
                     "actor_lora_learning_rate", "critic_lora_learning_rate", "temperature", "cliprange",
                     "cliprange_value", "adaptive_kl_horizon", "beta", "desirable_weight",
                     "undesirable_weight", "entropy_coef_step"), ("positive", _positive)),
    "tool_timeout": (f"a positive number of seconds, at most {MAX_TIMEOUT_SECONDS}", _timeout),
    **dict.fromkeys(("weight_decay", "max_train_minutes", "actor_weight_decay", "critic_weight_decay", "kl_coef", "adaptive_kl_target",
                     "reward_clip", "unsup_coef", "missing_eos_penalty", "cliprange_low", "cliprange_high",
                     "kl_loss_coef", "overlong_penalty", "positive_nll_coef", "rpo_alpha", "deadline",
                     "entropy_coef", "target_entropy", "max_entropy_coef"),
                    ("at least 0", _non_negative)),
    **dict.fromkeys(("reward_fn_weight", "reward_model_weight", "positive_score_threshold", "simpo_gamma"),
                    ("a finite number", lambda value: True)),
    **dict.fromkeys(("dropout", "actor_dropout", "critic_dropout"), ("in [0, 1)", lambda value: 0 <= value < 1)),
    **dict.fromkeys(("ema_beta", "gamma", "lam"), ("in [0, 1]", lambda value: 0 <= value <= 1)),
    "top_p": ("in (0, 1]", lambda value: 0 < value <= 1),
    "label_smoothing": ("in [0, 0.5)", lambda value: 0 <= value < 0.5),  # a label wrong with probability < 1/2
    **dict.fromkeys(("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps",
                     "max_seq_len", "num_train_epochs", "print_interval", "print_answers_interval",
                     "per_device_generation_batch_size", "per_device_training_batch_size", "generation_batches",
                     "ppo_epochs", "num_samples_per_prompt", "eval_prompts", "save_total_limit", "batch_size",
                     "max_new_tokens", "num_prompts", "max_prompts", "samples_per_prompt", "inference_tp_size",
                     "max_tool_calls", "tp_gather_partition_size", "max_auto_len"),
                    ("at least 1", lambda value: value >= 1)),
    **dict.fromkeys(("max_steps", "num_warmup_steps", "eval_interval", "eval_iters", "critic_warmup_steps",
                     "save_steps", "num_show", "num_examples", "lora_dim", "actor_lora_dim", "critic_lora_dim",
                     "num_padding_at_beginning", "early_stopping_patience", "answer_base_rate",
                     "max_generation_batches", "stop_after_idle_rounds", "reserve_answers",
                     "reserve_greedy_answers"),
                    ("at least 0", _non_negative)),
    "seed": ("in [0, 2**32)", lambda value: 0 <= value < 2 ** 32),  # what NumPy's seeding takes
}


def check_flag_ranges(args):
    """Refuse a numeric flag outside its FLAG_RANGES range (None: unset, left to its default meaning; a length's
    `auto`: the data's)."""
    for name, (allowed, test) in FLAG_RANGES.items():
        value = getattr(args, name, None)
        if value is not None and not is_auto(value) and not (math.isfinite(value) and test(value)):
            raise ConfigError(f"--{name} must be {allowed}, not {value}")


def check_common_args(args):
    """Flag values and combinations no step can run with, refused before any model is loaded."""
    check_flag_ranges(args)
    # Steps 1 and 2 have --lora_dim; step 3 has --actor_lora_dim / --critic_lora_dim and checks them itself.
    if getattr(args, "only_optimize_lora", False) and hasattr(args, "lora_dim") and args.lora_dim <= 0:
        raise ConfigError("--only_optimize_lora needs --lora_dim > 0")
    data_output_path = getattr(args, "data_output_path", None)
    if data_output_path and Path(data_output_path).exists() and not Path(data_output_path).is_dir():
        raise ConfigError(f"--data_output_path {data_output_path} is a file, not a folder")
    column_keys(args)
    if getattr(args, "early_stopping_patience", 0) and not args.eval_interval:
        raise ConfigError("--early_stopping_patience needs --eval_interval > 0: the evaluations it counts")
    if getattr(args, "load_best_model_at_end", False) and args.eval_interval <= 0:
        raise ConfigError("--load_best_model_at_end needs --eval_interval > 0: the evaluations it chooses among")
    if not args.output_dir:
        raise ConfigError("--output_dir is required")
    # absolute, so that the run saves where it was asked to even if a reward function changes directory
    args.output_dir = str(Path(args.output_dir).absolute())
    if data_output_path:
        args.data_output_path = str(Path(data_output_path).absolute())
    args.report_to = resolve_report_to(args.report_to, args.enable_tensorboard)
    if "tensorboard" in args.report_to:  # its writer makes the folder after the data and models are loaded
        check_writable_folder("--tensorboard_path", args.tensorboard_path)
    check_run_group(args.run_group)


def add_step_args(parser, *, default_lr=1e-3, eval_interval=False, packing=False):
    """The flags of a step that trains one model on a data set (steps 1 and 2, DPO), in their groups; returns the
    groups by name ("data", "model", "training", "deepspeed", "lora", "logging", "checkpoints"), so a step adds
    its own flags to them. eval_interval: mid-run evaluations (--eval_interval, --eval_iters,
    --early_stopping_patience); packing:
    --packing (utils/data/packing.py)."""
    data = add_data_args(parser)
    if packing:
        data.add_argument("--packing", action="store_true",
                          help="Lay each batch's samples end to end in rows of up to --max_seq_len tokens "
                               "(attention and position ids kept within each sample) instead of padding every "
                               "sample to the batch's longest: the same loss, fewer padding positions. Needs a "
                               "model whose attention honours per-sample position ids (Llama-like models do; "
                               "checked at start-up).")
    groups = {"data": data, "model": add_model_args(parser),
              "training": add_training_args(parser, default_lr=default_lr),
              "deepspeed": add_deepspeed_args(parser), "lora": add_lora_args(parser),
              "logging": add_logging_args(parser)}
    if eval_interval:
        add_eval_interval_args(groups["logging"])
    groups["checkpoints"] = add_checkpoint_args(parser)
    return groups


def parse_step_args(parser, argv=None, check=None):
    """Parse and check a step's flags (`check_common_args`, then the step's own `check(args)`)."""
    args = parser.parse_args(argv)
    check_common_args(args)
    if check is not None:
        check(args)
    return args
