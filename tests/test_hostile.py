"""Hostile input across the entry points (each step's main.py, chat.py, prompt_eval.py, rw_eval.py,
sample_pairs.py, `python -m bench`): reward functions that exit, hang or return what is not a list of numbers,
data in odd encodings, output folders that are inputs or in use, a full disk, signals during start-up, moved run
folders. Each case ends in one clear `error:` line naming the file, field or flag (or `interrupted: <signal>`, or
succeeds as it should), with no traceback and nothing of the user's lost: every file under the case's folder
that the run did not create is as it was.

The CLIs run in this process (`main(argv)`, as in tests/test_bad_inputs.py); the few cases about processes
(signals to a running step, a driver and a hand-run step on one folder) run real ones.
"""
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from processes import REPO, subprocess_env
from tests.files import write_jsonl
from tests.test_bad_inputs import GOOD_ROW, in_process_mains

pytestmark = pytest.mark.usefixtures("one_thread", "distributed")

STEP1 = ["--output_dir", "{out}", "--max_steps", "1", "--data_output_path", "{tmp}/cache", "--model_name_or_path",
         "{actor}", "--max_seq_len", "32", "--per_device_train_batch_size", "2"]
STEP2 = STEP1
STEP3 = ["--output_dir", "{out}", "--data_output_path", "{tmp}/cache", "--max_steps", "1",
         "--actor_model_name_or_path", "{actor}", "--advantage_estimator", "grpo", "--num_samples_per_prompt", "2",
         "--per_device_generation_batch_size", "4", "--per_device_training_batch_size", "8",
         "--max_answer_seq_len", "4", "--data_path", "{tmp}/good"]
SAMPLE_PAIRS = ["--model_name_or_path", "{actor}", "--data_path", "{tmp}/good", "--data_split", "0,1",
                "--data_output_path", "{tmp}/cache", "--max_new_tokens", "2", "--dtype", "fp32",
                "--samples_per_prompt", "2"]
PROMPT_EVAL = ["--model_name_or_path_baseline", "{actor}", "--model_name_or_path_finetune", "{actor}",
               "--num_prompts", "2", "--max_new_tokens", "2", "--num_show", "0", "--dtype", "fp32"]
BENCH = ["--quick", "--sections", "step1"]
HUGE = 1 << 30  # a 1 GiB line: written sparse, never read whole
REWARD_FNS = '''
import sys
import threading


def exits(prompts, answers):
    sys.exit(0)


def keyboard(prompts, answers):
    raise KeyboardInterrupt


def generator_exit(prompts, answers):
    raise GeneratorExit


def digits(prompts, answers):
    return "1" * len(answers)


def as_bytes(prompts, answers):
    return b"1" * len(answers)


def overflow32(prompts, answers):
    return [1e39] * len(answers)


def overflow32_numpy(prompts, answers):
    import numpy
    return numpy.full(len(answers), -1e39)


def huge_int(prompts, answers):
    return [10 ** 400] * len(answers)


def varied(prompts, answers):
    return [float(index) for index in range(len(answers))]


def as_dict(prompts, answers):
    return {answer: 1.0 for answer in answers}


def strings(prompts, answers):
    return ["1.0"] * len(answers)


def hangs(prompts, answers):
    threading.Event().wait()


def endless(prompts, answers):
    while True:
        yield 1.0


class Exiting:
    def __float__(self):
        raise SystemExit(3)


def exiting_value(prompts, answers):
    return [Exiting() for _ in answers]


def ctrl_c(prompts, answers):
    import os
    import signal
    import time
    os.kill(os.getpid(), signal.SIGINT)  # as a user's Ctrl-C while the function runs
    time.sleep(2)
    return [0.0] * len(answers)
'''
EXIT_AT_IMPORT = "raise SystemExit(0)\n\ndef f(prompts, answers):\n    return [0.0] * len(answers)\n"


@dataclass
class Case:
    id: str
    cli: str
    argv: list
    message: tuple = ()  # each must appear in the one `error:` (or `interrupted:`) line; () for a success
    exit_code: int = 2
    setup: str = None  # a key of SETUPS
    env: dict = field(default_factory=dict)  # environment variables set during the case
    stdin: str = None  # a key of STDIN (chat)
    signal_at: tuple = None  # (module, attribute, signal): the signal sent to this process when it is called
    succeeds: str = None  # a key of CHECKS: what a successful run must have left
    then: str = None  # a key of CHECKS: what a failed run must have left besides
    stdout: str = None  # "closed": standard output's reader gone (a broken pipe)
    nohup: bool = False  # SIGHUP ignored from the start, as `nohup` runs a command


