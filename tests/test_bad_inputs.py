"""Bad input across the CLIs, one table: every case must end in a non-zero exit, exactly one `error: ...` line on
stderr naming the problem (the file, field or flag), no traceback, and no output left behind (the output folder
absent, or as it was).

The step mains, chat.py, prompt_eval.py, rw_eval.py and sample_pairs.py are called in this process (`main(argv)`, as their
`__main__` calls it; `cli_entry` turns the error into `error: ...` on stderr and `SystemExit(2)`), which costs
milliseconds instead of the seconds of a fresh `import torch, deepspeed`. `train.py`, whose cases are about
launching, and one step main run as real processes.
"""
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.files import offline_hub, write_jsonl

ROOT = Path(__file__).resolve().parents[1]
GOOD_ROW = {"prompt": " Human: What is 1 + 2? Assistant:", "chosen": " 3", "rejected": " 4"}
LONG_PROMPT = "What is 1 + 2? " * 120  # ~840 tokens of the tiny tokenizer; its context is 512

pytestmark = pytest.mark.usefixtures("one_thread", "distributed")


@dataclass
class Case:
    id: str
    cli: str        # a key of in_process_mains(), or "train.py" / "step1 process" (run as a subprocess)
    argv: list      # "{tmp}", "{out}", "{actor}", "{critic}" are filled in
    message: tuple  # each must appear in the one error line
    exit_code: int = 2
    hide_module: str = ""  # a package made unimportable for the case (in-process CLIs only)
    setup: str = None  # a key of SETUPS: what to prepare in `tmp` and `out` first
    stdin: bytes = b""  # a process's standard input (None: closed)


STEP1 = ["--output_dir", "{out}", "--max_steps", "1", "--data_output_path", "{tmp}/cache"]
STEP2 = STEP1
STEP3 = ["--output_dir", "{out}", "--data_output_path", "{tmp}/cache", "--max_steps", "1"]
MODELS = ["--actor_model_name_or_path", "{actor}", "--critic_model_name_or_path", "{critic}"]
GRPO = ["--actor_model_name_or_path", "{actor}", "--advantage_estimator", "grpo", "--num_samples_per_prompt", "2",
        "--per_device_generation_batch_size", "4", "--per_device_training_batch_size", "8", "--max_answer_seq_len",
        "4"]
REWARD_FNS = """
def raises(prompts, answers):
    return [1 / 0 for _ in answers]


def short(prompts, answers):
    return [0.0] * (len(answers) - 1)


def not_finite(prompts, answers):
    return [float("nan")] * len(answers)


def constant(prompts, answers):
    return [1.0] * len(answers)


def wants(completions, ground_truth, **kwargs):
    return [0.0] * len(completions)
"""
SAMPLE_PAIRS = ["--model_name_or_path", "{actor}", "--output_dir", "{out}", "--data_path", "{tmp}/good", "--data_split",
                "0,1", "--data_output_path", "{tmp}/cache", "--max_new_tokens", "4", "--dtype", "fp32"]
EVAL_OUT = ["--output_json", "{out}/result.json"]

