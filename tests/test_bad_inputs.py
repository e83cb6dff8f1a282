"""Bad input across the CLIs, one table: every case must end in a non-zero exit, exactly one `error: ...` line on
stderr naming the problem (the file, field or flag), no traceback, and no output left behind (the output folder
absent, or as it was).

The step mains, chat.py, prompt_eval.py and rw_eval.py are called in this process (`main(argv)`, as their
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
"""
EVAL_OUT = ["--output_json", "{out}/result.json"]

CASES = [
    # step 1: data
    Case("step1 data path that does not exist", "step1", [*STEP1, "--data_path", "{tmp}/nowhere"],
         ("unknown data set '{tmp}/nowhere'",)),
    Case("step1 malformed JSON line", "step1", [*STEP1, "--data_path", "{tmp}/malformed"],
         ("{tmp}/malformed/train.json: malformed JSON on line 2",)),
    Case("step1 row missing a field", "step1", [*STEP1, "--data_path", "{tmp}/nofield"],
         ("{tmp}/nofield/train.json: row 1 (line 2): missing field 'chosen'",)),
    Case("step1 data file without rows", "step1", [*STEP1, "--data_path", "{tmp}/empty.jsonl"],
         ("{tmp}/empty.jsonl: no rows",)),
    Case("step1 --data_split of two parts", "step1", [*STEP1, "--data_split", "2,4"], ("--data_split '2,4'",)),
    Case("step1 --data_split leaving step 1 nothing", "step1",
         [*STEP1, "--data_path", "{tmp}/good", "--data_split", "0,1,1"],
         ("no train data left for phase 1", "--data_split 0,1,1")),
    Case("step1 every prompt fills --max_seq_len", "step1",
         [*STEP1, "--data_path", "{tmp}/good", "--max_seq_len", "4"], ("no train data left for phase 1",)),
    # step 1: model
    Case("step1 model path that does not exist", "step1", [*STEP1, "--model_name_or_path", "./no/such/model"],
         ("model path ./no/such/model does not exist",)),
    Case("step1 model folder without config.json", "step1", [*STEP1, "--model_name_or_path", "{tmp}/notamodel"],
         ("model folder {tmp}/notamodel has no config.json",)),
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
    # step 2
    Case("step2 empty field in a row", "step2", [*STEP2, "--data_path", "{tmp}/emptyfield.jsonl"],
         ("{tmp}/emptyfield.jsonl: row 3 (line 4): field 'chosen' is empty",)),
    Case("step2 every pair has identical answers", "step2", [*STEP2, "--data_path", "{tmp}/identical"],
         ("no train data left for phase 2",)),
    Case("step2 --only_optimize_lora without LoRA", "step2", [*STEP2, "--only_optimize_lora"],
         ("--only_optimize_lora needs --lora_dim > 0",)),
    # step 3: the step-1 / step-2 folders
    Case("step3 missing step-1 output", "step3",
         [*STEP3, "--actor_model_name_or_path", "{tmp}/output/actor-models/tiny", "--critic_model_name_or_path",
          "{critic}"], ("model path {tmp}/output/actor-models/tiny does not exist",)),
    Case("step3 reward model as the actor", "step3",
         [*STEP3, "--actor_model_name_or_path", "{critic}", "--critic_model_name_or_path", "{critic}"],
         ("--actor_model_name_or_path {critic} is a reward model (step 2 output)",)),
    Case("step3 actor as the critic", "step3",
         [*STEP3, "--actor_model_name_or_path", "{actor}", "--critic_model_name_or_path", "{actor}"],
         ("--critic_model_name_or_path {actor} is not a reward model folder",)),
    # step 3: data and flags
    Case("step3 every prompt longer than --max_prompt_seq_len", "step3",
         [*STEP3, *MODELS, "--data_path", "{tmp}/good", "--max_prompt_seq_len", "4"],
         ("no train data left for phase 3",)),
    Case("step3 generation batch not a multiple of the training batch", "step3",
         [*STEP3, *MODELS, "--per_device_generation_batch_size", "6", "--per_device_training_batch_size", "4"],
         ("--per_device_generation_batch_size (6) must be a multiple of --per_device_training_batch_size (4)",)),
    Case("step3 --inference_tp_size > 1 without ZeRO-3", "step3", [*STEP3, *MODELS, "--inference_tp_size", "2"],
         ("--inference_tp_size > 1 needs --actor_zero_stage 3",)),
    Case("step3 offload without ZeRO", "step3", [*STEP3, *MODELS, "--offload", "--actor_zero_stage", "2"],
         ("--offload needs --actor_zero_stage and --critic_zero_stage",)),
    Case("step3 --only_optimize_lora without LoRA", "step3", [*STEP3, *MODELS, "--only_optimize_lora"],
         ("--only_optimize_lora needs --actor_lora_dim or --critic_lora_dim",)),
    Case("step3 fp16 on a CPU", "step3", [*STEP3, *MODELS, "--dtype", "fp16"], ("--dtype fp16 is not supported",)),
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
    Case("step3 --reward_fn that cannot be imported", "step3",
         [*STEP3, *GRPO, "--reward_fn", "no_such_module_anywhere:score"],
         ("--reward_fn no_such_module_anywhere:score: cannot import no_such_module_anywhere",)),
    Case("step3 --reward_fn that raises", "step3", [*STEP3, *GRPO, "--reward_fn", "{tmp}/rewards.py:raises"],
         ("the reward function --reward_fn {tmp}/rewards.py:raises raised ZeroDivisionError: division by zero",)),
    Case("step3 --reward_fn of the wrong length", "step3", [*STEP3, *GRPO, "--reward_fn", "{tmp}/rewards.py:short"],
         ("the reward function --reward_fn {tmp}/rewards.py:short returned 7 values for 8 answers",)),
    Case("step3 --reward_fn not finite", "step3", [*STEP3, *GRPO, "--reward_fn", "{tmp}/rewards.py:not_finite"],
         ("the reward function --reward_fn {tmp}/rewards.py:not_finite returned nan for answer 0",)),
    Case("step3 --reward_fn builtin on another task's prompts", "step3",
         [*STEP3, *GRPO, "--reward_fn", "builtin", "--data_path", "{tmp}/good_other"],
         ("the reward function --reward_fn builtin raised ValueError",)),
    # chat.py
    Case("chat empty prompt", "chat", ["--path", "tiny", "--prompt", "  "], ("--prompt is empty",)),
    Case("chat prompt longer than the context", "chat", ["--path", "tiny", "--prompt", LONG_PROMPT],
         ("the prompt is too long", "context of 512 positions")),
    Case("chat reward model folder", "chat", ["--path", "{critic}", "--prompt", "hi"],
         ("{critic} is a reward model (step 2 output)",)),
    Case("chat model path that does not exist", "chat", ["--path", "/nonexistent/actor", "--prompt", "hi"],
         ("model path /nonexistent/actor does not exist",)),
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
    Case("prompt_eval --output_json in a missing folder", "prompt_eval",
         ["--model_name_or_path_baseline", "tiny", "--model_name_or_path_finetune", "tiny", "--num_prompts", "2",
          "--output_json", "{tmp}/nowhere/result.json"], ("--output_json {tmp}/nowhere/result.json",)),
    # rw_eval.py
    Case("rw_eval actor as the reward model", "rw_eval", ["--model_name_or_path", "{actor}", *EVAL_OUT],
         ("{actor} is not a reward model",)),
    Case("rw_eval malformed pairs file", "rw_eval",
         ["--model_name_or_path", "{critic}", "--pairs_file", "{tmp}/malformed/train.json", *EVAL_OUT],
         ("{tmp}/malformed/train.json: malformed JSON on line 2",)),
    Case("rw_eval no pair left to score", "rw_eval",
         ["--model_name_or_path", "{critic}", "--pairs_file", "{tmp}/identical/train.json", *EVAL_OUT],
         ("{tmp}/identical/train.json: no pair left to score",)),
    Case("rw_eval --output_json in a missing folder", "rw_eval",
         ["--model_name_or_path", "{critic}", "--output_json", "{tmp}/nowhere/result.json"],
         ("--output_json {tmp}/nowhere/result.json",)),
    # train.py and a step main, as real processes
    Case("train.py step 3 without step-1 output", "train.py", ["--step", "3", "--output-dir", "{out}"],
         ("--step 3 needs the step-1 actor {out}/actor-models/tiny, which does not exist",)),
    Case("train.py step 2 from the SFT weights without step-1 output", "train.py",
         ["--step", "2", "--output-dir", "{out}"],
         ("--step 2 (--reward-from-sft) needs the step-1 actor {out}/actor-models/tiny, which does not exist",)),
    Case("train.py multi_node without a hostfile", "train.py",
         ["--deployment-type", "multi_node", "--hostfile", "{tmp}/hostfile", "--output-dir", "{out}"],
         ("--hostfile {tmp}/hostfile does not exist",)),
    Case("train.py unknown step", "train.py", ["--step", "4", "--output-dir", "{out}"],
         ("argument --step: invalid choice: 4",)),
    Case("step1 main.py malformed data, as a process", "step1 process",
         [*STEP1, "--data_path", "{tmp}/malformed"], ("{tmp}/malformed/train.json: malformed JSON on line 2",)),
]


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_bad_data(tmp):
    """The data folders and files the cases name, under `tmp`."""
    for split in ("train", "eval"):
        write_jsonl(tmp / "good" / f"{split}.json", [GOOD_ROW] * 8)
        write_jsonl(tmp / "nofield" / f"{split}.json", [GOOD_ROW, {"prompt": " Human: x Assistant:", "rejected": " y"}])
        write_jsonl(tmp / "identical" / f"{split}.json", [dict(GOOD_ROW, rejected=GOOD_ROW["chosen"])] * 8)
        write_jsonl(tmp / "malformed" / f"{split}.json", [GOOD_ROW]).write_text(json.dumps(GOOD_ROW) + "\n{not json\n")
    write_jsonl(tmp / "emptyfield.jsonl", [GOOD_ROW] * 3 + [dict(GOOD_ROW, chosen="")] + [GOOD_ROW] * 2)
    (tmp / "empty.jsonl").write_text("\n\n")
    other_task = dict(GOOD_ROW, prompt=" Human: Tell a joke. Assistant:")
    for split in ("train", "eval"):
        write_jsonl(tmp / "good_other" / f"{split}.json", [other_task] * 8)
    (tmp / "rewards.py").write_text(REWARD_FNS)
    (tmp / "notamodel").mkdir()