CASES = [
    # ---- data in odd encodings (steps 1 and 2 read local files the same way)
    Case("step1 data in UTF-16 with a byte-order mark", "step1", [*STEP1, "--data_path", "{tmp}/utf16.jsonl"],
         ("{tmp}/utf16.jsonl: UTF-16 text", "save it as UTF-8")),
    Case("step1 data with a UTF-8 byte-order mark and CRLF line ends", "step1",
         [*STEP1, "--data_path", "{tmp}/bom_crlf"], succeeds="model saved"),
    Case("step1 a raw NUL byte inside a JSON line", "step1", [*STEP1, "--data_path", "{tmp}/nul_raw.jsonl"],
         ("{tmp}/nul_raw.jsonl: malformed JSON on line 2",)),
    Case("step1 a JSON line nested past the parser's depth", "step1", [*STEP1, "--data_path", "{tmp}/deep.jsonl"],
         ("{tmp}/deep.jsonl: line 9: JSON nested too deeply to read",)),
    Case("step1 a JSON array nested past the parser's depth", "step1", [*STEP1, "--data_path", "{tmp}/deep.json"],
         ("{tmp}/deep.json: JSON nested too deeply to read",)),
    Case("step1 a number of 5,000 digits in a JSON line (was: a ValueError traceback)", "step1",
         [*STEP1, "--data_path", "{tmp}/bigint.jsonl"], ("{tmp}/bigint.jsonl: line 6: a number of more than 4300",)),
    Case("step1 a number of 5,000 digits in a JSON array", "step1", [*STEP1, "--data_path", "{tmp}/bigint.json"],
         ("{tmp}/bigint.json: a number of more than 4300 digits",)),
    Case("step1 an arena row whose turns' JSON is nested past the parser's depth", "step1",
         [*STEP1, "--data_path", "{tmp}/arena_deep.jsonl"],
         ("{tmp}/arena_deep.jsonl: row 1 (line 2): field 'response_a': JSON nested too deeply to read",)),
    Case("step1 a KTO label that is a list (was: unhashable type)", "step1",
         [*STEP1, "--data_path", "{tmp}/kto_list_label.jsonl"],
         ("{tmp}/kto_list_label.jsonl: row 2 (line 3): field 'label' must be true",)),
    Case("step1 a ShareGPT speaker that is a list (was: unhashable type)", "step1",
         [*STEP1, "--data_path", "{tmp}/sharegpt_list_speaker.jsonl"],
         ("{tmp}/sharegpt_list_speaker.jsonl: row 0 (line 1): field 'conversations', message 0: speaker ['human']",)),
    Case("step1 weights only as a pickle (was: unpickled and trained)", "step1",
         [*STEP1, "--data_path", "{tmp}/good", "--model_name_or_path", "{tmp}/model"],
         ("model folder {tmp}/model: its weights are a pickle (pytorch_model.bin), which is never loaded",),
         setup="pickled weights"),
    Case("step1 --output_dir holding someone's files (was: README.md, config.json replaced, vocab_list.txt gone)",
         "step1", [*STEP1, "--data_path", "{tmp}/good", "--output_dir", "{tmp}/userdir"],
         ("--output_dir: {tmp}/userdir holds files the trained model's save would replace (README.md, config.json, "
          "vocab_list.txt)",)),
    Case("step1 --output_dir holding someone's files, with --overwrite_output_dir", "step1",
         [*STEP1, "--data_path", "{tmp}/good", "--output_dir", "{out}", "--overwrite_output_dir"],
         succeeds="model saved beside notes", setup="someone's files in out"),
    Case("step1 --output_dir a link to itself (was: a RuntimeError traceback)", "step1",
         [*STEP1, "--data_path", "{tmp}/good", "--output_dir", "{tmp}/loop_out"],
         ("--output_dir {tmp}/loop_out: a link that loops",)),
    Case("step1 --output_dir whose name leaves no room for a save's temporary names (was: the model lost)",
         "step1", [*STEP1, "--data_path", "{tmp}/good", "--output_dir", "{tmp}/" + "p" * 240],
         ("its name is 240 bytes long; at most 229",)),
    Case("step3 --unsupervised_dataset_name nested past the parser's depth", "step3",
         [*STEP3, "--reward_fn", "builtin", "--unsupervised_dataset_name", "{tmp}/unsup_deep.jsonl"],
         ("--unsupervised_dataset_name {tmp}/unsup_deep.jsonl: line 1: JSON nested too deeply to read",)),
    Case("chat a model whose weights hold a NaN (was: answered)", "chat", ["--path", "{tmp}/model", "--prompt", "hi"],
         ("model folder {tmp}/model: its weights hold NaN or infinite values",), setup="NaN weights"),
    Case("chat a model whose weights are a pickle", "chat", ["--path", "{tmp}/model", "--prompt", "hi"],
         ("its weights are a pickle (pytorch_model.bin)",), setup="pickled weights"),
    Case("chat a tokenizer whose model_max_length is a word (was: a TypeError traceback)", "chat",
         ["--path", "{tmp}/model", "--prompt", "hi"],
         ("tokenizer_config.json's 'model_max_length' must be a number of tokens, got 'many'",),
         setup="context a word"),
    Case("chat a model trained with an answer length of -5 (was: an error naming no file)", "chat",
         ["--path", "{tmp}/model", "--prompt", "hi"],
         ("{tmp}/model/training_settings.json: 'max_answer_seq_len' must be a number of tokens (1 or more), got -5",),
         setup="answer length -5"),
    Case("chat a config.json nested past the parser's depth", "chat", ["--path", "{tmp}/model", "--prompt", "hi"],
         ("{tmp}/model/config.json cannot be read as JSON (nested too deeply)",), setup="deep config"),
    Case("rw_eval a reward-model entry that is not an object (was: AttributeError)", "rw_eval",
         ["--model_name_or_path", "{tmp}/model"],
         ("{tmp}/model/config.json: 'chatrlhf_reward_model' must be a JSON object",), setup="reward entry true"),
    Case("rw_eval a value head named by a number (was: TypeError)", "rw_eval", ["--model_name_or_path", "{tmp}/model"],
         ("'value_head' must be the name of a file in the folder, got 5",), setup="reward head a number"),
    Case("step1 a data folder whose train.json is a folder", "step1", [*STEP1, "--data_path", "{tmp}/dir_split"],
         ("{tmp}/dir_split/train.json is a folder, not a file",)),
    Case("step1 a data folder whose train.json links to itself", "step1", [*STEP1, "--data_path", "{tmp}/loop_split"],
         ("{tmp}/loop_split/train.json: a link to nothing",)),
    Case("step1 a data path that links to itself", "step1", [*STEP1, "--data_path", "{tmp}/loop_path"],
         ("{tmp}/loop_path: a link to nothing",)),
    Case("step1 a CSV header naming a column twice", "step1", [*STEP1, "--data_path", "{tmp}/twice.csv"],
         ("{tmp}/twice.csv: line 1 names the column 'chosen' twice",)),
    Case("step1 a CSV field whose quote is not closed where it ends", "step1",
         [*STEP1, "--data_path", "{tmp}/quote.csv"],
         ("{tmp}/quote.csv: malformed CSV on line 3",)),
    Case("step1 an integer flag past sys.maxsize", "step1",
         [*STEP1, "--gradient_accumulation_steps", "99999999999999999999"],
         ("argument --gradient_accumulation_steps: 99999999999999999999 is out of range",)),
    Case("step1 a LoRA rank whose tensors cannot be allocated", "step1", [*STEP1, "--lora_dim", "1000000000000"],
         ("out of memory",)),
    Case("prompt_eval --samples_per_prompt past sys.maxsize", "prompt_eval",
         [*PROMPT_EVAL, "--samples_per_prompt", "99999999999999999999"],
         ("argument --samples_per_prompt: 99999999999999999999 is out of range",)),
    Case("step1 a NUL written as a JSON escape", "step1", [*STEP1, "--data_path", "{tmp}/nul_escaped"],
         succeeds="model saved"),
    Case("step1 a lone surrogate in a JSON escape", "step1", [*STEP1, "--data_path", "{tmp}/surrogate.jsonl"],
         ("{tmp}/surrogate.jsonl: row 1 (line 2): field 'chosen' is not valid Unicode text",
          "lone surrogate \\ud800")),
    Case("step2 a lone surrogate in a message", "step2", [*STEP2, "--data_path", "{tmp}/surrogate_messages.jsonl"],
         ("{tmp}/surrogate_messages.jsonl: row 2 (line 3): field 'rejected' is not valid Unicode text",)),
    Case("step1 a 1 GiB line", "step1", [*STEP1, "--data_path", "{tmp}/huge_line.jsonl"],
         ("{tmp}/huge_line.jsonl: line 2 is longer than", "MiB")),
    Case("step1 data path a named pipe", "step1", [*STEP1, "--data_path", "{tmp}/fifo.jsonl"],
         ("{tmp}/fifo.jsonl: not a regular file",)),
    Case("step1 --data_split whose parts overflow a float", "step1",
         [*STEP1, "--data_path", "{tmp}/good", "--data_split", "1e308,1e308,1"], succeeds="model saved"),
    Case("step3 --data_split leaving step 3 an empty part", "step3",
         [*STEP3, "--reward_fn", "builtin", "--data_split", "1e308,1e308,1"],
         ("no train data left for phase 3", "part 3 of --data_split 1e308,1e308,1 holds none of the")),
    # ---- reward functions (step 3) that exit, interrupt themselves, hang or return what is no list of numbers
    Case("step3 reward function calling sys.exit(0)", "step3", [*STEP3, "--reward_fn", "{tmp}/rewards.py:exits"],
         ("the reward function --reward_fn {tmp}/rewards.py:exits", "SystemExit")),
    Case("step3 reward module raising SystemExit(0) at import", "step3",
         [*STEP3, "--reward_fn", "{tmp}/exit_at_import.py:f"],
         ("--reward_fn {tmp}/exit_at_import.py:f: cannot import {tmp}/exit_at_import.py: SystemExit",)),
    Case("step3 reward function raising KeyboardInterrupt itself", "step3",
         [*STEP3, "--reward_fn", "{tmp}/rewards.py:keyboard"],
         ("the reward function --reward_fn {tmp}/rewards.py:keyboard raised KeyboardInterrupt",)),
    Case("step3 reward function raising GeneratorExit", "step3",
         [*STEP3, "--reward_fn", "{tmp}/rewards.py:generator_exit"],
         ("the reward function --reward_fn {tmp}/rewards.py:generator_exit raised GeneratorExit",)),
    Case("step3 reward function returning a string of digits", "step3",
         [*STEP3, "--reward_fn", "{tmp}/rewards.py:digits"],
         ("the reward function --reward_fn {tmp}/rewards.py:digits did not return a list of numbers (it returned a "
          "str",)),
    Case("step3 reward function returning bytes", "step3", [*STEP3, "--reward_fn", "{tmp}/rewards.py:as_bytes"],
         ("--reward_fn {tmp}/rewards.py:as_bytes did not return a list of numbers (it returned a bytes",)),
    Case("step3 reward function returning 1e39 (inf in float32)", "step3",
         [*STEP3, "--reward_fn", "{tmp}/rewards.py:overflow32"],
         ("the reward function --reward_fn {tmp}/rewards.py:overflow32 returned 1e+39 for answer 0", "float32")),
    Case("step3 reward function returning -1e39 in a float64 array", "step3",
         [*STEP3, "--reward_fn", "{tmp}/rewards.py:overflow32_numpy"],
         ("--reward_fn {tmp}/rewards.py:overflow32_numpy returned -1e+39 for answer 0", "float32")),
    Case("step3 reward function returning 10**400", "step3", [*STEP3, "--reward_fn", "{tmp}/rewards.py:huge_int"],
         ("--reward_fn {tmp}/rewards.py:huge_int did not return a list of numbers (answer 0's value",
          "int too large to convert to float")),
    Case("step3 reward function returning a dict", "step3", [*STEP3, "--reward_fn", "{tmp}/rewards.py:as_dict"],
         ("--reward_fn {tmp}/rewards.py:as_dict did not return a list of numbers (it returned a dict",)),
    Case("step3 reward function returning numbers as strings", "step3",
         [*STEP3, "--reward_fn", "{tmp}/rewards.py:strings"],
         ("--reward_fn {tmp}/rewards.py:strings did not return a list of numbers (answer 0's value is a str",)),
    Case("step3 reward function that never returns", "step3", [*STEP3, "--reward_fn", "{tmp}/rewards.py:hangs"],
         ("the reward function --reward_fn {tmp}/rewards.py:hangs did not return within 1 s",
          "CHATRLHF_REWARD_FN_TIMEOUT"), env={"CHATRLHF_REWARD_FN_TIMEOUT": "1"}),
    Case("step3 reward function returning an endless generator", "step3",
         [*STEP3, "--reward_fn", "{tmp}/rewards.py:endless"],
         ("the reward function --reward_fn {tmp}/rewards.py:endless did not return within 1 s",),
         env={"CHATRLHF_REWARD_FN_TIMEOUT": "1"}),
    Case("step3 reward value whose __float__ exits", "step3",
         [*STEP3, "--reward_fn", "{tmp}/rewards.py:exiting_value"],
         ("the reward function --reward_fn {tmp}/rewards.py:exiting_value", "SystemExit")),
    Case("step3 a malformed CHATRLHF_REWARD_FN_TIMEOUT", "step3", [*STEP3, "--reward_fn", "builtin"],
         ("CHATRLHF_REWARD_FN_TIMEOUT must be a positive number of seconds, at most 1000000, not 'soon'",),
         env={"CHATRLHF_REWARD_FN_TIMEOUT": "soon"}),
    Case("step3 a real Ctrl-C while the reward function runs", "step3",
         [*STEP3, "--reward_fn", "{tmp}/rewards.py:ctrl_c"], ("interrupted: SIGINT",), exit_code=130),
    # ---- sample_pairs.py: its output folder claimed as every step's is
    Case("sample_pairs --output_dir is --data_path", "sample_pairs",
         [*SAMPLE_PAIRS, "--reward_fn", "{tmp}/rewards.py:varied", "--output_dir", "{tmp}/good"],
         ("--output_dir {tmp}/good would write", "--data_path {tmp}/good")),
    Case("sample_pairs --output_dir holding the --data_path file", "sample_pairs",
         [*SAMPLE_PAIRS[:2], "--data_path", "{tmp}/mine/train.jsonl", *SAMPLE_PAIRS[4:], "--reward_fn",
          "{tmp}/rewards.py:varied", "--output_dir", "{tmp}/mine"],
         ("--output_dir {tmp}/mine would write", "--data_path")),
    Case("sample_pairs --output_dir holding someone else's train.jsonl", "sample_pairs",
         [*SAMPLE_PAIRS, "--reward_fn", "{tmp}/rewards.py:varied", "--output_dir", "{tmp}/mine"],
         ("--output_dir {tmp}/mine holds train.jsonl", "not written by sample_pairs")),
    Case("sample_pairs --output_dir is the model folder", "sample_pairs",
         [*SAMPLE_PAIRS, "--reward_fn", "{tmp}/rewards.py:varied", "--output_dir", "{actor}"],
         ("--output_dir {actor} would write", "--model_name_or_path")),
    Case("sample_pairs --output_dir in use by a running step", "sample_pairs",
         [*SAMPLE_PAIRS, "--reward_fn", "{tmp}/rewards.py:varied", "--output_dir", "{out}"],
         ("--output_dir {out} is in use by another run (PID {pid}",), setup="lock out"),
    Case("sample_pairs --output_dir not writable", "sample_pairs",
         [*SAMPLE_PAIRS, "--reward_fn", "{tmp}/rewards.py:varied", "--output_dir", "/proc/chatrlhf-pairs"],
         ("--output_dir /proc/chatrlhf-pairs: cannot write there",)),
    Case("sample_pairs judge calling sys.exit(0)", "sample_pairs",
         [*SAMPLE_PAIRS, "--reward_fn", "{tmp}/rewards.py:exits", "--output_dir", "{out}"],
         ("the reward function --reward_fn {tmp}/rewards.py:exits", "SystemExit")),
    Case("sample_pairs judge that never returns", "sample_pairs",
         [*SAMPLE_PAIRS, "--reward_fn", "{tmp}/rewards.py:hangs", "--output_dir", "{out}"],
         ("the reward function --reward_fn {tmp}/rewards.py:hangs did not return within 1 s",),
         env={"CHATRLHF_REWARD_FN_TIMEOUT": "1"}),
    Case("sample_pairs judge returning a string of digits", "sample_pairs",
         [*SAMPLE_PAIRS, "--reward_fn", "{tmp}/rewards.py:digits", "--output_dir", "{out}"],
         ("did not return a list of numbers (it returned a str",)),
    Case("sample_pairs SIGTERM during start-up", "sample_pairs",
         [*SAMPLE_PAIRS, "--reward_fn", "{tmp}/rewards.py:varied", "--output_dir", "{out}"], ("interrupted: SIGTERM",),
         exit_code=143, signal_at=("inference.sample_pairs", "load_causal_lm", signal.SIGTERM)),
    Case("sample_pairs a full disk when the pairs are written", "sample_pairs",
         [*SAMPLE_PAIRS, "--reward_fn", "{tmp}/rewards.py:varied", "--output_dir", "{out}"],
         ("no space left on device",), setup="disk full for writes"),
    # ---- signals during a step's start-up: nothing to resume yet
    Case("step1 SIGTERM during start-up", "step1", [*STEP1, "--data_path", "{tmp}/good"], ("interrupted: SIGTERM",),
         exit_code=143, signal_at=("utils.trainer.loop", "load_tokenizer", signal.SIGTERM)),
    Case("step3 SIGHUP during start-up", "step3", [*STEP3, "--reward_fn", "builtin"], ("interrupted: SIGHUP",),
         exit_code=129, signal_at=("training.step3_rlhf_finetuning.main", "load_tokenizer", signal.SIGHUP)),
    # ---- a full disk when the model is saved
    Case("step1 a full disk at the final save", "step1", [*STEP1, "--data_path", "{tmp}/good"],
         ("could not save the trained model in {out}", "No space left on device", "it is kept in"),
         setup="disk full for weights", then="weights kept elsewhere"),
    # ---- --resume of a run folder moved, reached through a symlink, or with its data spelled otherwise
    Case("step1 --resume of a run folder that was moved", "step1",
         [*STEP1, "--data_path", "{tmp}/good", "--max_steps", "2", "--save_steps", "1", "--resume"],
         setup="checkpoint of a moved run", succeeds="resumed"),
    Case("step1 --resume through a symlink, data spelled relative", "step1",
         [*STEP1, "--output_dir", "{tmp}/link", "--data_path", "{relgood}", "--max_steps", "2", "--save_steps", "1",
          "--resume"], setup="checkpoint behind a symlink", succeeds="resumed"),
    # ---- chat.py
    Case("chat --prompt with bytes that are not UTF-8 (a lone surrogate)", "chat",
         ["--path", "{actor}", "--prompt", "caf\udce9?", "--max_new_tokens", "2"],
         ("--prompt is not valid Unicode text",)),
    Case("chat standard input in UTF-16 with a byte-order mark", "chat", ["--path", "{actor}", "--max_new_tokens", "2"],
         ("standard input: UTF-16 text", "save it as UTF-8"), stdin="utf16"),
    Case("chat standard input with a UTF-8 byte-order mark, CRLF and a NUL", "chat",
         ["--path", "{actor}", "--max_new_tokens", "2", "--greedy"], stdin="bom_crlf_nul", succeeds="two answers"),
    Case("chat standard input with a 1 GiB line", "chat", ["--path", "{actor}", "--max_new_tokens", "2"],
         ("standard input: line 1 is longer than 64 MiB",), stdin="huge"),
    Case("chat --max_new_tokens 0", "chat", ["--path", "{actor}", "--prompt", "hi", "--max_new_tokens", "0"],
         ("--max_new_tokens must be at least 1",)),
    Case("chat --tool_timeout past what a timer holds (was: an OverflowError at the first tool call)", "chat",
         ["--path", "{actor}", "--prompt", "hi", "--tools", "python", "--tool_timeout", "1e12"],
         ("--tool_timeout must be a positive number of seconds, at most 1000000, not 1000000000000.0",)),
    Case("chat --temperature nan", "chat", ["--path", "{actor}", "--prompt", "hi", "--temperature", "nan"],
         ("--temperature must be positive, not nan",)),
    Case("chat SIGHUP while loading the model", "chat", ["--path", "{actor}", "--prompt", "hi"],
         ("interrupted: SIGHUP",), exit_code=129, signal_at=("inference.chatbot", "load_causal_lm", signal.SIGHUP)),
    Case("chat under nohup: a SIGHUP ignored, the answer still comes", "chat",
         ["--path", "{actor}", "--prompt", "hi", "--max_new_tokens", "2"], nohup=True, succeeds="one answer",
         signal_at=("inference.chatbot", "load_causal_lm", signal.SIGHUP)),
    Case("chat standard output closed under it (a broken pipe)", "chat",
         ["--path", "{actor}", "--prompt", "hi", "--max_new_tokens", "2"],
         ("interrupted: SIGPIPE (standard output was closed)",), exit_code=141, stdout="closed"),
    # ---- prompt_eval.py
    Case("prompt_eval --output_json is the --prompts_file", "prompt_eval",
         [*PROMPT_EVAL, "--prompts_file", "{tmp}/prompts.jsonl", "--output_json", "{tmp}/prompts.jsonl"],
         ("--output_json {tmp}/prompts.jsonl would overwrite --prompts_file",)),
    Case("prompt_eval --output_json inside a model folder it reads (was: rc 0, model.safetensors replaced)",
         "prompt_eval", [*PROMPT_EVAL, "--output_json", "{actor}/results.json"],
         ("--output_json {actor}/results.json is inside --model_name_or_path_baseline {actor}, which the run reads",)),
    Case("prompt_eval --prompts_file in UTF-16", "prompt_eval",
         [*PROMPT_EVAL, "--prompts_file", "{tmp}/prompts_utf16.txt"], ("{tmp}/prompts_utf16.txt", "UTF-16 text")),
    Case("prompt_eval --prompts_file with a lone surrogate", "prompt_eval",
         [*PROMPT_EVAL, "--prompts_file", "{tmp}/prompts_surrogate.jsonl"],
         ("{tmp}/prompts_surrogate.jsonl line 2: field 'prompt' is not valid Unicode text",)),
    Case("prompt_eval --prompts_file nested past the parser's depth (was: a RecursionError traceback)",
         "prompt_eval", [*PROMPT_EVAL, "--prompts_file", "{tmp}/prompts_deep.jsonl"],
         ("{tmp}/prompts_deep.jsonl line 1: JSON nested too deeply to read",)),
    Case("prompt_eval --output_json a link to itself (was: a RuntimeError traceback)", "prompt_eval",
         [*PROMPT_EVAL, "--output_json", "{tmp}/loop_out"], ("--output_json {tmp}/loop_out: a link that loops",)),
    Case("prompt_eval --reward_fn calling sys.exit(0)", "prompt_eval",
         [*PROMPT_EVAL, "--reward_fn", "{tmp}/rewards.py:exits"],
         ("the reward function --reward_fn {tmp}/rewards.py:exits", "SystemExit")),
    # ---- rw_eval.py
    Case("rw_eval --output_json is the --pairs_file", "rw_eval",
         ["--model_name_or_path", "{critic}", "--pairs_file", "{tmp}/good/train.json", "--output_json",
          "{tmp}/good/train.json"], ("--output_json {tmp}/good/train.json would overwrite --pairs_file",)),
    Case("rw_eval --output_json inside the model folder it reads (was: rc 0, config.json replaced)", "rw_eval",
         ["--model_name_or_path", "{critic}", "--output_json", "{critic}/scores.json"],
         ("--output_json {critic}/scores.json is inside --model_name_or_path {critic}, which the run reads",)),
    Case("rw_eval --pairs_file in UTF-16", "rw_eval", ["--model_name_or_path", "{critic}", "--pairs_file",
                                                       "{tmp}/utf16.jsonl"], ("{tmp}/utf16.jsonl: UTF-16 text",)),
    Case("rw_eval --pairs_file with a lone surrogate", "rw_eval",
         ["--model_name_or_path", "{critic}", "--pairs_file", "{tmp}/surrogate.jsonl"],
         ("{tmp}/surrogate.jsonl: row 1 (line 2): field 'chosen' is not valid Unicode text",)),
    # ---- python -m bench: flags and its output file refused before minutes of measuring
    Case("bench --repeats 0", "bench", [*BENCH, "--repeats", "0", "--output", "{out}/b.json"],
         ("--repeats must be at least 1, not 0",)),
    Case("bench --threads 0", "bench", [*BENCH, "--threads", "0", "--output", "{out}/b.json"],
         ("--threads must be at least 1, not 0",)),
    Case("bench --warmup -1", "bench", [*BENCH, "--warmup", "-1", "--output", "{out}/b.json"],
         ("--warmup must be at least 0, not -1",)),
    Case("bench --output an existing folder", "bench", [*BENCH, "--output", "{tmp}/good"],
         ("--output {tmp}/good is a folder",)),
    Case("bench --output where nothing can be written", "bench", [*BENCH, "--output", "/proc/chatrlhf/b.json"],
         ("--output /proc/chatrlhf/b.json",)),
    Case("bench SIGHUP while measuring", "bench", [*BENCH, "--output", "{out}/b.json"], ("interrupted: SIGHUP",),
         exit_code=129, signal_at=("bench.run", "measure_peaks", signal.SIGHUP)),
]