CASES = [
    Case("kto --beta of zero", "kto", [*STEP2, "--beta", "0"], ("--beta must be positive, not 0.0",)),
    Case("kto --desirable_weight of zero", "kto", [*STEP2, "--desirable_weight", "0"],
         ("--desirable_weight must be positive, not 0.0",)),
    Case("kto label that is not true or false", "kto", [*STEP2, "--data_path", "{tmp}/badlabel.jsonl"],
         ("{tmp}/badlabel.jsonl: row 1 (line 2): field 'label' must be true (a desirable completion) or false (an "
          "undesirable one), got 'yes'",)),
    Case("kto labelled row with a rejected answer too", "kto", [*STEP2, "--data_path", "{tmp}/labelrejected.jsonl"],
         ("{tmp}/labelrejected.jsonl: row 1 (line 2): field 'rejected' does not go with 'label'",)),
    Case("kto labelled row with an empty completion", "kto", [*STEP2, "--data_path", "{tmp}/emptycompletion.jsonl"],
         ("{tmp}/emptycompletion.jsonl: row 1 (line 2): field 'completion' is empty",)),
    Case("dpo --answer_filter_fn that raises", "dpo", [*STEP2, "--answer_filter_fn", "{tmp}/rewards.py:raises"],
         ("the reward function --answer_filter_fn {tmp}/rewards.py:raises raised ZeroDivisionError",)),
    Case("step1 --answer_filter_fn reasoning_gym on other data", "step1", [*STEP1, "--answer_filter_fn",
                                                                          "reasoning_gym"],
         ("--answer_filter_fn reasoning_gym scores the questions of one --data_path reasoning_gym:",)),
    Case("orpo with a reference flag", "dpo", [*STEP2, "--loss_type", "orpo", "--ref_model_name_or_path", "{actor}"],
         ("--loss_type orpo uses no reference model: drop --ref_model_name_or_path",)),
    Case("step3 unknown --policy_loss", "step3", [*STEP3, *GRPO, "--reward_fn", "builtin", "--policy_loss",
                                                  "gspo_token"], ("argument --policy_loss: invalid choice: 'gspo_token'",)),
    Case("step3 --entropy_coef above --max_entropy_coef with --target_entropy", "step3",
         [*STEP3, *GRPO, "--reward_fn", "builtin", "--target_entropy", "0.2", "--entropy_coef", "0.5"],
         ("--entropy_coef 0.5 (with --target_entropy, the first round's coefficient) is above --max_entropy_coef 0.1",)),
    Case("step3 more greedy answers reserved than answers", "step3",
         [*STEP3, *GRPO, "--reward_fn", "builtin", "--deadline", "9999999999", "--reserve_answers", "10",
          "--reserve_greedy_answers", "11"],
         ("--reserve_greedy_answers must be in [0, --reserve_answers 10], not 11",)),
    Case("step3 negative --target_entropy", "step3", [*STEP3, *GRPO, "--reward_fn", "builtin", "--target_entropy", "-1"],
         ("--target_entropy must be at least 0",)),
    Case("step3 --unsupervised_dataset_name empty (was: trained without the mix, rc 0)", "step3",
         [*STEP3, *GRPO, "--reward_fn", "builtin", "--unsupervised_dataset_name", ""],
         ("argument --unsupervised_dataset_name: the value is blank",)),
    Case("step3 --max_tool_calls 0", "step3",
         [*STEP3, *GRPO, "--reward_fn", "builtin", "--tools", "python", "--max_tool_calls", "0"],
         ("--max_tool_calls must be at least 1, not 0",)),
    Case("step3 --tool_tags inside each other", "step3", [*STEP3, *GRPO, "--reward_fn", "builtin", "--tools", "python",
                                                          "--tool_tags", "<t>", "<t>x", "<o>", "</o>"],
         ("--tool_tags: the tag '<t>' is inside the tag '<t>x'",)),
    Case("chat unknown --tools", "chat", ["--path", "tiny", "--prompt", "hi", "--tools", "bash"],
         ("argument --tools: invalid choice: 'bash'",)),
    Case("train.py --tools without step 3", "train.py", ["--algorithm", "dpo", "--tools", "python", "--output-dir",
                                                         "{out}"], ("--tools is for RL's rollouts, but --algorithm dpo "
                                                                    "has no step 3",)),
    Case("reasoning-gym tool_traces of an unknown tool", "step1",
         [*STEP1, "--data_path", "reasoning_gym:chain_sum?tool_traces=bash"],
         ("reasoning_gym:chain_sum: tool_traces=bash must be one of python",)),
    Case("train.py --data-split with a negative part, before step 1 runs", "train.py",
         ["--data-split=-1,2,2", "--output-dir", "{out}"], ("--data-split '-1,2,2' must be comma-separated",)),
    Case("train.py --output-dir holding someone's report.md (was: replaced at the end)", "train.py",
         ["--output-dir", "{out}"],
         ("--output-dir {out} holds a report.md that no run of train.py wrote",), setup="someone's report in out"),
    Case("train.py --output-dir empty (not the working directory)", "train.py", ["--output-dir", ""],
         ("--output-dir is empty",)),
    Case("train.py --data-split with no part for step 3, before step 1 runs", "train.py",
         ["--data-split", "1,1", "--output-dir", "{out}"],
         ("--data-split 1,1 has 2 part(s), but step 3 (ppo) reads part 3",)),
    Case("train.py --data-split with nothing for a step that runs", "train.py",
         ["--algorithm", "dpo", "--pair-judge", "none", "--data-split", "2,0,8", "--output-dir", "{out}"],
         ("--data-split 2,0,8 gives part 2 nothing, but step 2 (dpo) reads part 2",)),
    Case("train.py --chosen-key with data of fixed fields", "train.py",
         ["--chosen-key", "better", "--output-dir", "{out}"],
         ("--chosen-key names columns of local files", "builtin has fixed fields")),
    Case("step1 --prompt_key with data of fixed fields", "step1", [*STEP1, "--prompt_key", "question"],
         ("--prompt_key names columns of local files",)),
    Case("train.py orpo has no step 1", "train.py", ["--algorithm", "orpo", "--step", "1", "--output-dir", "{out}"],
         ("--step 1: nothing to run for --algorithm orpo",)),
    # step 1: data
    Case("step1 data path that does not exist", "step1", [*STEP1, "--data_path", "{tmp}/nowhere"],
         ("unknown data set '{tmp}/nowhere'",)),
    Case("step1 malformed JSON line", "step1", [*STEP1, "--data_path", "{tmp}/malformed"],
         ("{tmp}/malformed/train.json: malformed JSON on line 2",)),
    Case("step1 row missing a field", "step1", [*STEP1, "--data_path", "{tmp}/nofield"],
         ("{tmp}/nofield/train.json: row 1 (line 2): missing field 'chosen'",)),
    Case("step2 message row whose answer is not one assistant message", "step2",
         [*STEP2, "--data_path", "{tmp}/badmessages.jsonl"],
         ("{tmp}/badmessages.jsonl: row 2 (line 3): field 'chosen' must end in one assistant message",)),
    Case("step1 data file without rows", "step1", [*STEP1, "--data_path", "{tmp}/empty.jsonl"],
         ("{tmp}/empty.jsonl: no rows",)),
    Case("step1 --data_split with an infinite part", "step1", [*STEP1, "--data_split", "inf,1,1"],
         ("--data_split 'inf,1,1'",)),
    Case("step1 --data_split leaving step 1 nothing", "step1",
         [*STEP1, "--data_path", "{tmp}/good", "--data_split", "0,1,1"],
         ("no train data left for phase 1", "--data_split 0,1,1")),
    Case("step1 every prompt fills --max_seq_len", "step1",
         [*STEP1, "--data_path", "{tmp}/good", "--max_seq_len", "4"], ("no train data left for phase 1",)),
    Case("step1 --max_seq_len neither a number nor auto", "step1", [*STEP1, "--max_seq_len", "longest"],
         ("argument --max_seq_len: must be a positive number of tokens or auto, not 'longest'",)),
    Case("step1 --max_seq_len of zero", "step1", [*STEP1, "--max_seq_len", "0"],
         ("argument --max_seq_len: must be at least 1 (or auto), not 0",)),
    # data by hub name, save_to_disk folders, the data-columns flags
    Case("step1 --prompt_key naming no column", "step1",
         [*STEP1, "--data_path", "{tmp}/good", "--prompt_key", "question"],
         ("{tmp}/good/train.json: no column 'question' (named by --prompt_key); its columns: chosen, prompt, "
          "rejected",)),
    Case("step1 hub data set neither on the hub nor in the cache, offline", "step1",
         [*STEP1, "--data_path", "nobody/nothing"],
         ("unknown data set 'nobody/nothing'", "could not be downloaded from the Hugging Face hub nor read from its "
          "cache", "OfflineModeIsEnabled"), setup="offline hub"),
    Case("dpo two column flags naming one column", "dpo",
         [*STEP2, "--chosen_key", "answer", "--completion_key", "answer"],
         ("--chosen_key and --completion_key both name column 'answer'",)),
    Case("kto --label_key column holding neither true nor false", "kto",
         [*STEP2, "--data_path", "{tmp}/verdicts.jsonl", "--prompt_key", "q", "--completion_key", "answer",
          "--label_key", "verdict"],
         ("{tmp}/verdicts.jsonl: row 1 (line 2): field 'verdict' (--label_key) must be true",)),
    Case("step3 save_to_disk folder without the --prompt_key column", "step3",
         [*STEP3, *GRPO, "--reward_fn", "builtin", "--data_path", "{tmp}/saved", "--prompt_key", "question"],
         ("{tmp}/saved: train split: no column 'question' (named by --prompt_key)",)),
    Case("sample_pairs --prompt_key naming no column", "sample_pairs",
         [*SAMPLE_PAIRS, "--reward_fn", "builtin", "--prompt_key", "question"],
         ("{tmp}/good/train.json: no column 'question' (named by --prompt_key)",)),
    Case("rw_eval --chosen_key naming no column of the pairs file", "rw_eval",
         ["--model_name_or_path", "{critic}", "--pairs_file", "{tmp}/good/eval.json", "--chosen_key", "best",
          *EVAL_OUT], ("{tmp}/good/eval.json: no column 'best' (named by --chosen_key)",)),
    Case("prompt_eval --prompt_key naming no column", "prompt_eval",
         ["--model_name_or_path_baseline", "tiny", "--model_name_or_path_finetune", "tiny", "--data_path",
          "{tmp}/good", "--prompt_key", "question", *EVAL_OUT],
         ("{tmp}/good/train.json: no column 'question' (named by --prompt_key)",)),
    Case("train.py --prompt-key naming no column, before step 1 runs", "train.py",
         ["--data-path", "{tmp}/good", "--prompt-key", "question", "--output-dir", "{out}"],
         ("--data-path: {tmp}/good/train.json: no column 'question' (named by --prompt_key)",)),
    Case("train.py --reward-fn taking a column the data lacks, before step 1 runs", "train.py",
         ["--algorithm", "grpo", "--data-path", "{tmp}/good", "--reward-fn", "{tmp}/rewards.py:wants",
          "--output-dir", "{out}"],
         ("--reward-fn {tmp}/rewards.py:wants takes the column ground_truth, which --data_path {tmp}/good does not "
          "have (its columns: prompt, chosen, rejected)",)),
    # step 1: reasoning-gym data
    Case("step1 unknown reasoning-gym task", "step1", [*STEP1, "--data_path", "reasoning_gym:chain_summ"],
         ("reasoning_gym:chain_summ: unknown reasoning-gym task (did you mean chain_sum",)),
    Case("step1 unknown reasoning-gym setting", "step1", [*STEP1, "--data_path", "reasoning_gym:chain_sum?min_term=2"],
         ("reasoning_gym:chain_sum: unknown key 'min_term'", "valid keys: allow_negation,")),
    Case("step1 reasoning-gym setting of the wrong type", "step1",
         [*STEP1, "--data_path", "reasoning_gym:chain_sum?min_terms=two"],
         ("reasoning_gym:chain_sum: min_terms=two is not an int",)),
    Case("step1 reasoning-gym without the package", "step1", [*STEP1, "--data_path", "reasoning_gym:chain_sum"],
         ("needs the reasoning-gym package", 'pip install -e ".[gym]"'), hide_module="reasoning_gym"),
    # step 1: model
    Case("step1 model path that does not exist", "step1", [*STEP1, "--model_name_or_path", "./no/such/model"],
         ("model path ./no/such/model does not exist",)),
    Case("step1 model folder without config.json", "step1", [*STEP1, "--model_name_or_path", "{tmp}/notamodel"],
         ("model folder {tmp}/notamodel has no config.json",)),
    Case("step1 model path that is a file", "step1", [*STEP1, "--model_name_or_path", "{tmp}/good/train.json"],
         ("model path {tmp}/good/train.json is a file; give the model's folder",)),
    Case("step1 reward model as the model", "step1",
         [*STEP1, "--data_path", "{tmp}/good", "--model_name_or_path", "{critic}"],
         ("{critic} is a reward model (step 2 output)",)),
    # step 1: flags
    Case("step1 fp16 on a CPU", "step1", [*STEP1, "--dtype", "fp16"], ("--dtype fp16 is not supported",)),
    Case("step1 offload without ZeRO", "step1", [*STEP1, "--data_path", "{tmp}/good", "--offload"],
         ("--offload needs ZeRO stage 1, 2 or 3",)),
    Case("step1 --only_optimize_lora without LoRA", "step1", [*STEP1, "--only_optimize_lora"],
         ("--only_optimize_lora needs --lora_dim > 0",)),
    Case("step1 unknown flag", "step1", [*STEP1, "--learning_rte", "1e-3"],
         ("unrecognized arguments: --learning_rte",)),
    Case("step1 malformed --deepspeed_config", "step1",
         [*STEP1, "--data_path", "{tmp}/good", "--deepspeed_config", "{tmp}/malformed/train.json"],
         ("--deepspeed_config {tmp}/malformed/train.json",)),
    Case("step1 negative --max_steps", "step1", [*STEP1, "--max_steps", "-1"],
         ("--max_steps must be at least 0, not -1",)),
    Case("step1 --print_interval 0", "step1", [*STEP1, "--print_interval", "0"],
         ("--print_interval must be at least 1, not 0",)),
    # step 1: trackers (utils/runtime/trackers.py)
    Case("step1 unknown --report_to", "step1", [*STEP1, "--report_to", "tensorboard", "comet"],
         ("argument --report_to: invalid choice: 'comet' (choose from 'tensorboard', 'wandb', 'mlflow', 'none')",)),
    Case("step1 --report_to none with a tracker", "step1", [*STEP1, "--report_to", "none", "mlflow"],
         ("--report_to none turns every tracker off; it cannot be given with mlflow",)),
    Case("step1 --report_to wandb without the package", "step1", [*STEP1, "--report_to", "wandb"],
         ("--report_to wandb needs the wandb package", 'pip install -e ".[wandb]"'), hide_module="wandb"),
    Case("step1 --report_to mlflow without the package", "step1", [*STEP1, "--enable_tensorboard", "--report_to",
                                                                     "mlflow"],
         ("--report_to mlflow needs the mlflow package", 'pip install -e ".[mlflow]"'), hide_module="mlflow"),
    Case("step1 --tensorboard_path an existing file (was: a NotADirectoryError traceback)", "step1",
         [*STEP1, "--report_to", "tensorboard", "--tensorboard_path", "{tmp}/empty.jsonl"],
         ("--tensorboard_path {tmp}/empty.jsonl is a file, not a folder",)),
    Case("step1 --run_group with a quote", "step1", [*STEP1, "--run_group", "it's"],
         ("--run_group \"it's\": use 1 to 128 letters, digits, '.', '_', ':' or '-'",)),
    Case("step1 negative --seed", "step1", [*STEP1, "--seed", "-1"], ("--seed must be in [0, 2**32), not -1",)),
    Case("step1 --seed of 2**32", "step1", [*STEP1, "--seed", "4294967296"],
         ("--seed must be in [0, 2**32), not 4294967296",)),
    Case("step1 --learning_rate nan", "step1", [*STEP1, "--learning_rate", "nan"],
         ("--learning_rate must be positive, not nan",)),
    Case("step1 --dropout 2", "step1", [*STEP1, "--dropout", "2"], ("--dropout must be in [0, 1), not 2.0",)),
    Case("step1 --weight_decay nan", "step1", [*STEP1, "--weight_decay", "nan"],
         ("--weight_decay must be at least 0, not nan",)),
    Case("step1 --data_output_path an existing file", "step1", [*STEP1, "--data_output_path", "{tmp}/empty.jsonl"],
         ("--data_output_path {tmp}/empty.jsonl is a file",)),
    Case("step1 --deepspeed_config with an optimizer section", "step1",
         [*STEP1, "--data_path", "{tmp}/good", "--deepspeed_config", "{tmp}/ds_optimizer.json"],
         ("--deepspeed_config {tmp}/ds_optimizer.json: its 'optimizer' section would have no effect",)),
    Case("step1 --deepspeed_config with a ZeRO stage 7 (was: a pydantic traceback)", "step1",
         [*STEP1, "--data_path", "{tmp}/good", "--deepspeed_config", "{tmp}/ds_stage7.json"],
         ("--deepspeed_config {tmp}/ds_stage7.json: zero_optimization.stage: Input should be 0, 1, 2, 3",)),
    Case("step1 --deepspeed_config with NaN (was: clipping silently off)", "step1",
         [*STEP1, "--data_path", "{tmp}/good", "--deepspeed_config", "{tmp}/ds_nan.json"],
         ("--deepspeed_config {tmp}/ds_nan.json: NaN is not a number (a value it cannot mean)",)),
    Case("step1 --deepspeed_config gradient_clipping a string (was: a TypeError after step 1)", "step1",
         [*STEP1, "--data_path", "{tmp}/good", "--deepspeed_config", "{tmp}/ds_clipping.json"],
         ("--deepspeed_config {tmp}/ds_clipping.json: gradient_clipping must be a number",)),
    Case("step1 --deepspeed_config bf16.enabled 7 (was: a pydantic traceback)", "step1",
         [*STEP1, "--data_path", "{tmp}/good", "--dtype", "fp32", "--deepspeed_config", "{tmp}/ds_bf16_7.json"],
         ("--deepspeed_config {tmp}/ds_bf16_7.json: bf16.enabled: Input should be a valid boolean",)),
    Case("step1 --deepspeed_config fp16 and bf16 enabled (was: DeepSpeed's AssertionError)", "step1",
         [*STEP1, "--data_path", "{tmp}/good", "--deepspeed_config", "{tmp}/ds_halves.json"],
         ("--deepspeed_config {tmp}/ds_halves.json: bf16.enabled and fp16.enabled are both true",)),
    Case("step1 --deepspeed_config fp16 against --dtype fp32", "step1",
         [*STEP1, "--data_path", "{tmp}/good", "--dtype", "fp32", "--deepspeed_config", "{tmp}/ds_fp16.json"],
         ("--deepspeed_config {tmp}/ds_fp16.json: fp16.enabled is true, but --dtype chose fp32",)),
    Case("step1 --deepspeed_config communication_data_type int3 (was: a ValueError)", "step1",
         [*STEP1, "--data_path", "{tmp}/good", "--deepspeed_config", "{tmp}/ds_int3.json"],
         ("--deepspeed_config {tmp}/ds_int3.json: communication_data_type: Invalid communication_data_type",)),
    Case("step1 --deepspeed_config batch size against the flags", "step1",
         [*STEP1, "--data_path", "{tmp}/good", "--per_device_train_batch_size", "4", "--deepspeed_config",
          "{tmp}/ds_batch.json"], ("--deepspeed_config {tmp}/ds_batch.json: train_batch_size 32 disagrees with "
                                   "the 4 of the flags",)),
    Case("step1 --packing with a model that lets packed samples see each other", "step1",
         [*STEP1, "--data_path", "{tmp}/good", "--packing", "--model_name_or_path", "{tmp}/opt",
          "--max_seq_len", "128"],
         ("--packing: OPTForCausalLM does not keep packed samples apart", "drop --packing"), setup="opt model"),
    # the length flags against the model's context (was: rows trained past it; OPT: an index error mid-run)
    Case("step1 --max_seq_len over the tiny model's context", "step1", [*STEP1, "--max_seq_len", "1024"],
         ("--max_seq_len 1024 is over the model's context (512 positions, max_position_embeddings in ",)),
    Case("step1 --max_seq_len over an OPT model's learned positions", "step1",
         [*STEP1, "--data_path", "{tmp}/good", "--model_name_or_path", "{tmp}/opt"],
         ("--max_seq_len 256 is over the model's context (128 positions, max_position_embeddings in "
          "{tmp}/opt/config.json)",), setup="opt model"),
    Case("step2 --max_seq_len over the context", "step2", [*STEP2, "--max_seq_len", "1024"],
         ("--max_seq_len 1024 is over the model's context (512 positions",)),
    Case("orpo --max_seq_len over the context", "dpo", [*STEP2, "--loss_type", "orpo", "--max_seq_len", "1024"],
         ("--max_seq_len 1024 is over the model's context (512 positions",)),
    Case("kto --max_seq_len over the context", "kto", [*STEP2, "--max_seq_len", "1024"],
         ("--max_seq_len 1024 is over the model's context (512 positions",)),
    Case("step3 prompt + answer over the context", "step3",
         [*STEP3, *GRPO, "--reward_fn", "builtin", "--max_prompt_seq_len", "510"],
         ("--max_prompt_seq_len 510 + --max_answer_seq_len 4 = 514 is over the model's context (512 positions, "
          "max_position_embeddings in {actor}/config.json)",)),
    Case("step3 a prompt length that leaves no room for an auto answer", "step3",
         [*STEP3, *GRPO, "--reward_fn", "builtin", "--max_prompt_seq_len", "512", "--max_answer_seq_len", "auto"],
         ("--max_prompt_seq_len 512 leaves no room for --max_answer_seq_len auto in the model's context",)),
    Case("rw_eval --max_seq_len over the context", "rw_eval",
         ["--model_name_or_path", "{critic}", "--max_seq_len", "1024", *EVAL_OUT],
         ("--max_seq_len 1024 is over the model's context (512 positions, max_position_embeddings in "
          "{critic}/config.json)",)),
    Case("prompt_eval --max_new_tokens filling the context", "prompt_eval",
         ["--model_name_or_path_baseline", "tiny", "--model_name_or_path_finetune", "tiny", "--max_new_tokens",
          "600", *EVAL_OUT], ("max_new_tokens 600 leaves no room for a prompt in the model's context of 512 "
                              "positions",)),
    # step 1: the output folder
    Case("step1 --output_dir in use by another run", "step1", [*STEP1, "--data_path", "{tmp}/good"],
         ("--output_dir {out} is in use by another run (PID {pid}",), setup="lock out"),
    Case("step1 fresh run over an earlier run's checkpoints", "step1", [*STEP1, "--data_path", "{tmp}/good"],
         ("--output_dir {out} holds checkpoints of an earlier run (step5)", "--resume", "--overwrite_output_dir"),
         setup="checkpoint in out"),
    Case("step1 --output_dir is a file", "step1", [*STEP1, "--output_dir", "{tmp}/empty.jsonl"],
         ("--output_dir {tmp}/empty.jsonl is a file",)),
    Case("step1 --output_dir inside a file", "step1", [*STEP1, "--output_dir", "{tmp}/empty.jsonl/out"],
         ("--output_dir {tmp}/empty.jsonl/out: cannot write there",)),
    Case("step1 --output_dir not writable", "step1", [*STEP1, "--output_dir", "{readonly}/out"],
         ("--output_dir {readonly}/out: cannot write there",)),
    Case("step1 --output_dir is the input model folder", "step1",
         [*STEP1, "--model_name_or_path", "{actor}", "--output_dir", "{actor}"],
         ("would save the trained model into --model_name_or_path {actor}",)),
    Case("step3 --output_dir holding the actor as actor/", "step3",
         [*STEP3, "--actor_model_name_or_path", "{tmp}/step3out/actor", "--critic_model_name_or_path", "{critic}",
          "--output_dir", "{tmp}/step3out"],
         ("would save the trained model into --actor_model_name_or_path {tmp}/step3out/actor",),
         setup="actor in step3out"),
    # step 2
    Case("step2 empty field in a row", "step2", [*STEP2, "--data_path", "{tmp}/emptyfield.jsonl"],
         ("{tmp}/emptyfield.jsonl: row 3 (line 4): field 'chosen' is empty",)),
    Case("step2 every pair has identical answers", "step2", [*STEP2, "--data_path", "{tmp}/identical"],
         ("no train data left for phase 2",)),
    Case("step2 --only_optimize_lora without LoRA", "step2", [*STEP2, "--only_optimize_lora"],
         ("--only_optimize_lora needs --lora_dim > 0",)),
    Case("step2 reasoning-gym task without reference answers", "step2",
         [*STEP2, "--data_path", "reasoning_gym:graph_color?size=20"],
         ("reasoning_gym:graph_color?size=20: no task here has reference answers",)),
    Case("step2 --packing with a model that lets packed samples see each other", "step2",
         [*STEP2, "--data_path", "{tmp}/good", "--packing", "--model_name_or_path", "{tmp}/opt",
          "--max_seq_len", "128"],
         ("--packing: OPTModel does not keep packed samples apart",), setup="opt model"),
    # step 2, DPO
    Case("dpo reward model as the model", "dpo", [*STEP2, "--model_name_or_path", "{critic}"],
         ("{critic} is a reward model (step 2 output)",)),
    Case("dpo reference path that does not exist", "dpo", [*STEP2, "--ref_model_name_or_path", "{tmp}/noref"],
         ("--ref_model_name_or_path: model path {tmp}/noref does not exist",)),
    Case("dpo reference with another vocabulary", "dpo", [*STEP2, "--ref_model_name_or_path", "{tmp}/othervocab"],
         ("--ref_model_name_or_path {tmp}/othervocab has a vocabulary of 999 tokens",)),
    Case("dpo unknown --loss_type", "dpo", [*STEP2, "--loss_type", "kto"],
         ("argument --loss_type: invalid choice: 'kto'",)),
    Case("dpo --beta of zero", "dpo", [*STEP2, "--beta", "0"], ("--beta must be positive, not 0.0",)),
    Case("dpo --label_smoothing of one half", "dpo", [*STEP2, "--label_smoothing", "0.5"],
         ("--label_smoothing must be in [0, 0.5), not 0.5",)),
    Case("dpo negative --rpo_alpha", "dpo", [*STEP2, "--rpo_alpha", "-1"],
         ("--rpo_alpha must be at least 0, not -1.0",)),
    Case("dpo label smoothing with IPO", "dpo", [*STEP2, "--loss_type", "ipo", "--label_smoothing", "0.1"],
         ("--label_smoothing applies to --loss_type sigmoid and simpo, not ipo",)),
    Case("dpo SimPO with a reference flag", "dpo", [*STEP2, "--loss_type", "simpo", "--precompute_ref_logps"],
         ("--loss_type simpo uses no reference model: drop --precompute_ref_logps",)),
    Case("dpo every pair has identical answers", "dpo", [*STEP2, "--data_path", "{tmp}/identical"],
         ("no train data left for phase 2",)),
    # step 3: the step-1 / step-2 folders
    Case("step3 missing step-1 output", "step3",
         [*STEP3, "--actor_model_name_or_path", "{tmp}/output/actor-models/tiny", "--critic_model_name_or_path",
          "{critic}"], ("model path {tmp}/output/actor-models/tiny does not exist",)),
    Case("step3 reward model as the actor", "step3",
         [*STEP3, "--actor_model_name_or_path", "{critic}", "--critic_model_name_or_path", "{critic}"],
         ("--actor_model_name_or_path {critic} is a reward model (step 2 output)",)),
    Case("step3 actor as the critic", "step3",
         [*STEP3, "--actor_model_name_or_path", "{actor}", "--critic_model_name_or_path", "{actor}"],
         ("--critic_model_name_or_path {actor} is not a reward model",)),
    # step 3: data and flags
    Case("step3 every prompt longer than --max_prompt_seq_len", "step3",
         [*STEP3, *MODELS, "--data_path", "{tmp}/good", "--max_prompt_seq_len", "4"],
         ("no train data left for phase 3",)),
    Case("step3 --max_answer_seq_len neither a number nor auto", "step3",
         [*STEP3, *MODELS, "--max_answer_seq_len", "twice"],
         ("argument --max_answer_seq_len: must be a positive number of tokens or auto, not 'twice'",)),
    Case("step3 generation batch not a multiple of the training batch", "step3",
         [*STEP3, *MODELS, "--per_device_generation_batch_size", "6", "--per_device_training_batch_size", "4"],
         ("--per_device_generation_batch_size (6) must be a multiple of --per_device_training_batch_size (4)",)),
    Case("step3 --inference_tp_size > 1 without ZeRO-3", "step3", [*STEP3, *MODELS, "--inference_tp_size", "2"],
         ("--inference_tp_size > 1 needs --actor_zero_stage 3",)),
    Case("step3 offload without ZeRO", "step3", [*STEP3, *MODELS, "--offload", "--actor_zero_stage", "2"],
         ("--offload needs --actor_zero_stage and --critic_zero_stage",)),
    Case("step3 --only_optimize_lora without LoRA", "step3", [*STEP3, *MODELS, "--only_optimize_lora"],
         ("--only_optimize_lora needs --actor_lora_dim or --critic_lora_dim",)),
    Case("step3 --deepspeed_config gradient_clipping a string (was: a TypeError after step 1)", "step3",
         [*STEP3, *GRPO, "--reward_fn", "builtin", "--deepspeed_config", "{tmp}/ds_clipping.json"],
         ("--deepspeed_config {tmp}/ds_clipping.json: gradient_clipping must be a number",)),
    Case("step3 --deepspeed_config batch size against the flags", "step3",
         [*STEP3, *MODELS, "--per_device_generation_batch_size", "4", "--per_device_training_batch_size", "4",
          "--deepspeed_config", "{tmp}/ds_batch.json"],
         ("--deepspeed_config {tmp}/ds_batch.json: train_batch_size 32 disagrees with the 4 of the flags "
          "(--per_device_training_batch_size",)),
    Case("step3 fp16 on a CPU", "step3", [*STEP3, *MODELS, "--dtype", "fp16"], ("--dtype fp16 is not supported",)),
    Case("step3 reasoning-gym configuration the task refuses", "step3",
         [*STEP3, *MODELS, "--data_path", "reasoning_gym:chain_sum?min_terms=3&max_terms=2"],
         ("reasoning_gym:chain_sum?min_terms=3&max_terms=2: reasoning-gym refuses this configuration",
          "max_terms must be >= min_terms")),
    Case("step3 negative --max_steps", "step3", [*STEP3, *MODELS, "--max_steps", "-1"],
         ("--max_steps must be at least 0, not -1",)),
    Case("step3 --generation_batches more than the prompt batches", "step3",
         [*STEP3, *MODELS, "--data_path", "{tmp}/good", "--generation_batches", "5"],
         ("no PPO round to train: --generation_batches 5 is more than the 1 prompt batch(es) of an epoch",)),
    Case("step3 --temperature nan", "step3", [*STEP3, *MODELS, "--temperature", "nan"],
         ("--temperature must be positive, not nan",)),
    Case("step3 --cliprange -1", "step3", [*STEP3, *MODELS, "--cliprange", "-1"],
         ("--cliprange must be positive, not -1.0",)),
    Case("step3 --ema_beta 3", "step3", [*STEP3, *MODELS, "--enable_ema", "--ema_beta", "3"],
         ("--ema_beta must be in [0, 1], not 3.0",)),
    Case("step3 --actor_learning_rate nan", "step3", [*STEP3, *MODELS, "--actor_learning_rate", "nan"],
         ("--actor_learning_rate must be positive, not nan",)),
    # a damaged model folder, as chat.py and steps 1 and 2 load it
    Case("chat model folder with a truncated model.safetensors", "chat",
         ["--path", "{tmp}/broken/truncated", "--prompt", "hi"],
         ("model folder {tmp}/broken/truncated: its weights cannot be loaded (SafetensorError",),
         setup="broken models"),
    Case("chat model folder with a garbage model.safetensors", "chat",
         ["--path", "{tmp}/broken/garbage", "--prompt", "hi"],
         ("model folder {tmp}/broken/garbage: its weights cannot be loaded",), setup="broken models"),
    Case("chat model folder without weights", "chat", ["--path", "{tmp}/broken/noweights", "--prompt", "hi"],
         ("model folder {tmp}/broken/noweights: its weights cannot be loaded",), setup="broken models"),
    Case("chat model folder without tokenizer files", "chat",
         ["--path", "{tmp}/broken/notokenizer", "--prompt", "hi"],
         ("model folder {tmp}/broken/notokenizer: its tokenizer cannot be loaded",), setup="broken models"),
    Case("chat model folder with another model's (larger) tokenizer (was: an IndexError traceback)", "chat",
         ["--path", "{tmp}/broken/bigtokenizer", "--prompt", "hi"],
         ("model folder {tmp}/broken/bigtokenizer: its tokenizer has 440 tokens but the model's embeddings 340 rows",),
         setup="broken models"),
    Case("step1 model folder with another model's tokenizer (was: 100 random rows added silently)", "step1",
         [*STEP1, "--data_path", "{tmp}/good", "--model_name_or_path", "{tmp}/broken/bigtokenizer"],
         ("model folder {tmp}/broken/bigtokenizer: its tokenizer has 440 tokens but the model's embeddings 340 "
          "rows: the folder's tokenizer is another model's",), setup="broken models"),
    Case("chat malformed config.json", "chat", ["--path", "{tmp}/broken/badconfig", "--prompt", "hi"],
         ("{tmp}/broken/badconfig/config.json cannot be read as JSON",), setup="broken models"),
    Case("step1 malformed config.json", "step1", [*STEP1, "--model_name_or_path", "{tmp}/broken/badconfig"],
         ("{tmp}/broken/badconfig/config.json cannot be read as JSON",), setup="broken models"),
    Case("step1 config.json of another architecture", "step1",
         [*STEP1, "--data_path", "{tmp}/good", "--model_name_or_path", "{tmp}/broken/gpt2config",
          "--max_seq_len", "128"],
         ("model folder {tmp}/broken/gpt2config: its weights do not fit the GPT2LMHeadModel",
          "of the model's weights missing from the folder"), setup="broken models"),
    Case("step2 config.json of another architecture", "step2",
         [*STEP2, "--data_path", "{tmp}/good", "--model_name_or_path", "{tmp}/broken/gpt2config",
          "--max_seq_len", "128"],
         ("model folder {tmp}/broken/gpt2config: its weights do not fit the GPT2Model",), setup="broken models"),
    Case("step1 model folder with a truncated model.safetensors", "step1",
         [*STEP1, "--data_path", "{tmp}/good", "--model_name_or_path", "{tmp}/broken/truncated"],
         ("model folder {tmp}/broken/truncated: its weights cannot be loaded",), setup="broken models"),
    # step 3: critic-free estimators and reward functions
    Case("step3 gae without a critic", "step3", [*STEP3, "--actor_model_name_or_path", "{actor}", "--reward_fn",
                                                  "builtin"],
         ("--advantage_estimator gae needs --critic_model_name_or_path",)),
    Case("step3 critic-free without a reward", "step3", [*STEP3, *GRPO],
         ("--advantage_estimator grpo needs a reward: --reward_fn (e.g. builtin) or --critic_model_name_or_path",)),
    Case("step3 grpo with one answer per prompt", "step3",
         [*STEP3, *GRPO, "--reward_fn", "builtin", "--num_samples_per_prompt", "1"],
         ("--advantage_estimator grpo compares the answers to one prompt", "--num_samples_per_prompt of at least 2")),
    Case("step3 rollouts not a multiple of the training batch", "step3",
         [*STEP3, *GRPO, "--reward_fn", "builtin", "--per_device_training_batch_size", "3"],
         ("--per_device_generation_batch_size (4) x --num_samples_per_prompt (2) must be a multiple of "
          "--per_device_training_batch_size (3)",)),
    Case("step3 --positive_nll_coef -1", "step3",
         [*STEP3, *GRPO, "--reward_fn", "builtin", "--positive_nll_coef", "-1"],
         ("--positive_nll_coef must be at least 0, not -1.0",)),
    Case("step3 --max_generation_batches without --filter_zero_variance", "step3",
         [*STEP3, *GRPO, "--reward_fn", "builtin", "--max_generation_batches", "4"],
         ("--max_generation_batches 4 needs --filter_zero_variance",)),
    Case("step3 --stop_after_idle_rounds without --filter_zero_variance", "step3",
         [*STEP3, *GRPO, "--reward_fn", "builtin", "--stop_after_idle_rounds", "3"],
         ("--stop_after_idle_rounds 3 needs --filter_zero_variance",)),
    Case("step3 --answer_base_rate without a reward function", "step3",
         [*STEP3, *MODELS, "--answer_base_rate", "8"],
         ("--answer_base_rate corrects the --reward_fn score: give --reward_fn",)),
    Case("step3 --reward_fn that cannot be imported", "step3",
         [*STEP3, *GRPO, "--reward_fn", "no_such_module_anywhere:score"],
         ("--reward_fn no_such_module_anywhere:score: cannot import no_such_module_anywhere",)),
    Case("step3 --reward_fn that raises", "step3", [*STEP3, *GRPO, "--reward_fn", "{tmp}/rewards.py:raises"],
         ("the reward function --reward_fn {tmp}/rewards.py:raises raised ZeroDivisionError: division by zero",)),
    Case("step3 --reward_fn of the wrong length", "step3", [*STEP3, *GRPO, "--reward_fn", "{tmp}/rewards.py:short"],
         ("the reward function --reward_fn {tmp}/rewards.py:short returned 7 values for 8 answers",)),
    Case("step3 --reward_fn not finite", "step3", [*STEP3, *GRPO, "--reward_fn", "{tmp}/rewards.py:not_finite"],
         ("the reward function --reward_fn {tmp}/rewards.py:not_finite returned nan for answer 0",)),
    Case("step3 --reward_fn taking a column the data lacks", "step3",
         [*STEP3, *GRPO, "--reward_fn", "{tmp}/rewards.py:wants", "--data_path", "{tmp}/good"],
         ("--reward_fn {tmp}/rewards.py:wants takes the column ground_truth, which --data_path {tmp}/good does not "
          "have",)),
    Case("step3 --reward_fn builtin on another task's prompts", "step3",
         [*STEP3, *GRPO, "--reward_fn", "builtin", "--data_path", "{tmp}/good_other"],
         ("the reward function --reward_fn builtin raised ValueError",)),
    # inference/sample_pairs.py (8 prompts x 4 answers a split)
    Case("sample_pairs judge that raises", "sample_pairs", [*SAMPLE_PAIRS, "--reward_fn", "{tmp}/rewards.py:raises"],
         ("the reward function --reward_fn {tmp}/rewards.py:raises raised ZeroDivisionError: division by zero",)),
    Case("sample_pairs judge of the wrong length", "sample_pairs",
         [*SAMPLE_PAIRS, "--reward_fn", "{tmp}/rewards.py:short"],
         ("the reward function --reward_fn {tmp}/rewards.py:short returned 31 values for 32 answers",)),
    Case("sample_pairs judge that cannot be imported", "sample_pairs",
         [*SAMPLE_PAIRS, "--reward_fn", "no_such_module_anywhere:score"],
         ("--reward_fn no_such_module_anywhere:score: cannot import no_such_module_anywhere",)),
    Case("sample_pairs judge scoring every answer the same, on prompts without pairs to fall back on", "sample_pairs",
         [*SAMPLE_PAIRS, "--reward_fn", "{tmp}/rewards.py:constant", "--data_path", "{tmp}/promptsonly.jsonl"],
         ("no train pairs: all 7 train prompts were skipped",)),
    Case("sample_pairs one sample per prompt", "sample_pairs",
         [*SAMPLE_PAIRS, "--reward_fn", "builtin", "--samples_per_prompt", "1"],
         ("--samples_per_prompt must be at least 2, got 1",)),
    Case("sample_pairs reward model as the policy", "sample_pairs",
         [*SAMPLE_PAIRS, "--reward_fn", "builtin", "--model_name_or_path", "{critic}"],
         ("{critic} is a reward model (step 2 output)",)),
    # chat.py
    Case("chat empty prompt", "chat", ["--path", "tiny", "--prompt", "  "], ("argument --prompt: the value is blank",)),
    Case("chat prompt longer than the context", "chat", ["--path", "tiny", "--prompt", LONG_PROMPT],
         ("the prompt is too long", "context of 512 positions")),
    Case("chat reward model folder", "chat", ["--path", "{critic}", "--prompt", "hi"],
         ("{critic} is a reward model (step 2 output)",)),
    Case("chat model path that does not exist", "chat", ["--path", "/nonexistent/actor", "--prompt", "hi"],
         ("model path /nonexistent/actor does not exist",)),
    Case("chat model path empty (was: an error naming no path)", "chat", ["--path", "", "--prompt", "hi"],
         ("argument --path: the value is blank",)),
    Case("chat with standard input closed", "chat process", ["--path", "tiny"],
         ("no --prompt and standard input is closed",), stdin=None),
    Case("chat with standard input not UTF-8", "chat process", ["--path", "tiny"],
         ("standard input: not UTF-8 text (line 2, byte 6)",), stdin=b"clear\n\xff\xfe hello\n"),
    # prompt_eval.py
    Case("prompt_eval reward model as the fine-tuned model", "prompt_eval",
         ["--model_name_or_path_baseline", "tiny", "--model_name_or_path_finetune", "{critic}", *EVAL_OUT],
         ("--model_name_or_path_finetune {critic} is a reward model",)),
    Case("prompt_eval actor as --reward_model", "prompt_eval",
         ["--model_name_or_path_baseline", "tiny", "--model_name_or_path_finetune", "{actor}", "--reward_model",
          "{actor}", *EVAL_OUT], ("{actor} is not a reward model",)),
    Case("prompt_eval prompts file that does not exist", "prompt_eval",
         ["--model_name_or_path_baseline", "tiny", "--model_name_or_path_finetune", "tiny", "--prompts_file",
          "{tmp}/prompts.txt", *EVAL_OUT], ("prompts file {tmp}/prompts.txt does not exist",)),
    Case("prompt_eval prompts file not UTF-8", "prompt_eval",
         ["--model_name_or_path_baseline", "tiny", "--model_name_or_path_finetune", "tiny", "--prompts_file",
          "{tmp}/latin1.txt", *EVAL_OUT], ("prompts file {tmp}/latin1.txt: not UTF-8 text (line 1, byte 11)",)),
    Case("prompt_eval prompts file a folder", "prompt_eval",
         ["--model_name_or_path_baseline", "tiny", "--model_name_or_path_finetune", "tiny", "--prompts_file",
          "{tmp}/good", *EVAL_OUT], ("prompts file {tmp}/good is a folder, not a file",)),
    Case("prompt_eval --output_json an existing folder", "prompt_eval",
         ["--model_name_or_path_baseline", "tiny", "--model_name_or_path_finetune", "tiny", "--num_prompts", "2",
          "--output_json", "{out}"], ("--output_json {out} is a folder",)),
    Case("prompt_eval --output_json in a missing folder", "prompt_eval",
         ["--model_name_or_path_baseline", "tiny", "--model_name_or_path_finetune", "tiny", "--num_prompts", "2",
          "--output_json", "{tmp}/nowhere/result.json"], ("--output_json {tmp}/nowhere/result.json",)),
    Case("prompt_eval unknown reasoning-gym task", "prompt_eval",
         ["--model_name_or_path_baseline", "tiny", "--model_name_or_path_finetune", "tiny", "--data_path",
          "reasoning_gym:nope", *EVAL_OUT], ("reasoning_gym:nope: unknown reasoning-gym task",)),
    Case("prompt_eval --data_path that does not exist", "prompt_eval",
         ["--model_name_or_path_baseline", "tiny", "--model_name_or_path_finetune", "tiny", "--data_path",
          "{tmp}/nowhere", *EVAL_OUT],
         ("{tmp}/nowhere",)),
    Case("prompt_eval --prompts_file and --data_path together", "prompt_eval",
         ["--model_name_or_path_baseline", "tiny", "--model_name_or_path_finetune", "tiny", "--data_path",
          "reasoning_gym:gcd", "--prompts_file", "{tmp}/good/train.json", *EVAL_OUT],
         ("--prompts_file and --data_path both give the prompts",)),
    Case("prompt_eval --max_new_tokens auto with a prompts file", "prompt_eval",
         ["--model_name_or_path_baseline", "tiny", "--model_name_or_path_finetune", "tiny", "--prompts_file",
          "{tmp}/good/train.json", "--max_new_tokens", "auto", *EVAL_OUT],
         ("--max_new_tokens auto measures the reference answers of --data_path",)),
    Case("rw_eval actor as the reward model", "rw_eval", ["--model_name_or_path", "{actor}", *EVAL_OUT],
         ("{actor} is not a reward model",)),
    Case("rw_eval malformed pairs file", "rw_eval",
         ["--model_name_or_path", "{critic}", "--pairs_file", "{tmp}/malformed/train.json", *EVAL_OUT],
         ("{tmp}/malformed/train.json: malformed JSON on line 2",)),
    Case("rw_eval no pair left to score", "rw_eval",
         ["--model_name_or_path", "{critic}", "--pairs_file", "{tmp}/identical/train.json", *EVAL_OUT],
         ("{tmp}/identical/train.json: no pair left to score",)),
    Case("rw_eval --output_json empty (was: rc 0, no file written)", "rw_eval",
         ["--model_name_or_path", "{critic}", "--output_json", ""],
         ("argument --output_json: the value is blank: give one, or leave --output_json out",)),
    Case("prompt_eval --output_json empty (was: rc 0, no file written)", "prompt_eval",
         ["--model_name_or_path_baseline", "tiny", "--model_name_or_path_finetune", "tiny", "--output_json", ""],
         ("argument --output_json: the value is blank",)),
    Case("rw_eval --pairs_file empty (was: rc 0, the built-in examples scored)", "rw_eval",
         ["--model_name_or_path", "{critic}", "--pairs_file", ""], ("argument --pairs_file: the value is blank",)),
    Case("prompt_eval --prompts_file blank (was: rc 0, the held-out prompts)", "prompt_eval",
         ["--model_name_or_path_baseline", "tiny", "--model_name_or_path_finetune", "tiny", "--prompts_file", "  "],
         ("argument --prompts_file: the value is blank",)),
    Case("prompt_eval --reward_fn empty (was: rc 0, scored by the built-in checker)", "prompt_eval",
         ["--model_name_or_path_baseline", "tiny", "--model_name_or_path_finetune", "tiny", "--reward_fn", ""],
         ("argument --reward_fn: the value is blank",)),
    Case("rw_eval --output_json in a missing folder", "rw_eval",
         ["--model_name_or_path", "{critic}", "--output_json", "{tmp}/nowhere/result.json"],
         ("--output_json {tmp}/nowhere/result.json",)),
    Case("rw_eval --output_json in a folder it cannot write", "rw_eval",
         ["--model_name_or_path", "{critic}", "--output_json", "{readonly}/result.json"],
         ("--output_json {readonly}/result.json: its folder {readonly} cannot be written",)),
    Case("prompt_eval --output_json in a folder it cannot write", "prompt_eval",
         ["--model_name_or_path_baseline", "tiny", "--model_name_or_path_finetune", "tiny", "--num_prompts", "2",
          "--output_json", "{readonly}/result.json"],
         ("--output_json {readonly}/result.json: its folder {readonly} cannot be written",)),
    Case("step1 --data_output_path not writable", "step1", [*STEP1, "--data_output_path", "{readonly}/cache"],
         ("{readonly}/cache", "choose a path this user may read and write")),
    # train.py and a step main, as real processes
    Case("train.py step 3 without step-1 output", "train.py", ["--step", "3", "--output-dir", "{out}"],
         ("--step 3 needs the step-1 actor {out}/actor-models/tiny, which does not exist",)),
    Case("train.py step 2 from the SFT weights without step-1 output", "train.py",
         ["--step", "2", "--pair-judge", "none", "--output-dir", "{out}"],
         ("--step 2 (--reward-from-sft) needs the step-1 actor {out}/actor-models/tiny, which does not exist",)),
    Case("train.py --pair-judge without step-1 output", "train.py",
         ["--algorithm", "dpo", "--pair-judge", "builtin", "--step", "2", "--output-dir", "{out}"],
         ("--step 2 needs the step-1 actor {out}/actor-models/tiny, which does not exist",)),
    Case("train.py --pair-judge with orpo", "train.py",
         ["--algorithm", "orpo", "--pair-judge", "builtin", "--output-dir", "{out}"],
         ("--pair-judge judges the step-1 actor's answers, but --algorithm orpo has no step 1",)),
    Case("train.py --pair-judge with --reward-fn", "train.py",
         ["--algorithm", "grpo", "--reward-fn", "builtin", "--pair-judge", "builtin", "--output-dir", "{out}"],
         ("--pair-judge makes the reward model's pairs, but with --reward-fn there is no reward model",)),
    Case("train.py --reward-fn naming no function, before step 1 runs", "train.py",
         ["--algorithm", "grpo", "--reward-fn", "{tmp}/rewards.py:no_such_fn", "--output-dir", "{out}"],
         ("--reward-fn {tmp}/rewards.py:no_such_fn: {tmp}/rewards.py has no function 'no_such_fn'",)),
    Case("train.py --reward-fn reasoning_gym without reasoning-gym data", "train.py",
         ["--algorithm", "grpo", "--reward-fn", "reasoning_gym", "--output-dir", "{out}"],
         ("--reward-fn reasoning_gym scores the questions of one --data_path reasoning_gym:<task>... spec, but "
          "--data_path gives 0",)),
    Case("train.py --data-path that does not exist, before step 1 runs", "train.py",
         ["--data-path", "builtin", "{tmp}/nowhere.jsonl", "--output-dir", "{out}"],
         ("--data-path: unknown data set '{tmp}/nowhere.jsonl'", "no such local path exists")),
    Case("train.py --data-path with a malformed row, before step 1 runs", "train.py",
         ["--data-path", "{tmp}/malformed", "--output-dir", "{out}"],
         ("{tmp}/malformed/train.json: malformed JSON on line 2",)),
    Case("train.py --pair-judge of an unknown name", "train.py",
         ["--algorithm", "dpo", "--pair-judge", "checker", "--output-dir", "{out}"],
         ("--pair-judge 'checker' is neither a known name",)),
    Case("train.py --pair-samples without --pair-judge", "train.py",
         ["--pair-judge", "none", "--pair-samples", "8", "--output-dir", "{out}"],
         ("--pair-samples sets how --pair-judge samples; it needs --pair-judge",)),
    Case("train.py --pair-samples 1", "train.py",
         ["--pair-judge", "builtin", "--pair-samples", "1", "--output-dir", "{out}"],
         ("--pair-samples must be at least 2",)),
    Case("train.py --pair-rounds 0", "train.py",
         ["--algorithm", "dpo", "--pair-judge", "builtin", "--pair-rounds", "0", "--output-dir", "{out}"],
         ("--pair-rounds must be at least 1, not 0",)),
    Case("train.py --save-steps -1 (was: blamed on --step1-args, and a dry run passed it)", "train.py",
         ["--save-steps", "-1", "--dry-run", "--output-dir", "{out}"],
         ("--save-steps must be at least 0 (0: no checkpoints), not -1",)),
    Case("train.py --seed -1 (was: passed by a dry run, refused by step 1 once launched)", "train.py",
         ["--seed", "-1", "--dry-run", "--output-dir", "{out}"], ("--seed must be in [0, 2**32), not -1",)),
    Case("train.py --pair-rounds without --pair-judge", "train.py",
         ["--algorithm", "dpo", "--pair-judge", "none", "--pair-rounds", "2", "--output-dir", "{out}"],
         ("--pair-rounds repeats --pair-judge's sampling and DPO: it needs --algorithm dpo and --pair-judge",)),
    Case("train.py --pair-rounds for a reward model", "train.py",
         ["--pair-judge", "builtin", "--pair-rounds", "2", "--output-dir", "{out}"],
         ("--pair-rounds repeats --pair-judge's sampling and DPO: it needs --algorithm dpo and --pair-judge",)),
    Case("train.py --pair-rounds with each round's output set by hand", "train.py",
         ["--algorithm", "dpo", "--pair-judge", "builtin", "--pair-rounds", "2", "--output-dir", "{out}",
          "--step2-args", "--beta 0.2 --output_dir {tmp}/dpo"],
         ("--step2-args --output_dir: with --pair-rounds train.py sets it for each round",)),
    Case("train.py multi_node without a hostfile", "train.py",
         ["--deployment-type", "multi_node", "--hostfile", "{tmp}/hostfile", "--output-dir", "{out}"],
         ("--hostfile {tmp}/hostfile does not exist",)),
    Case("train.py --hostfile with a malformed line", "train.py",
         ["--deployment-type", "multi_node", "--hostfile", "{tmp}/hostfile.bad", "--output-dir", "{out}"],
         ("--hostfile {tmp}/hostfile.bad: line 3: expected 'HOST slots=N' (N at least 1), got 'worker-2 slots:4'",)),
    Case("train.py --hostfile of comments only", "train.py",
         ["--deployment-type", "multi_node", "--hostfile", "{tmp}/hostfile.empty", "--output-dir", "{out}"],
         ("--hostfile {tmp}/hostfile.empty: names no host (a line 'HOST slots=N' for each)",)),
    Case("train.py unknown step", "train.py", ["--step", "4", "--output-dir", "{out}"],
         ("argument --step: invalid choice: 4",)),
    Case("train.py --step1-args with an unclosed quote", "train.py",
         ["--step", "1", "--output-dir", "{out}", "--step1-args", "--data_path 'x"],
         ("--step1-args \"--data_path 'x\": No closing quotation",)),
    Case("train.py --hostfile a folder", "train.py",
         ["--deployment-type", "multi_node", "--hostfile", "{tmp}/good", "--output-dir", "{out}"],
         ("--hostfile {tmp}/good is a folder",)),
    Case("step1 --data_split with inf", "step1", [*STEP1, "--data_split", "inf,1,1"], ("--data_split 'inf,1,1'",)),
    Case("step1 main.py malformed data, as a process", "step1 process",
         [*STEP1, "--data_path", "{tmp}/malformed"], ("{tmp}/malformed/train.json: malformed JSON on line 2",)),
]