def in_process_mains():
    from inference import chatbot
    from training.step1_supervised_finetuning import main as step1
    from training.step1_supervised_finetuning import prompt_eval
    from training.step2_reward_model_finetuning import main as step2
    from training.step2_reward_model_finetuning import rw_eval
    from training.step3_rlhf_finetuning import main as step3

    return {"step1": step1.main, "step2": step2.main, "step3": step3.main, "chat": chatbot.main,
            "prompt_eval": prompt_eval.main, "rw_eval": rw_eval.main}


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


def run_process(cli, argv):
    script = {"train.py": ROOT / "train.py", "step1 process": ROOT / "training/step1_supervised_finetuning/main.py"}
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    result = subprocess.run([sys.executable, str(script[cli]), *argv], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=300)
    return result.returncode, result.stdout, result.stderr


def folder_state(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else None


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_ends_in_one_error_line_and_leaves_no_output(case, tmp_path, step3_model_dirs, capsys):
    actor, critic = step3_model_dirs
    write_bad_data(tmp_path)
    out = tmp_path / "out"
    if case.cli in ("prompt_eval", "rw_eval"):
        out.mkdir()  # their output is a file in an existing folder
    before = folder_state(out)

    def fill(text):
        return (text.replace("{tmp}", str(tmp_path)).replace("{out}", str(out)).replace("{actor}", str(actor))
                .replace("{critic}", str(critic)))

    argv = [fill(arg) for arg in case.argv]
    if case.cli in ("train.py", "step1 process"):
        code, stdout, stderr = run_process(case.cli, argv)
    else:
        code, stdout, stderr = run_in_process(in_process_mains()[case.cli], argv, capsys)
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert code == case.exit_code, f"exit {code}; stderr: {stderr[-2000:]}"
    assert len(errors) == 1, stderr[-2000:]
    for message in case.message:
        assert fill(message) in errors[0]
    assert "Traceback" not in stderr
    assert folder_state(out) == before
    if case.cli == "chat":
        assert stdout == ""  # no answer printed


def test_a_failing_step_under_train_py_is_one_error_line_and_leaves_only_its_log(tmp_path):
    """A step that fails inside the launcher: train.py names the step and the step's own error line, and the
    step's folder holds nothing but the log it points to."""
    out = tmp_path / "out"
    code, stdout, stderr = run_process("train.py", [
        "--step", "1", "--no-eval", "--output-dir", str(out),
        "--step1-args", f"--data_path {tmp_path}/nowhere --data_output_path {tmp_path}/cache"])
    assert code == 1, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: step 1 failed: unknown data set '{tmp_path}/nowhere': it is not a known name "
                      f"(Dahoas/rm-static, Dahoas/full-hh-rlhf, Dahoas/synthetic-instruct-gptj-pairwise, "
                      f"yitingxie/rlhf-reward-datasets, openai/webgpt_comparisons, stanfordnlp/SHP, builtin, "
                      f"local/jsonfile) and no such local path exists; re-run this step alone with --step 1"]
    assert "step 1 FAILED" in stdout and "Traceback" not in stderr
    assert folder_state(out) == ["actor-models", "actor-models/tiny", "actor-models/tiny/training.log"]