def write_hostile_data(tmp):
    rows = [GOOD_ROW] * 8
    lines = [json.dumps(row) for row in rows]
    for split in ("train", "eval"):
        write_jsonl(tmp / "good" / f"{split}.json", rows)
        (tmp / "bom_crlf").mkdir(exist_ok=True)
        (tmp / "bom_crlf" / f"{split}.json").write_bytes(("\ufeff" + "\r\n".join(lines) + "\r\n").encode("utf-8"))
    (tmp / "utf16.jsonl").write_bytes("\n".join(lines).encode("utf-16"))  # a BOM, then little-endian
    deep = json.dumps(dict(GOOD_ROW, extra="DEEP")).replace('"DEEP"', "[" * 100000 + "]" * 100000)
    (tmp / "deep.jsonl").write_text("\n".join(lines + [deep]) + "\n")
    (tmp / "deep.json").write_text("[" + ", ".join(lines + [deep]) + "]")
    for name in ("dir_split", "loop_split"):
        write_jsonl(tmp / name / "eval.json", rows)
    (tmp / "dir_split" / "train.json").mkdir()
    (tmp / "loop_split" / "train.json").symlink_to("train.json")
    (tmp / "loop_path").symlink_to("loop_path")
    (tmp / "quote.csv").write_text('prompt,chosen,rejected\n" Human: x Assistant:"," 3"," 4"\n'
                                   '" Human: oops Assistant:, 3, 4\n' + '" Human: x Assistant:"," 3"," 4"\n' * 8)
    (tmp / "twice.csv").write_text("prompt,chosen,chosen,rejected\n" + '" Human: x Assistant:"," 3"," 5"," 4"\n' * 8)
    nul = json.dumps(dict(GOOD_ROW, prompt=" Human: What is 1\x00+ 2? Assistant:"))  # as the escape \u0000
    (tmp / "nul_raw.jsonl").write_text(lines[0] + "\n" + nul.replace("\\u0000", "\x00") + "\n")
    for split in ("train", "eval"):
        (tmp / "nul_escaped").mkdir(exist_ok=True)
        (tmp / "nul_escaped" / f"{split}.json").write_text("\n".join([lines[0], nul] * 4) + "\n")
    surrogate = json.dumps(GOOD_ROW).replace('" 3"', '" 3\\ud800"')
    (tmp / "surrogate.jsonl").write_text("\n".join([lines[0], surrogate] + lines[:6]) + "\n")
    messages = {"prompt": [{"role": "user", "content": "x"}], "chosen": [{"role": "assistant", "content": "y"}],
                "rejected": [{"role": "assistant", "content": "z\\udfff"}]}
    (tmp / "surrogate_messages.jsonl").write_text(
        "\n".join(lines[:2] + [json.dumps(messages).replace("\\\\udfff", "\\udfff")] + lines[:5]) + "\n")
    with open(tmp / "huge_line.jsonl", "wb") as f:  # sparse: 1 GiB of NULs that take no disk
        f.write((lines[0] + "\n").encode() + b'{"prompt": "')
        f.seek(HUGE, os.SEEK_CUR)
        f.write(b'"}\n')
    os.mkfifo(tmp / "fifo.jsonl")
    (tmp / "rewards.py").write_text(REWARD_FNS)
    (tmp / "exit_at_import.py").write_text(EXIT_AT_IMPORT)
    write_jsonl(tmp / "mine" / "train.jsonl", rows)
    write_jsonl(tmp / "mine" / "eval.jsonl", rows)
    prompts = [{"prompt": " Human: What is 1 + 2? Assistant:"}] * 2
    write_jsonl(tmp / "prompts.jsonl", prompts)
    (tmp / "prompts_utf16.txt").write_bytes(" Human: What is 1 + 2? Assistant:\n".encode("utf-16"))
    big = json.dumps(GOOD_ROW)[:-1] + ', "id": ' + "1" * 5000 + "}"  # past Python's 4,300-digit int conversion
    (tmp / "bigint.jsonl").write_text("\n".join(lines[:5] + [big] + lines[:3]) + "\n")
    (tmp / "bigint.json").write_text("[" + ", ".join(lines[:5] + [big]) + "]")
    arena = {"prompt": '["q"]', "response_a": "[" * 100000 + "]" * 100000, "response_b": '["b"]',
             "winner_model_a": 1, "winner_model_b": 0, "winner_tie": 0}
    (tmp / "arena_deep.jsonl").write_text("\n".join([lines[0], json.dumps(arena)] + lines[:6]) + "\n")
    kto = {"prompt": GOOD_ROW["prompt"], "completion": " 3", "label": [True]}
    (tmp / "kto_list_label.jsonl").write_text("\n".join(lines[:2] + [json.dumps(kto)] + lines[:5]) + "\n")
    chat = {"conversations": [{"from": ["human"], "value": "hi"}, {"from": "gpt", "value": "3"}]}
    (tmp / "sharegpt_list_speaker.jsonl").write_text("\n".join([json.dumps(chat)] * 8) + "\n")
    (tmp / "prompts_deep.jsonl").write_text('{"prompt": "x", "extra": ' + "[" * 100000 + "]" * 100000 + "}\n")
    (tmp / "unsup_deep.jsonl").write_text('{"text": "x", "extra": ' + "[" * 100000 + "]" * 100000 + "}\n")
    (tmp / "userdir").mkdir()  # someone's folder: a save there would replace three of these
    for name, text in (("README.md", "my notes"), ("config.json", '{"my": "app config"}'),
                       ("vocab_list.txt", "words"), ("notes.txt", "kept either way")):
        (tmp / "userdir" / name).write_text(text)
    (tmp / "loop_out").symlink_to("loop_out")
    (tmp / "prompts_surrogate.jsonl").write_text(json.dumps(prompts[0]) + "\n"
                                                 + json.dumps(prompts[0]).replace("1 + 2", "\\udc80") + "\n")