def write_bad_data(tmp):
    """The data folders and files the cases name, under `tmp`."""
    (tmp / "hostfile.bad").write_text("# two workers\nworker-1 slots=4\nworker-2 slots:4\n")
    (tmp / "hostfile.empty").write_text("# no host yet\n\n")
    kto_row = {"prompt": GOOD_ROW["prompt"], "completion": " 3", "label": True}
    write_jsonl(tmp / "badlabel.jsonl", [kto_row, dict(kto_row, label="yes")] + [kto_row] * 4)
    write_jsonl(tmp / "labelrejected.jsonl", [kto_row, dict(kto_row, rejected=" 4")] + [kto_row] * 4)
    write_jsonl(tmp / "emptycompletion.jsonl", [kto_row, dict(kto_row, completion="")] + [kto_row] * 4)
    write_jsonl(tmp / "promptsonly.jsonl", [{"prompt": GOOD_ROW["prompt"]}] * 8)
    verdict = {"q": GOOD_ROW["prompt"], "answer": " 3", "verdict": True}
    write_jsonl(tmp / "verdicts.jsonl", [verdict, dict(verdict, verdict="yes")] + [verdict] * 4)
    import datasets

    datasets.Dataset.from_list([GOOD_ROW] * 8).save_to_disk(tmp / "saved")
    for split in ("train", "eval"):
        write_jsonl(tmp / "good" / f"{split}.json", [GOOD_ROW] * 8)
        write_jsonl(tmp / "nofield" / f"{split}.json", [GOOD_ROW, {"prompt": " Human: x Assistant:", "rejected": " y"}])
        write_jsonl(tmp / "identical" / f"{split}.json", [dict(GOOD_ROW, rejected=GOOD_ROW["chosen"])] * 8)
        write_jsonl(tmp / "malformed" / f"{split}.json", [GOOD_ROW]).write_text(json.dumps(GOOD_ROW) + "\n{not json\n")
    write_jsonl(tmp / "emptyfield.jsonl", [GOOD_ROW] * 3 + [dict(GOOD_ROW, chosen="")] + [GOOD_ROW] * 2)
    messages = {"prompt": [{"role": "user", "content": "x"}], "chosen": [{"role": "assistant", "content": "y"}],
                "rejected": [{"role": "assistant", "content": "z"}]}
    bad_messages = dict(messages, chosen=[{"role": "assistant", "content": "y"}, {"role": "user", "content": "w"}])
    write_jsonl(tmp / "badmessages.jsonl", [GOOD_ROW, messages, bad_messages] + [GOOD_ROW] * 3)
    (tmp / "empty.jsonl").write_text("\n\n")
    (tmp / "ds_optimizer.json").write_text(json.dumps({"optimizer": {"type": "SGD", "params": {"lr": 0.1}}}))
    (tmp / "ds_stage7.json").write_text(json.dumps({"zero_optimization": {"stage": 7}}))
    (tmp / "ds_nan.json").write_text('{"gradient_clipping": NaN}')
    (tmp / "latin1.txt").write_bytes(" Human: caf\xe9? Assistant:\n".encode("latin-1"))
    (tmp / "ds_batch.json").write_text(json.dumps({"train_batch_size": 32}))
    (tmp / "ds_clipping.json").write_text(json.dumps({"gradient_clipping": "high"}))
    (tmp / "ds_bf16_7.json").write_text(json.dumps({"bf16": {"enabled": 7}}))
    (tmp / "ds_halves.json").write_text(json.dumps({"fp16": {"enabled": True}, "bf16": {"enabled": True}}))
    (tmp / "ds_fp16.json").write_text(json.dumps({"fp16": {"enabled": True}}))
    (tmp / "ds_int3.json").write_text(json.dumps({"communication_data_type": "int3"}))
    other_task = dict(GOOD_ROW, prompt=" Human: Tell a joke. Assistant:")
    for split in ("train", "eval"):
        write_jsonl(tmp / "good_other" / f"{split}.json", [other_task] * 8)
    (tmp / "rewards.py").write_text(REWARD_FNS)
    (tmp / "notamodel").mkdir()
    (tmp / "othervocab").mkdir()
    (tmp / "othervocab" / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 999}))