# ---- what a case prepares --------------------------------------------------------------------------------------


def hold_lock(tmp, out, monkeypatch, actor):
    from utils.runtime.paths import FolderLock

    lock = FolderLock(out)
    assert lock.acquire()
    return lock.release


def disk_full_for_writes(tmp, out, monkeypatch, actor):
    """Every file opened for writing in the case's folder (but the split cache) fails as on a full disk."""
    import builtins
    import errno

    real_open = builtins.open

    def full_open(file, mode="r", *args, **kwargs):
        path = os.path.abspath(str(file))
        if any(flag in mode for flag in "wax") and path.startswith(str(tmp)) and "/cache/" not in path:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", full_open)


def disk_full_for_weights(tmp, out, monkeypatch, actor):
    """safetensors' writer fails as on a full disk (as it fails there: a SafetensorError) but in the temporary
    directory, tmp/elsewhere (another file system)."""
    import safetensors.torch
    from safetensors import SafetensorError

    real_save_file = safetensors.torch.save_file

    def full_save_file(tensors, filename, *args, **kwargs):
        if not os.path.abspath(str(filename)).startswith(str(tmp / "elsewhere")):
            raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "
                                  "\"No space left on device\" })")
        return real_save_file(tensors, filename, *args, **kwargs)

    monkeypatch.setattr(safetensors.torch, "save_file", full_save_file)
    monkeypatch.setattr("transformers.modeling_utils.safe_save_file", full_save_file)
    monkeypatch.setenv("TMPDIR", str(tmp / "elsewhere"))
    (tmp / "elsewhere").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # TMPDIR read again


def step1_checkpoint(tmp, out, actor):
    """A step-1 run of --max_steps 2 that saved a checkpoint at each step, in `out`."""
    from training.step1_supervised_finetuning import main as step1

    argv = fill_all([*STEP1, "--data_path", "{tmp}/good", "--max_steps", "2", "--save_steps", "1"], tmp, out,
                    {"{actor}": actor})
    assert step1.main(argv) is None


def checkpoint_of_a_moved_run(tmp, out, monkeypatch, actor):
    step1_checkpoint(tmp, tmp / "before", actor)
    shutil.move(str(tmp / "before"), str(out))


def checkpoint_behind_a_symlink(tmp, out, monkeypatch, actor):
    step1_checkpoint(tmp, out, actor)
    (tmp / "link").symlink_to(out)
    monkeypatch.chdir(tmp)


def someones_files_in_out(tmp, out, monkeypatch, actor):
    shutil.copytree(tmp / "userdir", out)


def model_folder(change):
    """A setup: a copy of the actor in {tmp}/model, changed by `change(folder)`."""
    def setup(tmp, out, monkeypatch, actor):
        shutil.copytree(actor, tmp / "model")
        change(tmp / "model")
    return setup


def pickled_weights(folder):
    """The weights as PyTorch's pickle (pytorch_model.bin) alone: written by torch.save, as old hub models are."""
    import torch
    from safetensors.torch import load_file

    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()