def hold_lock(tmp, out, actor):
    from utils.runtime.paths import FolderLock

    lock = FolderLock(out)
    assert lock.acquire()
    return lock.release


def make_checkpoint_in_out(tmp, out, actor):
    (out / "checkpoints" / "step5").mkdir(parents=True)
    (out / "checkpoints" / "step5" / "COMPLETE").write_text("step 5\n")


def copy_actor_into_step3out(tmp, out, actor):
    import shutil

    shutil.copytree(actor, tmp / "step3out" / "actor")


def write_broken_models(tmp, out, actor):
    """Copies of the step-1 folder under tmp/broken/, each damaged in one way."""
    import shutil

    def broken(name):
        return Path(shutil.copytree(actor, tmp / "broken" / name))

    weights = (actor / "model.safetensors").read_bytes()
    (broken("truncated") / "model.safetensors").write_bytes(weights[:len(weights) // 2])
    (broken("garbage") / "model.safetensors").write_bytes(b"not safetensors at all" * 10)
    (broken("noweights") / "model.safetensors").unlink()
    notokenizer = broken("notokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (notokenizer / name).unlink()
    (broken("badconfig") / "config.json").write_text('{"model_type": "llama",')
    config = json.loads((actor / "config.json").read_text())
    gpt2 = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": config["vocab_size"],
            "n_embd": config["hidden_size"], "n_layer": 2, "n_head": 4, "n_positions": 128}
    (broken("gpt2config") / "config.json").write_text(json.dumps(gpt2))
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(actor)
    tokenizer.add_tokens([f"<extra_{index}>" for index in range(440 - len(tokenizer))])
    tokenizer.save_pretrained(broken("bigtokenizer"))


def write_opt_model(tmp, out, actor):
    """tmp/opt: a small OPT (its attention ignores per-sample position ids) with the actor's tokenizer."""
    from transformers import AutoTokenizer, OPTConfig, OPTForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(actor)
    config = OPTConfig(vocab_size=len(tokenizer), hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                       num_attention_heads=4, max_position_embeddings=128, word_embed_proj_dim=32,
                       pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                       eos_token_id=tokenizer.eos_token_id)
    OPTForCausalLM(config).save_pretrained(tmp / "opt")
    tokenizer.save_pretrained(tmp / "opt")


def go_offline(tmp, out, actor):
    """`datasets` offline, on an empty cache of its own (HF_DATASETS_OFFLINE=1 in a fresh process)."""
    offline = offline_hub(tmp / "hf-cache")
    offline.__enter__()
    return lambda: offline.__exit__(None, None, None)


def someones_report_in_out(tmp, out, actor):
    out.mkdir()
    (out / "report.md").write_text("MY NOTES\n")


SETUPS = {"someone's report in out": someones_report_in_out, "lock out": hold_lock,
          "checkpoint in out": make_checkpoint_in_out,
          "actor in step3out": copy_actor_into_step3out, "broken models": write_broken_models,
          "opt model": write_opt_model, "offline hub": go_offline}


def unwritable_folder(tmp):
    """A folder this process cannot write in: a read-only one of ours, or for root (who may write anywhere of
    ours) a kernel file system's."""
    if os.geteuid() != 0:
        folder = tmp / "readonly"
        folder.mkdir(mode=0o555)
        return folder
    return Path("/sys/fs")


def in_process_mains():
    from inference import chatbot, sample_pairs
    from training.step1_supervised_finetuning import main as step1
    from training.step1_supervised_finetuning import prompt_eval
    from training.step2_dpo_finetuning import main as dpo
    from training.step2_kto_finetuning import main as kto
    from training.step2_reward_model_finetuning import main as step2
    from training.step2_reward_model_finetuning import rw_eval
    from training.step3_rlhf_finetuning import main as step3

    return {"step1": step1.main, "step2": step2.main, "dpo": dpo.main, "kto": kto.main, "step3": step3.main, "chat": chatbot.main,
            "prompt_eval": prompt_eval.main, "rw_eval": rw_eval.main, "sample_pairs": sample_pairs.main}


def run_in_process(main, argv, capsys):
    """(exit code, stdout, stderr) of `main(argv)`. The environment is restored afterwards: a step's start-up
    sets RANK, MASTER_PORT... for a world of one, which later subprocesses must not inherit."""
    environment = dict(os.environ)
    try:
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
    finally:
        os.environ.clear()
        os.environ.update(environment)
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def run_process(cli, argv, stdin=b"", env=None):
    """(exit code, stdout, stderr) of the script run as a process; `stdin` None: its standard input closed;
    `env`: variables to change."""
    script = {"train.py": ROOT / "train.py", "step1 process": ROOT / "training/step1_supervised_finetuning/main.py",
              "chat process": ROOT / "chat.py"}
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **(env or {}))
    feed = dict(stdin=subprocess.DEVNULL, preexec_fn=lambda: os.close(0)) if stdin is None else dict(input=stdin)
    result = subprocess.run([sys.executable, str(script[cli]), *argv], cwd=ROOT, env=env, capture_output=True,
                            timeout=300, **feed)
    return result.returncode, result.stdout.decode(errors="replace"), result.stderr.decode(errors="replace")


def folder_state(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else None


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_ends_in_one_error_line_and_leaves_no_output(case, tmp_path, step3_model_dirs, capsys,
                                                               monkeypatch):
    actor, critic = step3_model_dirs
    if case.hide_module:  # `import <module>` (and of its submodules) raises ImportError during the case
        for name in [n for n in sys.modules if n == case.hide_module or n.startswith(case.hide_module + ".")]:
            monkeypatch.setitem(sys.modules, name, None)
        monkeypatch.setitem(sys.modules, case.hide_module, None)
    write_bad_data(tmp_path)
    out = tmp_path / "out"
    if case.cli in ("prompt_eval", "rw_eval"):
        out.mkdir()  # their output is a file in an existing folder
    cleanup = None
    if case.setup:
        cleanup = SETUPS[case.setup](tmp_path, out, actor)
    before = folder_state(out)

    places = {"{tmp}": tmp_path, "{out}": out, "{actor}": actor, "{critic}": critic, "{pid}": os.getpid()}
    if any("{readonly}" in arg for arg in case.argv):
        places["{readonly}"] = unwritable_folder(tmp_path)

    def fill(text):
        for place, value in places.items():
            text = text.replace(place, str(value))
        return text

    argv = [fill(arg) for arg in case.argv]
    try:
        if case.cli in ("train.py", "step1 process", "chat process"):
            code, stdout, stderr = run_process(case.cli, argv, case.stdin)
        else:
            code, stdout, stderr = run_in_process(in_process_mains()[case.cli], argv, capsys)
    finally:
        if cleanup:
            cleanup()
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert code == case.exit_code, f"exit {code}; stderr: {stderr[-2000:]}"
    assert len(errors) == 1, stderr[-2000:]
    for message in case.message:
        assert fill(message) in errors[0]
    assert "Traceback" not in stderr
    assert folder_state(out) == before
    if case.cli.startswith("chat"):
        assert stdout == ""  # no answer printed


@pytest.mark.parametrize("path", ["as it is", "without the environment's bin/"])
def test_a_failing_step_under_train_py_is_one_error_line_and_leaves_only_its_log(tmp_path, path):
    """A step that fails inside the launcher: train.py names the step and the step's own error line (its log's
    tail only where it has none), and the step's folder holds nothing but the log it points to. The launcher is
    the running interpreter's own, also when its folder is not on PATH (a venv's python run by its full path)."""
    out = tmp_path / "out"
    bin_dir = str(Path(sys.executable).parent)
    env = {} if path == "as it is" else {
        "PATH": os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != bin_dir and "shims" not in p)}
    code, stdout, stderr = run_process("train.py", [
        "--step", "1", "--no-eval", "--output-dir", str(out),
        "--step1-args", f"--data_path {tmp_path}/nowhere --data_output_path {tmp_path}/cache"], env=env)
    assert code == 1, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: step 1 failed: unknown data set '{tmp_path}/nowhere': it is not a known name "
                      f"(Dahoas/rm-static, Dahoas/full-hh-rlhf, Dahoas/synthetic-instruct-gptj-pairwise, "
                      f"yitingxie/rlhf-reward-datasets, openai/webgpt_comparisons, stanfordnlp/SHP, builtin, "
                      f"local/jsonfile) and no such local path exists; re-run this step alone with --step 1"]
    assert "step 1 FAILED" in stdout and "Traceback" not in stderr
    assert "launching:" not in stdout  # the step's own error line says it: no tail of its log
    assert folder_state(out) == ["actor-models", "actor-models/tiny", "actor-models/tiny/training.log"]