def nan_weights(folder):
    from safetensors.torch import load_file, save_file

    weights = load_file(folder / "model.safetensors")
    next(iter(weights.values()))[0] = float("nan")
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})


def config_entry(key, value, file="config.json"):
    def change(folder):
        config = json.loads((folder / file).read_text())
        (folder / file).write_text(json.dumps({**config, key: value}))
    return change


def deep_config(folder):
    text = (folder / "config.json").read_text().rstrip()[:-1]
    (folder / "config.json").write_text(text + ', "deep": ' + "[" * 100000 + "]" * 100000 + "}")


SETUPS = {"lock out": hold_lock, "disk full for writes": disk_full_for_writes,
          "disk full for weights": disk_full_for_weights, "checkpoint of a moved run": checkpoint_of_a_moved_run,
          "checkpoint behind a symlink": checkpoint_behind_a_symlink,
          "someone's files in out": someones_files_in_out,
          "pickled weights": model_folder(pickled_weights), "NaN weights": model_folder(nan_weights),
          "deep config": model_folder(deep_config),
          "answer length -5": model_folder(lambda folder: (folder / "training_settings.json").write_text(
              json.dumps({"max_answer_seq_len": -5}))),
          "context a word": model_folder(config_entry("model_max_length", "many", "tokenizer_config.json")),
          "reward entry true": model_folder(config_entry("chatrlhf_reward_model", True)),
          "reward head a number": model_folder(config_entry("chatrlhf_reward_model", {"value_head": 5}))}


class HugeLine(io.RawIOBase):
    """A stream of one line of `size` bytes, made as it is read."""

    def __init__(self, size):
        self.left, self.ended = size, False

    def readable(self):
        return True

    def readinto(self, buffer):
        if self.left:
            count = min(len(buffer), self.left)
            buffer[:count] = b"x" * count
            self.left -= count
            return count
        if not self.ended:
            self.ended = True
            buffer[:1] = b"\n"
            return 1
        return 0


STDIN = {
    "utf16": lambda: io.BytesIO(" Human: hi Assistant:\n".encode("utf-16")),
    "bom_crlf_nul": lambda: io.BytesIO("\ufeffHello\r\nwhat is 1\x00+ 2?\r\n".encode("utf-8")),
    "huge": lambda: io.BufferedReader(HugeLine(HUGE)),
}


# ---- what a successful run must have left ----------------------------------------------------------------------


def model_saved(out, stdout, stderr):
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()


def model_saved_beside_notes(out, stdout, stderr):
    model_saved(out, stdout, stderr)
    assert (out / "notes.txt").read_text() == "kept either way"  # a file no save replaces stays


def resumed(out, stdout, stderr):
    assert "resumed from" in stdout, stdout
    model_saved(out, stdout, stderr)


def two_answers(out, stdout, stderr):
    assert len(stdout.splitlines()) == 2, stdout


def one_answer(out, stdout, stderr):
    assert len(stdout.splitlines()) == 1, stdout


def weights_kept_elsewhere(out, stdout, stderr):
    kept = Path(stderr.split("it is kept in ", 1)[1].split(" instead", 1)[0])
    assert (kept / "model.safetensors").is_file() and (kept / "config.json").is_file(), kept


CHECKS = {"model saved": model_saved, "model saved beside notes": model_saved_beside_notes, "resumed": resumed, "two answers": two_answers, "one answer": one_answer,
          "weights kept elsewhere": weights_kept_elsewhere}


class ClosedPipe(io.TextIOBase):
    """Standard output whose reader has gone: every write and flush fails as on a broken pipe."""

    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        raise BrokenPipeError(32, "Broken pipe")


# ---- running a case --------------------------------------------------------------------------------------------


def fill_all(argv, tmp, out, extra=None):
    return [fill(arg, tmp, out, extra) for arg in argv]


def fill(text, tmp, out, extra=None):
    places = {"{tmp}": tmp, "{out}": out, "{relgood}": "good", "{pid}": os.getpid(), **(extra or {})}
    for place, value in places.items():
        text = text.replace(place, str(value))
    return text


def snapshot(root):
    """{path: sha256 of its bytes (a folder: None)} of everything under `root`, a sparse file by its size."""
    state = {}
    for path in sorted(root.rglob("*")):
        relative = str(path.relative_to(root))
        if (relative.split(os.sep)[0] in ("cache", "elsewhere") or path.name.endswith(".lock") or path.is_fifo()
                or path.is_symlink()):
            continue
        if path.is_file():
            state[relative] = (hashlib.sha256(path.read_bytes()).hexdigest() if path.stat().st_size < 1 << 24
                               else path.stat().st_size)
        else:
            state[relative] = None
    return state


class SignalNotHandled(BaseException):
    pass


def _not_handled(signum, frame):
    raise SignalNotHandled(signal.Signals(signum).name)


def run_main(main, argv, capsys, nohup=False):
    """(exit code, stdout, stderr) of `main(argv)` in this process; an exception other than SystemExit escaping
    main (no cli_entry turned it into a line) is reported as a traceback would be. `nohup`: SIGHUP ignored."""
    environment = dict(os.environ)
    # SIGHUP's default would end the test session
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN if nohup else _not_handled)
    try:
        try:
            result = main(argv)
            code = result or 0
        except SystemExit as exit_info:
            code = exit_info.code
        except BaseException as err:  # noqa: B036 (the test reports what escaped)
            code = "escaped"
            print(f"Traceback (most recent call last):\n{type(err).__name__}: {err}", file=sys.stderr)
    finally:
        signal.signal(signal.SIGHUP, previous)
        os.environ.clear()
        os.environ.update(environment)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def bench_main():
    from bench.run import main

    return main


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_hostile_input(case, tmp_path, step3_model_dirs, capsys, monkeypatch):
    actor, critic = step3_model_dirs
    write_hostile_data(tmp_path)
    out = tmp_path / "out"
    for name, value in case.env.items():
        monkeypatch.setenv(name, value)
    cleanup = SETUPS[case.setup](tmp_path, out, monkeypatch, actor) if case.setup else None
    capsys.readouterr()
    if case.stdin:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(STDIN[case.stdin](), encoding="utf-8"))
    if case.stdout:
        monkeypatch.setattr(sys, "stdout", ClosedPipe())
    if case.signal_at:
        module, attribute, signum = case.signal_at
        real = getattr(__import__(module, fromlist=[attribute]), attribute)

        def signalled(*args, **kwargs):
            os.kill(os.getpid(), signum)
            time.sleep(0.1)  # the handler runs at the next bytecode
            return real(*args, **kwargs)

        monkeypatch.setattr(f"{module}.{attribute}", signalled)
    before = snapshot(tmp_path)
    extra = {"{actor}": actor, "{critic}": critic}
    argv = fill_all(case.argv, tmp_path, out, extra)
    main = bench_main() if case.cli == "bench" else in_process_mains()[case.cli]
    try:
        code, stdout, stderr = run_main(main, argv, capsys, nohup=case.nohup)
    finally:
        if cleanup:
            cleanup()
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.startswith(("error:", "interrupted:"))]
    if case.succeeds:
        assert code == 0 and not lines, f"exit {code}; stderr: {stderr[-3000:]}"
        CHECKS[case.succeeds](out, stdout, stderr)
        return
    assert code == case.exit_code, f"exit {code}; stderr: {stderr[-3000:]}"
    assert len(lines) == 1, stderr[-3000:]
    for message in case.message:
        assert fill(message, tmp_path, out, extra) in lines[0], lines[0]
    if case.then:
        CHECKS[case.then](out, stdout, stderr)
    assert "resume with --resume" not in lines[0]  # nothing to resume in any of these cases
    after = snapshot(tmp_path)
    lost = {path: digest for path, digest in before.items() if after.get(path, "missing") != digest}
    assert not lost, f"changed or lost: {sorted(lost)}"
    assert not (set(after) - set(before)) - {"out"}, f"left behind: {sorted(set(after) - set(before))}"


@pytest.fixture()
def small_disk(tmp_path):
    """A 1 MiB tmpfs (root may mount one; skipped where mounting is not allowed), unmounted at the end: room for
    no checkpoint and no model of the step-3 test actor (~1.5 MB)."""
    folder = tmp_path / "disk"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode(errors='replace').strip()}")
    yield folder
    subprocess.run(["umount", str(folder)], check=True)