def test_a_cache_variable_naming_a_file_is_one_error_line(tmp_path):
    """Before: a FileExistsError traceback from the cache's mkdir."""
    afile = tmp_path / "afile"
    afile.write_text("")
    code, _, stderr = run_process("chat process", ["--path", "tiny", "--prompt", "hi"],
                                  env={"CHATRLHF_CACHE": str(afile)})
    assert code == 2 and "Traceback" not in stderr, stderr
    assert [line for line in stderr.splitlines() if line.startswith("error:")] == [
        f"error: CHATRLHF_CACHE={afile}: cannot make the folder (File exists)"]


def test_a_cache_variable_starting_with_a_tilde_is_the_home_folders(tmp_path, monkeypatch):
    """CHATRLHF_CACHE='~/chc' (quoted, so no shell expanded it) made a folder named `~` in the working folder."""
    from utils.runtime.paths import cache_dir

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CHATRLHF_CACHE", "~/chc")
    monkeypatch.chdir(tmp_path)
    assert cache_dir() == tmp_path / "home" / "chc" and not (tmp_path / "~").exists()


def test_a_blank_cache_variable_is_refused(tmp_path, monkeypatch):
    """CHATRLHF_CACHE='   ' made a folder named by three spaces in the working folder, and the cache in it."""
    from utils.runtime.errors import ConfigError
    from utils.runtime.paths import cache_dir

    monkeypatch.setenv("CHATRLHF_CACHE", "   ")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="CHATRLHF_CACHE='   ' is blank: name the cache folder, or unset it"):
        cache_dir()
    assert list(tmp_path.iterdir()) == []