def test_a_step_on_a_disk_that_fills_up_ends_in_one_line_and_loses_nothing(tmp_path, small_disk, step3_model_dirs,
                                                                          capsys, monkeypatch):
    """A real full disk under step 1: its checkpoint (torch.save's `unexpected pos`), then its final save
    (safetensors' `No space left on device`). Before: a traceback each, and the trained model lost."""
    actor, _ = step3_model_dirs
    write_hostile_data(tmp_path)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "elsewhere"))
    (tmp_path / "elsewhere").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    main = in_process_mains()["step1"]
    out = small_disk / "out"
    # fp32, not --dtype auto (bf16 on a CPU with native bf16): the small disk is sized for fp32 weights
    argv = fill_all([*STEP1, "--data_path", "{tmp}/good", "--dtype", "fp32"], tmp_path, out, {"{actor}": actor})
    code, stdout, stderr = run_main(main, [*argv, "--save_steps", "1"], capsys)
    lines = [line for line in stderr.splitlines() if line.startswith(("error:", "interrupted:"))]
    assert code == 2 and len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    assert lines[0].startswith(f"error: could not write the checkpoint {out}/checkpoints/step1 (")
    assert lines[0].endswith("there is no earlier checkpoint: free some space and run again")
    assert sorted(path.name for path in small_disk.iterdir()) == []  # nothing half-written left, the lock released

    code, stdout, stderr = run_main(main, argv, capsys)  # no checkpoints: the final save fills the disk
    lines = [line for line in stderr.splitlines() if line.startswith(("error:", "interrupted:"))]
    assert code == 2 and len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    assert lines[0].startswith(f"error: could not save the trained model in {out} (")
    assert "No space left on device" in lines[0]
    kept = next((tmp_path / "elsewhere").iterdir())
    assert f"it is kept in {kept} instead" in lines[0]
    assert (kept / "model.safetensors").is_file() and (kept / "config.json").is_file()


# ---- real processes: a running step and the tools around it ----------------------------------------------------

STEP1_SCRIPT = REPO / "training" / "step1_supervised_finetuning" / "main.py"
LONG_STEP1 = ["--data_split", "10,1000,1000", "--per_device_train_batch_size", "4", "--max_seq_len", "64",
              "--num_train_epochs", "3", "--max_steps", "60", "--print_interval", "1", "--save_steps", "5"]


def wait_for(stream, text, seen):
    for line in stream:
        seen.append(line)
        if text in line:
            return line
    raise AssertionError(f"{text!r} never came:\n" + "".join(seen[-40:]))


def refusal(main, argv, capsys):
    code, stdout, stderr = run_main(main, argv, capsys)
    lines = [line for line in stderr.splitlines() if line.startswith(("error:", "interrupted:"))]
    assert code == 2 and len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return lines[0]


def test_a_hand_run_step_keeps_its_folder_from_every_other_tool_and_ends_on_sighup(tmp_path, step3_model_dirs,
                                                                                  capsys):
    """A step run by hand holds its output folder: another step, sample_pairs.py (before: it took no lock) and
    a step-3 run naming it are refused, naming the step's PID. A closed terminal (SIGHUP) then ends the step as
    SIGTERM does (before: the signal's default, no line, no clean-up), and the folder resumes."""
    actor, _ = step3_model_dirs
    write_hostile_data(tmp_path)
    out = tmp_path / "out"
    process = subprocess.Popen([sys.executable, str(STEP1_SCRIPT), *LONG_STEP1, "--data_output_path",
                                str(tmp_path / "data"), "--output_dir", str(out)], cwd=REPO, env=subprocess_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(process.stdout, "saved checkpoint", [])
        in_use = f"--output_dir {out} is in use by another run (PID {process.pid},"
        mains = in_process_mains()
        extra = {"{actor}": actor}
        assert in_use in refusal(mains["step1"], fill_all([*STEP1, "--data_path", "{tmp}/good", "--output_dir",
                                                            str(out), "--resume"], tmp_path, out, extra), capsys)
        assert in_use in refusal(mains["sample_pairs"], fill_all(
            [*SAMPLE_PAIRS, "--reward_fn", "{tmp}/rewards.py:varied", "--output_dir", str(out)], tmp_path, out,
            extra), capsys)
        assert in_use in refusal(mains["step3"], fill_all([*STEP3, "--reward_fn", "builtin"], tmp_path, out, extra),
                                 capsys)
        process.send_signal(signal.SIGHUP)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 129, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.startswith(("interrupted:", "error:"))]
    assert lines == ["interrupted: SIGHUP; resume with --resume"] and "Traceback" not in stderr, stderr[-3000:]
    root = out / "checkpoints"
    assert (root / (root / "latest").read_text().strip() / "COMPLETE").is_file()
    assert not (out.parent / f".{out.name}.lock").exists() and not (out / "model.safetensors").exists()


@pytest.mark.e2e
def test_a_driver_and_a_hand_run_step_on_one_folder_and_sighup_to_the_driver(tmp_path, step3_model_dirs, capsys):
    """train.py runs step 1 into <out>/actor-models/tiny; a step and sample_pairs.py run by hand on that folder
    are refused, naming the step train.py launched. A SIGHUP to train.py (its terminal closed) reaches the step
    (before: train.py died with 129 and no line while its step trained on), and both end in one line."""
    actor, _ = step3_model_dirs
    write_hostile_data(tmp_path)
    out = tmp_path / "out"
    step_dir = out / "actor-models" / "tiny"
    flags = " ".join([*LONG_STEP1, "--data_output_path", str(tmp_path / "data")])
    driver = subprocess.Popen([sys.executable, "train.py", "--step", "1", "--no-eval", "--output-dir", str(out),
                               "--step1-args", flags], cwd=REPO, env=subprocess_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300
        log = step_dir / "training.log"
        while not (log.is_file() and "saved checkpoint" in log.read_text()):
            assert driver.poll() is None and time.time() < deadline, driver.communicate()
            time.sleep(0.5)
        mains, extra = in_process_mains(), {"{actor}": actor}
        line = refusal(mains["step1"], fill_all([*STEP1, "--data_path", "{tmp}/good", "--resume"], tmp_path, step_dir,
                                                extra), capsys)
        assert f"--output_dir {step_dir} is in use by another run (PID " in line
        line = refusal(mains["sample_pairs"], fill_all([*SAMPLE_PAIRS, "--reward_fn", "{tmp}/rewards.py:varied",
                                                        "--output_dir", str(step_dir)], tmp_path, out, extra), capsys)
        assert f"--output_dir {step_dir} is in use by another run (PID " in line
        driver.send_signal(signal.SIGHUP)
        stdout, stderr = driver.communicate(timeout=180)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert driver.returncode == 129, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.startswith(("interrupted:", "error:"))]
    assert len(lines) == 1 and lines[0].startswith("interrupted: SIGHUP"), stderr[-3000:]
    assert "interrupted: SIGHUP; resume with --resume" in (step_dir / "training.log").read_text()
    assert not (step_dir / "model.safetensors").exists()
    assert not (step_dir.parent / f".{step_dir.name}.lock").exists()
