"""Tests of train.py and its registry of algorithms (training/pipeline.py): which stages each algorithm runs, what
each starts from (named flags), the flags every stage gets from the pipeline, the defaults an algorithm takes on data
with a checker, the closing evaluation's models, the run scripts and launch.sh, and train.py's answers to an
unusable --output-dir. Commands are built in process, or printed by `train.py --dry-run` (no launcher runs);
tests/training/step1_supervised_finetuning/test_step1.py runs the real thing."""
import json
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import train
from tests.files import write_jsonl
from training.pipeline import (ALGORITHMS, MIN_EVAL_PROMPTS, STAGES, Algorithm, check_round_flags, closing_answers,
                               evaluation_command, fit_evaluation, plan, step_command)
from utils.rl.estimators import CRITIC_FREE
from utils.runtime.errors import ConfigError, DataError

ROOT = Path(train.__file__).parent


def commands(*argv):
    """{run name: its command} of the runs of --step, and the evaluation command of a `train.py` call."""
    args = train.parse_args(["--output-dir", "out", *argv])
    runs = plan(args)
    return {run.name: step_command(args, run) for run in runs if run.spec.step in args.step}, \
        evaluation_command(args, runs)


def flag(command, name):
    """The value of `name` in `command` (its last: argparse keeps a flag's last value); None without it."""
    if name not in command:
        return None
    return command[len(command) - command[::-1].index(name)]


def write_rows(folder, *names, answered=True):
    """Small JSON-lines data files `names` in `folder`: prompts with a chosen and a rejected answer, or prompts
    alone."""
    for name in names:
        write_jsonl(folder / name, ({"prompt": f"What is {i} + 1?",
                                     **({"chosen": f" {i + 1}", "rejected": f" {i + 2}"} if answered else {})}
                                    for i in range(10)))


def script_folder(command):
    return Path(command[1]).parents[2].name


def run_main(argv, capsys):
    """(exit code, stdout, stderr) of train.main(argv) in process."""
    try:
        code = train.main(argv)
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def error_lines(err):
    """The `error:` lines of a stderr (without the notes a library may print as it loads)."""
    return [line for line in err.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("argv, expected", [
    ([], ["sft", "pairs", "reward", "ppo"]),
    (["--pair-judge", "none"], ["sft", "reward", "ppo"]),
    (["--algorithm", "dpo", "--pair-judge", "none"], ["sft", "dpo"]),
    (["--algorithm", "grpo", "--reward-fn", "none"], ["sft", "reward", "rl"]),
    (["--algorithm", "rloo", "--reward-fn", "builtin"], ["sft", "rl"]),
    (["--algorithm", "dpo", "--pair-judge", "none", "--step", "2"], ["dpo"]),
    (["--step", "1", "3"], ["sft", "ppo"]),
])
def test_each_algorithm_runs_its_stages_in_order(argv, expected):
    stage_commands, _ = commands(*argv)
    assert list(stage_commands) == expected
    for stage, command in stage_commands.items():
        if STAGES[stage].folder:  # not sample_pairs.py, a script of inference/
            assert script_folder(command) == STAGES[stage].folder


def test_the_algorithms_are_one_registry_whose_critic_free_rows_are_the_estimators():
    assert train.build_parser()._option_string_actions["--algorithm"].choices == tuple(ALGORITHMS)
    critic_free = [name for name, row in ALGORITHMS.items() if "rl" in row.stages]
    assert critic_free == [*CRITIC_FREE, "gspo"]  # every estimator, and GSPO on the grpo one
    for name in CRITIC_FREE:
        rl = commands("--algorithm", name)[0]["rl"]
        assert flag(rl, "--advantage_estimator") == name


def test_an_algorithm_on_an_estimator_of_another_name_is_one_row():
    """GSPO: the grpo estimator with a sequence-level policy loss, its small clip ranges and the paper's mean over
    answers, and GRPO's recipe; on the built-in task the checker as its reward."""
    stage_commands, _ = commands("--algorithm", "gspo")
    assert list(stage_commands) == ["sft", "rl"]
    rl = stage_commands["rl"]
    assert (flag(rl, "--advantage_estimator"), flag(rl, "--policy_loss"), flag(rl, "--reward_fn")) == \
        ("grpo", "gspo", "builtin")
    assert (flag(rl, "--cliprange_low"), flag(rl, "--cliprange_high"), flag(rl, "--loss_agg_mode")) == \
        ("3e-4", "4e-4", "seq_mean_token_mean")
    grpo = commands("--algorithm", "grpo")[0]["rl"]
    assert flag(rl, "--num_samples_per_prompt") == flag(grpo, "--num_samples_per_prompt") == "8"


@pytest.mark.parametrize("algorithm, stages, folder, output", [
    ("kto", ["sft", "pairs", "kto"], "step2_kto_finetuning", "out/kto-models/tiny"),
    ("orpo", ["orpo"], "step2_dpo_finetuning", "out/orpo-models/tiny"),
])
def test_kto_and_orpo_are_a_stage_row_each(algorithm, stages, folder, output):
    """KTO: its own step-2 folder after step 1 (on the built-in task from the actor's judged answers); ORPO: DPO's
    folder with the orpo loss, from the base model, no step 1, compared with the base model at the end."""
    stage_commands, evaluation = commands("--algorithm", algorithm)
    assert list(stage_commands) == stages
    command = stage_commands[stages[-1]]
    assert script_folder(command) == folder and flag(command, "--output_dir") == output
    start = "out/actor-models/tiny" if algorithm == "kto" else "tiny"
    assert flag(command, "--model_name_or_path") == flag(evaluation, "--model_name_or_path_baseline") == start
    assert flag(evaluation, "--model_name_or_path_finetune") == output
    if algorithm == "orpo":
        assert flag(command, "--loss_type") == "orpo" and flag(command, "--max_steps") == "2000"
    else:
        assert flag(command, "--data_path") == "out/sampled-pairs/tiny"


def test_each_stage_starts_from_the_outputs_before_it_by_named_flags():
    stage_commands, evaluation = commands("--algorithm", "dpo", "--pair-judge", "none")
    dpo = stage_commands["dpo"]
    assert dpo[2:8] == ["--model_name_or_path", "out/actor-models/tiny", "--zero_stage", "0", "--output_dir",
                        "out/dpo-models/tiny"]
    assert flag(evaluation, "--model_name_or_path_baseline") == "out/actor-models/tiny"
    assert flag(evaluation, "--model_name_or_path_finetune") == "out/dpo-models/tiny"
    assert "--reward_model" not in evaluation

    stage_commands, evaluation = commands("--algorithm", "grpo", "--reward-fn", "builtin")
    rl = stage_commands["rl"]
    assert flag(rl, "--actor_model_name_or_path") == "out/actor-models/tiny"
    assert "--critic_model_name_or_path" not in rl  # no reward model
    assert flag(rl, "--advantage_estimator") == "grpo" and flag(rl, "--reward_fn") == "builtin"
    assert flag(evaluation, "--model_name_or_path_finetune") == "out/step3-models/tiny/actor_ema"

    stage_commands, evaluation = commands()  # PPO's recipe keeps the moving average, which is evaluated
    assert flag(evaluation, "--model_name_or_path_finetune") == "out/step3-models/tiny/actor_ema"
    assert stage_commands["sft"][2:8] == ["--model_name_or_path", "tiny", "--zero_stage", "0", "--output_dir",
                                          "out/actor-models/tiny"]
    assert stage_commands["reward"][2:8] == ["--model_name_or_path", "out/actor-models/tiny", "--zero_stage", "0",
                                             "--output_dir", "out/reward-models/tiny"]
    assert stage_commands["ppo"][2:12] == [
        "--actor_model_name_or_path", "out/actor-models/tiny", "--critic_model_name_or_path", "out/reward-models/tiny",
        "--actor_zero_stage", "0", "--critic_zero_stage", "0", "--output_dir", "out/step3-models/tiny"]
    assert "--advantage_estimator" not in stage_commands["ppo"]  # step 3's default: PPO's GAE
    assert flag(evaluation, "--reward_model") == "out/reward-models/tiny"


def test_step_3_with_ema_is_evaluated_on_its_moving_average():
    _, evaluation = commands("--step3-args=--enable_ema --ema_beta 0.99")
    assert flag(evaluation, "--model_name_or_path_finetune") == "out/step3-models/tiny/actor_ema"
    # A value that is one flag alone is the value, also written apart from its --stepN-args.
    stage_commands, evaluation = commands("--step3-args", "--enable_ema", "--step1-args", "--lora_dim 0")
    assert stage_commands["ppo"][-1] == "--enable_ema" and stage_commands["sft"][-2:] == ["--lora_dim", "0"]
    assert flag(evaluation, "--model_name_or_path_finetune") == "out/step3-models/tiny/actor_ema"
    _, evaluation = commands("--algorithm", "dpo", "--pair-judge", "none", "--step2-args=--beta 0.2")
    assert flag(evaluation, "--model_name_or_path_finetune") == "out/dpo-models/tiny"


def test_step_one_alone_is_evaluated_against_the_base_model():
    _, evaluation = commands("--step", "1")
    assert flag(evaluation, "--model_name_or_path_baseline") == "tiny"
    assert commands("--step", "2")[1] is None  # a reward model alone: no actor to compare


def test_data_without_reference_answers_skips_step_1_and_rl_starts_from_the_base_model(capsys):
    """reasoning-gym tasks that any valid solution answers (graph_color) give prompts only: nothing to imitate."""
    spec = "reasoning_gym:graph_color?size=40"
    stage_commands, evaluation = commands("--algorithm", "grpo", "--reward-fn", "reasoning_gym", "--data-path", spec)
    assert list(stage_commands) == ["rl"]
    rl = stage_commands["rl"]
    assert flag(rl, "--actor_model_name_or_path") == "tiny" and "--critic_model_name_or_path" not in rl
    assert flag(evaluation, "--model_name_or_path_baseline") == "tiny"
    # the tiny recipe keeps a moving average of the actor, which the evaluation compares
    assert flag(evaluation, "--model_name_or_path_finetune") == "out/step3-models/tiny/actor_ema"
    mixed, _ = commands("--algorithm", "grpo", "--reward-fn", "builtin", "--data-path", spec, "builtin")
    assert list(mixed) == ["sft", "rl"]  # another data set has answers: step 1 trains on those
    code, out, err = run_main(["--output-dir", "out", "--algorithm", "grpo", "--reward-fn", "reasoning_gym",
                               "--data-path", spec, "--step", "1", "--dry-run"], capsys)
    assert code == 2
    assert "step 1 skipped: reasoning_gym:graph_color?size=40 has no reference answers" in out
    assert error_lines(err) == ["error: --step 1: nothing to run for --algorithm grpo"]


def test_an_algorithm_without_step_1_runs_without_data_path(monkeypatch, capsys, tmp_path):
    """Before: `" ".join(args.data_path)` of None, a TypeError, for a pipeline without step 1 on the default data."""
    monkeypatch.setitem(ALGORITHMS, "from_base", Algorithm(("reward", "rl"), "a reward model, then RL from the base "
                                                                              "model", flags=("--advantage_estimator",
                                                                                              "grpo")))
    code, out, err = run_main(["--output-dir", str(tmp_path / "out"), "--algorithm", "from_base", "--dry-run",
                               "--no-eval"], capsys)
    assert code == 0, err
    assert "step 1 skipped" not in out and len(out.splitlines()) == 2
    assert "--actor_model_name_or_path tiny " in out.splitlines()[1]


def test_a_local_file_of_prompts_alone_skips_step_1_and_one_with_answers_does_not(tmp_path):
    questions, answered = tmp_path / "questions.jsonl", tmp_path / "answered.jsonl"
    write_rows(tmp_path, questions.name, answered=False)
    write_rows(tmp_path, answered.name)
    stage_commands, _ = commands("--algorithm", "rloo", "--reward-fn", "builtin", "--data-path", str(questions))
    assert list(stage_commands) == ["rl"]
    assert flag(stage_commands["rl"], "--data_split") == "0,0,1"  # no other stage reads them: step 3 takes all
    mine, _ = commands("--algorithm", "rloo", "--reward-fn", "builtin", "--data-path", str(questions),
                       "--data-split", "1,1,1")
    assert flag(mine["rl"], "--data_split") == "1,1,1"
    stage_commands, _ = commands("--algorithm", "rloo", "--reward-fn", "builtin", "--data-path", str(answered))
    assert list(stage_commands) == ["sft", "rl"]
    assert {flag(command, "--data_split") for command in stage_commands.values()} == {"2,0,4"}  # no part unread


@pytest.mark.parametrize("algorithm, split", [("dpo", "2,4,0"), ("kto", "2,4,0"), ("orpo", "0,4,0"),
                                              ("ppo", None), ("grpo", None)])
def test_on_the_users_data_no_part_of_the_split_goes_to_a_step_that_does_not_run(tmp_path, algorithm, split):
    """Before: DPO and KTO read parts 1 and 2 of 2,4,4 and ORPO part 2, leaving 40-60% of the user's rows
    unread. Every stage of a run takes the same split; the built-in task and reasoning-gym specs keep 2,4,4, as
    does a --data-split given."""
    write_rows(tmp_path, "pairs.jsonl")
    data = ["--data-path", str(tmp_path / "pairs.jsonl"), "--pair-judge", "none", "--algorithm", algorithm]
    stage_commands, _ = commands(*data, "--step", "1", "2", "3")
    assert {flag(command, "--data_split") for command in stage_commands.values()} == {split}
    assert {flag(command, "--data_split") for command in commands(*data, "--data-split", "1,1,1")[0].values()} \
        == {"1,1,1"}
    builtin, _ = commands("--pair-judge", "none", "--algorithm", algorithm)
    gym, _ = commands("--data-path", "reasoning_gym:chain_sum", "--pair-judge", "none", "--algorithm", algorithm)
    assert {flag(command, "--data_split") for command in [*builtin.values(), *gym.values()]} == {None}


def test_a_data_path_that_is_no_known_name_and_no_file_is_refused_before_any_step(tmp_path):
    missing = str(tmp_path / "nowhere.jsonl")
    with pytest.raises(DataError, match=f"^--data-path: unknown data set '{missing}'"):
        commands("--data-path", "builtin", missing)


def test_the_closing_evaluation_scores_data_without_a_checker_with_the_rl_reward_function(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_rows(tmp_path, "questions.jsonl", answered=False)
    checks = tmp_path / "checks.py"
    checks.write_text("def score(prompts, answers):\n    return [0.0] * len(answers)\n")
    spec = f"{checks}:score"
    _, evaluation = commands("--algorithm", "grpo", "--reward-fn", spec, "--data-path", "questions.jsonl")
    assert flag(evaluation, "--reward_fn") == spec
    for data in (["--data-path", "builtin"], []):  # the built-in checker (or a verifier) is the yardstick there
        _, evaluation = commands("--algorithm", "grpo", "--reward-fn", spec, *data)
        assert "--reward_fn" not in evaluation


def test_smollm2_on_the_users_data_and_reward_function_takes_the_verifier_rl_recipe_and_its_budget(tmp_path,
                                                                                                      monkeypatch):
    """Critic-free RL on a user's reward function: dynamic sampling and the time budget, as on reasoning-gym tasks;
    on a reward model (pairs, no --reward-fn), step 3's recipe alone and no budget."""
    monkeypatch.chdir(tmp_path)
    write_rows(tmp_path, "questions.jsonl", answered=False)
    write_rows(tmp_path, "pairs.jsonl")
    (tmp_path / "checks.py").write_text("def score(prompts, answers):\n    return [0.0] * len(answers)\n")
    model = ["--actor-model", "smollm2-135m", "--reward-model", "smollm2-135m", "--algorithm", "grpo"]
    args = train.parse_args(["--output-dir", "out", *model, "--data-path", "questions.jsonl", "--reward-fn",
                             "checks.py:score"])
    assert args.time_budget == 27 and args.deadline is not None
    rl = step_command(args, plan(args)[-1])
    assert "--filter_zero_variance" in rl and flag(rl, "--num_samples_per_prompt") == "8"
    assert flag(rl, "--max_steps") == "400" and flag(rl, "--deadline") is not None
    on_a_reward_model, _ = commands(*model, "--data-path", "pairs.jsonl")
    assert "--filter_zero_variance" not in on_a_reward_model["rl"] and "--deadline" not in on_a_reward_model["rl"]
    assert flag(on_a_reward_model["rl"], "--max_steps") == "20"


def test_pipeline_wide_flags_reach_every_stage_and_stage_flags_win(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_rows(tmp_path, "a.jsonl", "b.jsonl")
    stage_commands, evaluation = commands("--data-path", "a.jsonl", "b.jsonl", "--data-split", "1,1,1", "--seed",
                                          "7", "--zero-stage", "3", "--step2-args", "--seed 9")
    for stage, command in stage_commands.items():
        text = shlex.join(command)
        assert "--data_path a.jsonl b.jsonl --data_split 1,1,1 --seed 7" in text, stage
        assert "--seed 9" not in text or text.rindex("--seed 9") > text.rindex("--seed 7")
    assert shlex.join(stage_commands["reward"]).endswith("--seed 9")  # after the pipeline's: argparse keeps it
    assert flag(stage_commands["sft"], "--zero_stage") == "3"
    ppo = stage_commands["ppo"]
    assert flag(ppo, "--actor_zero_stage") == flag(ppo, "--critic_zero_stage") == "3"
    assert "--data_path a.jsonl b.jsonl" in shlex.join(evaluation)
    plain, _ = commands("--pair-judge", "none")
    assert all("--data_path" not in command and "--seed" not in command for command in plain.values())


def test_data_column_flags_reach_every_stage_that_reads_the_data_and_the_evaluation(tmp_path, monkeypatch):
    """--prompt-key ... become each stage's --prompt_key ... (which it parses), but not step 2's where it reads the
    sampled pairs, written in the standard columns; train.py reads the data with them before any step runs."""
    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "qa.jsonl", ({"q": f" Human: What is {i} + 1? Assistant:", "answer": f" {i + 1}"}
                                        for i in range(10)))
    keys = ["--prompt-key", "q", "--completion-key", "answer"]
    stage_commands, evaluation = commands("--algorithm", "grpo", "--reward-fn", "builtin", "--data-path", "qa.jsonl",
                                          *keys)
    assert list(stage_commands) == ["sft", "rl"]  # the answers were found in the renamed column: step 1 runs
    for command in [*stage_commands.values(), evaluation]:
        assert (flag(command, "--prompt_key"), flag(command, "--completion_key")) == ("q", "answer")
    from training.step1_supervised_finetuning.main import parse_args
    from utils.runtime.args import column_keys

    assert column_keys(parse_args(stage_commands["sft"][2:])) == {"prompt": "q", "completion": "answer"}
    stage_commands, _ = commands("--algorithm", "dpo", "--pair-judge", "builtin", "--data-path", "qa.jsonl", *keys)
    assert flag(stage_commands["sft"], "--prompt_key") == flag(stage_commands["pairs"], "--prompt_key") == "q"
    assert "--prompt_key" not in stage_commands["dpo"] and "--completion_key" not in stage_commands["dpo"]
    with pytest.raises(DataError, match="^--data-path: qa.jsonl: row 0 \\(line 1\\): missing field 'prompt'"):
        commands("--algorithm", "grpo", "--reward-fn", "builtin", "--data-path", "qa.jsonl")  # without the flags


def test_every_stage_of_one_run_reports_to_the_trackers_asked_in_one_group(tmp_path):
    """One group per train.py run for W&B and MLflow, named after --output-dir, passed to every stage with the
    trackers and their folders under --output-dir; --resume goes on in the group the run it resumes kept; `none`
    turns them off."""
    out = tmp_path / "my out"
    argv = ["--output-dir", str(out), "--algorithm", "dpo", "--pair-judge", "none", "--report-to", "wandb", "mlflow"]
    args = train.parse_args(argv)
    stage_commands = {run.name: step_command(args, run) for run in plan(args)}
    assert list(stage_commands) == ["sft", "dpo"]
    groups = {flag(command, "--run_group") for command in stage_commands.values()}
    assert groups == {args.run_group} and args.run_group.startswith("my-out-")
    for command in stage_commands.values():
        text = shlex.join(command)
        assert f"--report_to wandb mlflow --tensorboard_path {shlex.quote(str(out / 'tensorboard'))}" in text
        assert flag(command, "--tracking_dir") == str(out)
    assert train.parse_args(argv).run_group.startswith("my-out-")
    out.mkdir()
    (out / train.RUN_GROUP_FILE).write_text("my-out-20250101-000000\n")
    assert train.parse_args([*argv, "--resume"]).run_group == "my-out-20250101-000000"
    assert train.parse_args(argv).run_group != "my-out-20250101-000000"  # a new run, a new group
    plain, _ = commands("--report-to", "none", "--pair-judge", "none")
    assert all(flag(command, "--report_to") == "none" for command in plain.values())
    default, _ = commands("--pair-judge", "none")  # TensorBoard alone: its folders group the stages, no group
    assert all(flag(command, "--report_to") == "tensorboard" and "--run_group" not in command
               for command in default.values())


def test_per_model_zero_stages_override_the_pipeline_one():
    stage_commands, _ = commands("--zero-stage", "2", "--reward-zero-stage", "3")
    assert flag(stage_commands["sft"], "--zero_stage") == "2" and flag(stage_commands["reward"], "--zero_stage") == "3"
    assert (flag(stage_commands["ppo"], "--actor_zero_stage"), flag(stage_commands["ppo"], "--critic_zero_stage")) \
        == ("2", "3")


def test_critic_free_stage_takes_step_3_recipe_then_its_own():
    stage_commands, _ = commands("--algorithm", "grpo", "--reward-fn", "builtin")
    from training.recipes import recipe_flags

    text = shlex.join(stage_commands["rl"])
    step3, grpo = shlex.join(recipe_flags("tiny", 3)), shlex.join(recipe_flags("tiny", "grpo"))
    assert f"{step3} {grpo} --report_to tensorboard" in text


def test_a_reward_function_needs_a_critic_free_algorithm():
    with pytest.raises(ConfigError, match="--reward-fn needs a critic-free --algorithm"):
        train.parse_args(["--reward-fn", "builtin"])


# ---------------------------------------------------------------------- defaults on data with a checker
@pytest.mark.parametrize("argv, stages, judge, reward_fn, notice", [
    # the built-in task (the default data): iterative DPO on the actor's judged answers, critic-free RL on the checker
    (["--algorithm", "dpo"], ["sft"] + ["pairs", "dpo"] + ["pairs@2", "dpo@2", "pairs@3", "dpo@3", "pairs@4", "dpo@4"],
     "builtin", None, "--algorithm dpo takes --pair-judge builtin --pair-rounds 4 by default"),
    (["--algorithm", "grpo"], ["sft", "rl"], None, "builtin", "--algorithm grpo takes --reward-fn builtin by default"),
    (["--algorithm", "rloo", "--data-path", "builtin"], ["sft", "rl"], None, "builtin", "--reward-fn none opts out"),
    (["--algorithm", "reinforce_pp"], ["sft", "rl"], None, "builtin", "--reward-fn builtin"),
    (["--algorithm", "grpo", "--data-path", "reasoning_gym:chain_sum?max_digits=1"], ["sft", "rl"], None,
     "reasoning_gym", "--algorithm grpo takes --reward-fn reasoning_gym by default"),
    # what the user gives wins
    (["--algorithm", "dpo", "--pair-rounds", "2"], ["sft", "pairs", "dpo", "pairs@2", "dpo@2"], "builtin", None,
     "--algorithm dpo takes --pair-judge builtin by default"),
    (["--algorithm", "dpo", "--pair-judge", "builtin"], ["sft", "pairs", "dpo"], "builtin", None, ""),
    (["--algorithm", "grpo", "--pair-judge", "builtin"], ["sft", "pairs", "reward", "rl"], "builtin", None, ""),
    (["--algorithm", "grpo", "--reward-fn", "reasoning_gym_solved", "--data-path", "reasoning_gym:gcd"],
     ["sft", "rl"], None, "reasoning_gym_solved", ""),
    # the opt-outs: the data set's own pairs, a step-2 reward model
    (["--algorithm", "dpo", "--pair-judge", "none"], ["sft", "dpo"], None, None, ""),
    (["--algorithm", "grpo", "--reward-fn", "none"], ["sft", "reward", "rl"], None, None, ""),
    # PPO: its reward model on the actor's judged answers
    ([], ["sft", "pairs", "reward", "ppo"], "builtin", None, "--algorithm ppo takes --pair-judge builtin by default"),
    (["--pair-judge", "none"], ["sft", "reward", "ppo"], None, None, ""),
    # data without a checker, or several, or a step's own data: none
    (["--algorithm", "dpo", "--data-path", "{tmp}/a.jsonl"], ["sft", "dpo"], None, None, ""),
    (["--algorithm", "grpo", "--data-path", "builtin", "reasoning_gym:gcd"], ["sft", "reward", "rl"], None, None, ""),
    (["--algorithm", "grpo", "--step3-args", "--data_path {tmp}/a.jsonl"], ["sft", "reward", "rl"], None, None, ""),
])
def test_an_algorithm_takes_its_best_measured_recipe_on_data_with_a_checker(argv, stages, judge, reward_fn, notice,
                                                                            tmp_path, capsys):
    write_rows(tmp_path, "a.jsonl")
    stage_commands, _ = commands(*(arg.replace("{tmp}", str(tmp_path)) for arg in argv))
    out = capsys.readouterr().out
    assert list(stage_commands) == stages
    pairs = [command for name, command in stage_commands.items() if name.startswith("pairs")]
    assert all(flag(command, "--reward_fn") == judge for command in pairs)
    assert flag(stage_commands.get("rl", []), "--reward_fn") == reward_fn
    if notice:
        assert notice in out and len(out.splitlines()) == 1
        assert out.rstrip().endswith(("--pair-judge none opts out", "--reward-fn none opts out"))
    else:
        assert out == ""


@pytest.mark.parametrize("argv, expected", [
    (["--algorithm", "orpo"], {"orpo": "builtin"}),  # ORPO's default: the checker keeps the right chosen answers
    (["--algorithm", "orpo", "--answer-filter", "none"], {"orpo": None}),
    (["--algorithm", "orpo", "--data-path", "{tmp}/a.jsonl"], {"orpo": None}),  # no checker
    (["--algorithm", "dpo", "--pair-judge", "none", "--answer-filter", "builtin"],
     {"sft": "builtin", "dpo": "builtin"}),
    (["--pair-judge", "none", "--answer-filter", "builtin"], {"sft": "builtin", "reward": "builtin", "ppo": None}),
    (["--algorithm", "grpo"], {"sft": None, "rl": None}),
])
def test_answer_filter_reaches_the_stages_that_train_on_the_data_answers(argv, expected, tmp_path, capsys):
    write_rows(tmp_path, "a.jsonl")
    stage_commands, _ = commands(*(arg.replace("{tmp}", str(tmp_path)) for arg in argv))
    assert {name: flag(stage_commands[name], "--answer_filter_fn") for name in expected} == expected
    if argv == ["--algorithm", "orpo"]:
        assert capsys.readouterr().out.startswith("--algorithm orpo takes --answer-filter builtin by default")


def test_an_opt_out_with_pair_rounds_is_refused():
    with pytest.raises(ConfigError, match="--pair-rounds repeats --pair-judge's sampling and DPO: it needs "
                                          "--algorithm dpo and --pair-judge"):
        train.parse_args(["--algorithm", "dpo", "--pair-judge", "none", "--pair-rounds", "2"])


# ---------------------------------------------------------------------- sampled pairs and rounds
@pytest.mark.parametrize("algorithm, step2", [("dpo", "dpo"), ("ppo", "reward"), ("grpo", "reward")])
def test_pair_judge_samples_step_2s_pairs_from_the_step_1_actor_and_step_2_reads_them_whole(algorithm, step2, tmp_path,
                                                                                            monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_rows(tmp_path, "a.jsonl")
    from training.recipes import recipe_flags
    from utils.data.sampled_pairs import PAIRS_DATA_SPLIT

    stage_commands, evaluation = commands("--algorithm", algorithm, "--pair-judge", "builtin", "--pair-samples", "6",
                                          "--data-path", "a.jsonl", "--seed", "7", "--resume")
    assert list(stage_commands)[:3] == ["sft", "pairs", step2]
    pairs = stage_commands["pairs"]
    assert pairs[:2] == [sys.executable, str(ROOT / "inference" / "sample_pairs.py")]
    text = shlex.join(pairs)
    recipe = shlex.join(recipe_flags("tiny", "pairs"))
    assert recipe and f"{recipe} --model_name_or_path out/actor-models/tiny --reward_fn builtin --output_dir " \
        "out/sampled-pairs/tiny --samples_per_prompt 6" in text  # --pair-samples after the recipe: it wins
    split = " --data_split 2,4,0" if algorithm == "dpo" else ""  # no step 3 to read part 3 of the user's data
    assert text.endswith(f"--resume --data_path a.jsonl --seed 7{split}")  # the prompts: part 2 of the data
    step2_text = shlex.join(stage_commands[step2])
    assert step2_text.endswith(f"--data_path out/sampled-pairs/tiny --data_split {PAIRS_DATA_SPLIT}")  # wins
    for stage in set(stage_commands) - {"pairs", step2}:
        assert "sampled-pairs" not in shlex.join(stage_commands[stage])
    assert "sampled-pairs" not in shlex.join(evaluation)
    with_args, _ = commands("--algorithm", algorithm, "--pair-judge", "builtin", "--step2-args", "--data_split 1,1")
    assert shlex.join(with_args[step2]).endswith("--data_split 1,1")  # the user's step-2 flags still win


def test_pair_rounds_sample_each_round_from_the_round_before_and_the_last_round_is_evaluated():
    from training.recipes import recipe_flags
    from utils.data.sampled_pairs import PAIRS_DATA_SPLIT

    stage_commands, evaluation = commands("--algorithm", "dpo", "--pair-judge", "builtin", "--pair-rounds", "3")
    assert list(stage_commands) == ["sft", "pairs", "dpo", "pairs@2", "dpo@2", "pairs@3", "dpo@3"]
    assert [(flag(stage_commands[stage], "--model_name_or_path"), flag(stage_commands[stage], "--output_dir"))
            for stage in ("pairs", "dpo", "pairs@2", "dpo@2", "pairs@3", "dpo@3")] == [
        ("out/actor-models/tiny", "out/sampled-pairs/tiny"),
        ("out/actor-models/tiny", "out/dpo-models/tiny-round1"),
        ("out/dpo-models/tiny-round1", "out/sampled-pairs/tiny-round2"),
        ("out/dpo-models/tiny-round1", "out/dpo-models/tiny-round2"),
        ("out/dpo-models/tiny-round2", "out/sampled-pairs/tiny-round3"),
        ("out/dpo-models/tiny-round2", "out/dpo-models/tiny")]
    recipe = shlex.join(recipe_flags("tiny", "dpo") + recipe_flags("tiny", "dpo_pairs"))  # the second wins
    for stage, pairs in (("dpo", "tiny"), ("dpo@2", "tiny-round2"), ("dpo@3", "tiny-round3")):
        text = shlex.join(stage_commands[stage])
        assert recipe_flags("tiny", "dpo_pairs") and recipe in text
        assert text.endswith(f"--data_path out/sampled-pairs/{pairs} --data_split {PAIRS_DATA_SPLIT}")
        assert "--ref_model_name_or_path" not in text  # each round's reference: the actor it starts from
    assert flag(evaluation, "--model_name_or_path_baseline") == "out/actor-models/tiny"
    assert flag(evaluation, "--model_name_or_path_finetune") == "out/dpo-models/tiny"
    step_2, _ = commands("--algorithm", "dpo", "--pair-judge", "builtin", "--pair-rounds", "2", "--step", "2")
    assert list(step_2) == ["pairs", "dpo", "pairs@2", "dpo@2"]  # every round is step 2


@pytest.mark.parametrize("step2_args, named", [
    ("--beta 0.2 --output_dir {tmp}/dpo", "--output_dir"),
    ("--output_dir={tmp}/dpo", "--output_dir"),  # argparse's `=` form
    ("--output_d {tmp}/dpo", "--output_dir"),  # an abbreviation argparse resolves
    ("--model_name_or_p={tmp}/actor", "--model_name_or_path"),
    ("--data_pa {tmp}/pairs", "--data_path"),
])
def test_pair_rounds_refuse_step_2_flags_that_set_a_rounds_start_output_or_pairs_as_the_step_reads_them(
        step2_args, named, tmp_path, capsys):
    code, _, err = run_main(["--output-dir", str(tmp_path / "out"), "--algorithm", "dpo", "--pair-rounds", "2",
                             f"--step2-args={step2_args.replace('{tmp}', str(tmp_path))}", "--dry-run"], capsys)
    assert code == 2
    assert error_lines(err) == [
        f"error: --step2-args {named}: with --pair-rounds train.py sets it for each round (its start, its output, its "
        "pairs)"]


@pytest.mark.parametrize("step, step_args", [(1, "--max_steps 1 --output_dir {tmp}/elsewhere"),
                                              (3, "--output_d={tmp}/elsewhere")])
def test_step_args_that_move_a_stages_output_are_refused(step, step_args, tmp_path, capsys):
    """Before: step 1 saved to the folder given, and the evaluation and the report took the earlier actor in
    actor-models/ for this run's."""
    code, _, err = run_main(["--output-dir", str(tmp_path / "out"), f"--step{step}-args",
                             step_args.replace("{tmp}", str(tmp_path)), "--dry-run"], capsys)
    assert code == 2
    assert error_lines(err) == [
        f"error: --step{step}-args --output_dir: train.py puts each stage's output under --output-dir, where the "
        "later stages, the evaluation and the report read it; give --output-dir instead"]


@pytest.mark.parametrize("argv, expected", [
    (["--step3-args", "--bogus_flag"], "error: --step3-args --bogus_flag: unrecognized arguments: --bogus_flag"),
    (["--step3-args", "--load_best_model_at_end"], "error: --step3-args --load_best_model_at_end: "
     "--load_best_model_at_end needs --eval_interval > 0: the evaluations it chooses among"),
    (["--algorithm", "grpo", "--step1-args", "--max_steps 3 --nope 1"], "error: --step1-args --max_steps 3 --nope 1: "
     "unrecognized arguments: --nope 1"),
])
def test_a_step_flag_the_step_refuses_is_one_error_before_any_step_runs(argv, expected, tmp_path, capsys):
    out = tmp_path / "out"
    code, stdout, err = run_main(["--output-dir", str(out), *argv], capsys)
    assert code == 2 and error_lines(err) == [expected]
    assert "---- step" not in stdout and not out.exists()  # nothing ran, nothing was written


def test_pair_rounds_take_other_step_2_flags_and_refuse_ones_the_step_refuses():
    args = train.parse_args(["--output-dir", "out", "--algorithm", "dpo", "--pair-rounds", "2", "--step2-args",
                             "--beta=0.2 --data_split 1,1 --ref_model_name_or_path tiny"])
    check_round_flags(args, plan(args))  # the reference of every round, as OpenRLHF's loop: allowed
    args = train.parse_args(["--output-dir", "out", "--algorithm", "dpo", "--pair-rounds", "2", "--step2-args",
                             "--beta -1"])
    with pytest.raises(ConfigError, match=r"^--step2-args --beta -1: --beta must be positive"):
        check_round_flags(args, plan(args))


def test_sampled_pairs_come_before_step_2_when_step_1_cannot_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_rows(tmp_path, "questions.jsonl", answered=False)
    stage_commands, _ = commands("--algorithm", "dpo", "--pair-judge", "builtin", "--data-path", "questions.jsonl")
    assert list(stage_commands) == ["pairs", "dpo"]
    assert flag(stage_commands["pairs"], "--model_name_or_path") == "tiny"  # the base model's own answers


def dry_run(*argv, env=None):
    result = subprocess.run([sys.executable, "train.py", "--dry-run", *argv], cwd=ROOT, capture_output=True,
                            text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_dry_run_shows_the_sampled_pairs_between_step_1_and_step_2(tmp_path):
    lines = dry_run("--algorithm", "dpo", "--pair-judge", "builtin", "--output-dir", str(tmp_path / "out"))
    assert [("step1_supervised_finetuning/main.py" in line, "sample_pairs.py" in line, "step2_dpo" in line,
             "prompt_eval.py" in line) for line in lines] == [(True, False, False, False), (False, True, False, False),
                                   (False, False, True, False), (False, False, False, True)]
    assert not (tmp_path / "out").exists()  # nothing ran


def test_dry_run_of_dpo_on_the_builtin_task_says_which_default_it_took_then_shows_four_rounds(tmp_path):
    lines = dry_run("--algorithm", "dpo", "--output-dir", str(tmp_path / "out"))
    assert lines[0] == ("--algorithm dpo takes --pair-judge builtin --pair-rounds 4 by default on data with a "
                        "checker (the best measured recipe); --pair-judge none opts out")
    assert sum("sample_pairs.py" in line for line in lines) == 4 and sum("step2_dpo" in line for line in lines) == 4
    assert f"--output_dir {tmp_path}/out/dpo-models/tiny " in lines[-2] and "prompt_eval.py" in lines[-1]
    # A default the user sets is the user's: the line no longer says 4 rounds are taken where 2 run.
    lines = dry_run("--algorithm", "dpo", "--pair-rounds", "2", "--output-dir", str(tmp_path / "out"))
    assert lines[0].startswith("--algorithm dpo takes --pair-judge builtin by default on data with a checker")
    assert sum("sample_pairs.py" in line for line in lines) == 2


def test_eval_prompts_and_samples_reach_the_closing_evaluation_after_the_recipe(tmp_path):
    lines = dry_run("--step", "1", "--eval-prompts", "50", "--eval-samples", "2", "--output-dir", str(tmp_path))
    assert "prompt_eval.py" in lines[-1]
    evaluation = shlex.split(lines[-1])
    assert flag(evaluation, "--num_prompts") == "50" and flag(evaluation, "--samples_per_prompt") == "2"
    _, default = commands("--step", "1")
    assert "--num_prompts" not in default and flag(default, "--samples_per_prompt") == "4"  # every prompt, 4 answers
    _, smollm2 = commands("--actor-model", "smollm2-135m", "--step", "1", "--eval-samples", "3")
    assert flag(smollm2, "--samples_per_prompt") == "3" and flag(smollm2, "--num_prompts") == "200"  # the recipe's
    with pytest.raises(ConfigError, match="^--eval-prompts must be at least 1, not 0$"):
        commands("--eval-prompts", "0")


def test_a_stage_that_drops_rows_or_steps_says_so_on_train_pys_output(tmp_path):
    """A real step 1 on a local folder whose train split has overlong rows, and more --max_steps than one epoch
    gives: its WARNING lines and skipped counts, written to its log, are printed by train.py too, and the report
    counts the rows and steps and shows the step's curves; the step's folder has its model card."""
    data = tmp_path / "data"
    rows = [{"prompt": f"What is {i} + 1?", "completion": f" {i + 1}"} for i in range(32)]
    long = [{"prompt": f"Tell me about {i}.", "completion": " a very long answer indeed" * 12} for i in range(8)]
    write_jsonl(data / "train.jsonl", rows + long), write_jsonl(data / "eval.jsonl", rows[:8])
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "train.py", "--step", "1", "--no-eval", "--output-dir", str(out), "--data-path", str(data),
         "--data-split", "1", "--step1-args", f"--max_seq_len 40 --max_steps 50 --num_train_epochs 1 "
         f"--per_device_train_batch_size 8 --per_device_eval_batch_size 8 --data_output_path {tmp_path / 'cache'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    said = lines[lines.index(next(line for line in lines if line.startswith("---- step 1"))) + 1:
                 lines.index(next(line for line in lines if line.startswith("step 1 done")))]
    assert said == ["phase 1 train: 32 samples (skipped: 8 longer than --max_seq_len with its EOS)",
                    said[1], "WARNING: 50 steps asked, 1 epochs of the data give only 4 (4 an epoch); raise "
                             "--num_train_epochs to train them all"]
    assert said[1].startswith("WARNING: --max_seq_len 40 dropped 8 of 40 rows of phase 1 train (20%)")
    assert all(line in (out / "actor-models" / "tiny" / "training.log").read_text() for line in said)
    assert "| 1 SFT | rows kept (train / eval) | 32 of 40 / 8 of 8 |" in lines
    assert "| 1 SFT | optimizer steps | 4 of 50 asked (1 epochs) |" in lines
    # The report draws the step's curves beside it; the step-1 folder has a model card and still loads.
    assert "![sft: training curves](report-sft.png)" in (out / "report.md").read_text()
    assert (out / "report-sft.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    from huggingface_hub import ModelCard
    from transformers import AutoModelForCausalLM

    card = ModelCard.load(out / "actor-models" / "tiny" / "README.md")
    assert card.data.base_model == "tiny" and card.data.tags == ["chatrlhf", "sft"]
    assert "| steps | 4 optimizer steps (50 asked) |" in card.text
    AutoModelForCausalLM.from_pretrained(out / "actor-models" / "tiny")


def test_a_stage_that_fails_for_want_of_rows_says_which_rows_it_dropped(tmp_path):
    """A real step 1 whose every row is over --max_seq_len: its error says "see the skipped counts above", and
    train.py prints them (before, only a step that succeeded had its WARNING lines and counts printed)."""
    data = tmp_path / "data"
    rows = [{"prompt": f"Tell me about {i}.", "completion": " a very long answer indeed" * 12} for i in range(16)]
    write_jsonl(data / "train.jsonl", rows), write_jsonl(data / "eval.jsonl", rows[:4])
    result = subprocess.run(
        [sys.executable, "train.py", "--step", "1", "--no-eval", "--output-dir", str(tmp_path / "out"),
         "--data-path", str(data), "--data-split", "1", "--step1-args",
         f"--max_seq_len 40 --max_steps 2 --data_output_path {tmp_path / 'cache'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert result.returncode != 0 and "see the skipped counts above" in result.stderr, result.stderr[-3000:]
    assert "phase 1 train: 0 samples (skipped: 16 longer than --max_seq_len with its EOS)" in result.stdout
    assert "WARNING: --max_seq_len 40 dropped 16 of 16 rows of phase 1 train (100%)" in result.stdout


# ---------------------------------------------------------------------- run scripts and launch.sh
def launcher_env(**extra):
    env = {key: value for key, value in os.environ.items() if not key.startswith(("OMP_", "GOMP_", "HOSTFILE"))}
    return {**env, "PATH": os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]]),
            "PYTHON": sys.executable, **extra}


@pytest.mark.parametrize("deployment, launcher", [("single_gpu", "--num_gpus 1 "), ("single_node", "--num_gpus "),
                                                  ("multi_node", "--hostfile /etc/hosts.ds ")])
def test_each_run_script_passes_its_flags_by_name_to_its_main_py(deployment, launcher):
    for folder in ("step1_supervised_finetuning", "step2_reward_model_finetuning", "step2_dpo_finetuning",
                   "step2_kto_finetuning", "step3_rlhf_finetuning"):
        script = ROOT / "training" / folder / "training_scripts" / deployment / "run.sh"
        flags = ["--output_dir", "out dir", "--zero_stage", "3", "--beta", "0.2"]
        result = subprocess.run(["bash", str(script), *flags], capture_output=True, text=True, timeout=60,
                                env=launcher_env(DRY_RUN="1", HOSTFILE="/etc/hosts.ds"))
        assert result.returncode == 0, result.stderr
        line = result.stdout.strip()
        assert line.startswith("OMP_NUM_THREADS=") and f" deepspeed {launcher}" in line
        assert line.endswith(f" {ROOT}/training/{folder}/main.py --output_dir out dir --zero_stage 3 --beta 0.2")


def test_multi_node_without_a_hostfile_is_one_error_line(tmp_path):
    script = ROOT / "training" / "step1_supervised_finetuning" / "training_scripts" / "multi_node" / "run.sh"
    result = subprocess.run(["bash", str(script), "--output_dir", str(tmp_path / "out")], capture_output=True,
                            text=True, timeout=60, env=launcher_env(HOSTFILE=str(tmp_path / "hostfile")))
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: multi_node needs a hostfile: {tmp_path}/hostfile does not exist (set " \
                                    "HOSTFILE)"


def test_run_scripts_use_the_interpreter_train_py_runs(tmp_path):
    """train.py run by an interpreter whose folder has no `python` (as /usr/bin/python3.11 beside another version's
    `python`), with a wrong `python` first on PATH: the run scripts still run train.py's own (PYTHON), so
    launch.sh's thread probe works and its settings reach the launcher command."""
    own, wrong = tmp_path / "own", tmp_path / "wrong"
    own.mkdir(), wrong.mkdir()
    (own / "chatrlhf-python").symlink_to(sys.executable)
    if sys.prefix != sys.base_prefix:  # a venv: its interpreter finds its packages through pyvenv.cfg beside or
        # above the path it was started by, so the link's folder gets the venv's pyvenv.cfg and lib/
        shutil.copy(Path(sys.prefix) / "pyvenv.cfg", tmp_path / "pyvenv.cfg")
        (tmp_path / "lib").symlink_to(Path(sys.prefix) / "lib")
    for name in ("python", "python3"):
        (wrong / name).write_text("#!/bin/sh\necho wrong python >&2\nexit 3\n")
        (wrong / name).chmod(0o755)
    env = {key: value for key, value in os.environ.items() if not key.startswith(("OMP_", "GOMP_", "PYTHON"))}
    env["PATH"] = os.pathsep.join([str(wrong), env["PATH"]])
    result = subprocess.run([str(own / "chatrlhf-python"), "train.py", "--dry-run", "--step", "1", "--no-eval"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "wrong python" not in result.stderr
    assert "\nOMP_NUM_THREADS=" in "\n" + result.stdout, result.stdout  # the probe ran
    assert "deepspeed --num_gpus 1" in result.stdout


def test_smollm2_on_reasoning_gym_data_takes_its_data_recipe_in_every_stage_and_the_evaluation():
    spec = "reasoning_gym:chain_sum?max_digits=1"
    stage_commands, evaluation = commands("--actor-model", "smollm2-135m", "--data-path", spec, "--algorithm",
                                          "grpo", "--reward-fn", "reasoning_gym")
    assert list(stage_commands) == ["sft", "rl"]
    assert flag(stage_commands["sft"], "--max_seq_len") == "auto"
    rl = stage_commands["rl"]
    assert flag(rl, "--max_answer_seq_len") == flag(rl, "--max_prompt_seq_len") == "auto"
    assert int(flag(rl, "--num_samples_per_prompt")) > 1 and int(flag(rl, "--eval_interval")) > 0
    assert "--filter_zero_variance" in rl and int(flag(rl, "--max_generation_batches")) > 1  # dynamic sampling
    assert flag(evaluation, "--max_new_tokens") == "auto" and flag(evaluation, "--data_path") == spec
    plain, _ = commands("--actor-model", "smollm2-135m")  # the built-in task: the model's recipe alone
    assert flag(plain["sft"], "--max_seq_len") == "64"


def test_the_closing_evaluation_is_cut_to_the_prompts_the_time_left_holds():
    """100 prompts x (4 sampled at 1 s + 1 greedy at 2 s) x 2 models take 1,200 s after a 60 s setup: 660 s left hold
    50 of them; all of them fit in 1,300 s; never fewer than MIN_EVAL_PROMPTS; unknown rates change nothing."""
    command = ["python", "prompt_eval.py", "--samples_per_prompt", "4", "--num_prompts", "100"]
    rates = {"setup": 60.0, "sampled": 1.0, "greedy": 2.0}
    cut, note = fit_evaluation(command, 100, rates, 660.0)
    assert cut[-2:] == ["--num_prompts", "50"] and cut[:-2] == command
    assert note == ("50 of 100 held-out prompts: the 11.0 minutes --time-budget left hold 50 at step 3's decoding "
                    "rates (--time-budget 0 answers them all)")
    assert fit_evaluation(command, 100, rates, 1300.0) == (command, None)
    assert fit_evaluation(command, 100, rates, 30.0)[0][-1] == str(MIN_EVAL_PROMPTS)
    assert fit_evaluation(command, 100, rates, -5.0)[1] == (f"{MIN_EVAL_PROMPTS} of 100 held-out prompts: "
                                                            f"--time-budget is spent, and {MIN_EVAL_PROMPTS} the fewest "
                                                            "it answers (--time-budget 0 answers them all)")
    assert fit_evaluation(command, 100, {}, 30.0) == (command, None)
    assert fit_evaluation(command, 100, rates, 660.0, tools=True)[0][-1] == "25"  # with and without the tool


def test_train_py_sizes_its_evaluation_by_step_3s_rates_and_the_report_says_so(tmp_path):
    from utils.trainer.report import pipeline_report

    args = train.parse_args(["--output-dir", str(tmp_path), "--algorithm", "grpo", "--reward-fn", "builtin",
                             "--time-budget", "20"])
    runs = plan(args)
    command = evaluation_command(args, runs)
    assert train.fit_closing_evaluation(args, runs, command) == (command, None)  # no step-3 metrics yet
    step3 = next(run for run in runs if run.spec.step == 3)
    step3.output.mkdir(parents=True)
    (step3.output / "metrics.json").write_text(json.dumps({"decoding_s": {"setup": 10.0, "sampled": 0.5,
                                                                          "greedy": 0.5}}))
    args.deadline = time.time() + 10 + 2 * 5 * 0.5 * 30 + 2  # setup and 30 prompts' answers, with 2 s to spare
    cut, note = train.fit_closing_evaluation(args, runs, command)
    assert cut[-2:] == ["--num_prompts", "30"] and note.startswith("30 of 400 held-out prompts: the ")
    report = pipeline_report({}, {}, eval_note=note)
    assert f"| eval | held-out prompts answered, cut to the time budget | {note} |" in report


def test_the_time_budget_gives_step_3_a_deadline_and_the_closing_evaluations_answers(capsys):
    """smollm2-135m on reasoning-gym data: its recipe's --time-budget (said on the output) becomes step 3's
    --deadline, counted from the command's start, and the closing evaluation's 100 prompts x (4 samples + greedy)
    x 2 models are reserved; the user's budget wins, 0 opts out, and an algorithm without a step 3 takes none."""
    spec = ["--actor-model", "smollm2-135m", "--data-path", "reasoning_gym:chain_sum?max_digits=1"]
    started = time.time()
    args = train.parse_args(["--output-dir", "out", *spec, "--algorithm", "grpo", "--reward-fn", "reasoning_gym"])
    assert "takes --time-budget 27" in capsys.readouterr().out
    runs = plan(args)
    assert closing_answers(args, runs) == (100 * 5 * 2, 100 * 2)
    args.reserve_answers, args.reserve_greedy_answers = closing_answers(args, runs)
    rl = step_command(args, runs[-1])
    assert started + 27 * 60 - 1 <= float(flag(rl, "--deadline")) <= time.time() + 27 * 60 + 1
    assert flag(rl, "--reserve_answers") == "1000" and "--max_train_minutes" not in rl
    assert flag(rl, "--reserve_greedy_answers") == "200"
    mine = train.parse_args(["--output-dir", "out", *spec, "--algorithm", "grpo", "--time-budget", "5"])
    assert mine.deadline <= time.time() + 5 * 60
    rl, _ = commands(*spec, "--algorithm", "grpo", "--time-budget", "0")
    assert "--deadline" not in rl["rl"]
    dpo = train.parse_args(["--output-dir", "out", *spec, "--algorithm", "dpo"])
    assert dpo.time_budget is None and dpo.deadline is None
    with pytest.raises(ConfigError, match="^--time-budget bounds step 3's RL, but --algorithm dpo has no step 3$"):
        train.parse_args(["--output-dir", "out", *spec, "--algorithm", "dpo", "--time-budget", "10"])
    with pytest.raises(ConfigError, match="^--time-budget must be a number of minutes, at least 0, not -1.0$"):
        train.parse_args(["--output-dir", "out", "--algorithm", "grpo", "--time-budget", "-1"])
    plain, _ = commands("--algorithm", "grpo")  # the built-in task's recipe has no budget
    assert "--deadline" not in plain["rl"]
    lines = dry_run(*spec, "--algorithm", "grpo", "--time-budget", "12", "--output-dir", "out")
    assert "--time-budget 12: 12.0 minutes left for step 3 and the closing evaluation (1000 answers)" in lines


# ---------------------------------------------------------------------- an unusable --output-dir
def never_launched(command, **kwargs):
    raise AssertionError(f"launched {command}")


def test_an_output_dir_that_is_a_file_or_under_one_is_one_error_line(tmp_path, monkeypatch, capsys):
    """Before: a NotADirectoryError traceback from the first step's mkdir."""
    monkeypatch.setattr(train, "run_child", never_launched)
    existing = tmp_path / "existing"
    existing.write_text("")
    code, _, err = run_main(["--step", "1", "--output-dir", str(existing)], capsys)
    assert (code, error_lines(err)) == (2, [f"error: --output-dir {existing} is a file, not a folder"])
    code, _, err = run_main(["--step", "1", "--output-dir", str(existing / "out")], capsys)
    assert (code, error_lines(err)) == (2, [f"error: --output-dir {existing}/out: cannot make the folder (Not a "
                                            f"directory: {existing}/out)"])


def test_an_output_dir_that_cannot_be_made_is_one_error_line(tmp_path, monkeypatch, capsys):
    """Before: a PermissionError traceback from the first step's mkdir (as a read-only parent gives a user who is
    not root)."""
    monkeypatch.setattr(train, "run_child", never_launched)
    out = tmp_path / "read-only" / "out"
    real_mkdir = pathlib.Path.mkdir

    def mkdir(path, *args, **kwargs):
        if path == out or out in path.parents:
            raise PermissionError(13, "Permission denied", str(out))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "mkdir", mkdir)
    code, _, err = run_main(["--step", "1", "--output-dir", str(out)], capsys)
    assert (code, error_lines(err)) == (2, [f"error: --output-dir {out}: cannot make the folder (Permission denied: "
                                            f"{out})"])


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in a read-only folder")
def test_an_output_dir_in_a_read_only_folder_is_one_error_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(train, "run_child", never_launched)
    parent = tmp_path / "read-only"
    parent.mkdir(mode=0o500)
    code, _, err = run_main(["--step", "1", "--output-dir", str(parent / "out")], capsys)
    assert code == 2 and error_lines(err)[0].startswith(f"error: --output-dir {parent}/out: cannot make the folder (")


# ---------------------------------------------------------------------- KTO, ORPO and GSPO end to end
STAGE_ARGS = {"kto": "--max_steps 4 --per_device_train_batch_size 8 --per_device_eval_batch_size 16 --print_interval 1",
              "orpo": "--max_steps 4 --per_device_train_batch_size 8 --per_device_eval_batch_size 16 --eval_iters 1 "
                      "--print_interval 1",
              "gspo": "--max_steps 2 --per_device_generation_batch_size 2 --per_device_training_batch_size 16 "
                      "--eval_interval 0"}


@pytest.mark.e2e  # each through the launcher, with its closing evaluation: ~2-4 min on a busy 2-core CPU
@pytest.mark.parametrize("algorithm, step, actor", [("kto", 2, "kto-models/tiny"), ("orpo", 2, "orpo-models/tiny"),
                                                    ("gspo", 3, "step3-models/tiny/actor_ema")])
def test_kto_orpo_and_gspo_run_end_to_end_on_the_built_in_task(algorithm, step, actor, tmp_path):
    """Each with its defaults on the built-in task (KTO on the step-1 actor's answers judged by the checker, here
    a few; GSPO on the checker; ORPO from the base model, no step 1), a few steps, then the closing evaluation."""
    out, data = tmp_path / "out", f"--data_output_path {tmp_path / 'data'}"
    step1 = f"--max_steps 30 --per_device_train_batch_size 16 --learning_rate 3e-3 --print_interval 10 {data}"
    command = [sys.executable, "train.py", "--algorithm", algorithm, "--output-dir", str(out), "--step1-args", step1,
               f"--step{step}-args", f"{STAGE_ARGS[algorithm]} {data}"]
    command += ["--pair-prompts", "16", "--pair-samples", "4"] if algorithm == "kto" else []
    result = subprocess.run(command, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True,
                            text=True, timeout=1800)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ran = [line.split("(")[1].split(")")[0] for line in result.stdout.splitlines() if line.startswith("---- step")]
    assert ran == {"kto": ["sft", "pairs", "kto"], "orpo": ["orpo"], "gspo": ["sft", "rl"]}[algorithm]
    import json

    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(out / actor)  # the trained actor loads
    evaluation = json.loads((out / "evaluation.json").read_text())
    assert {"all", "add"} <= set(evaluation["finetune"]["sampled"]) and "all" in evaluation["baseline"]["greedy"]
    report = (out / "report.md").read_text()
    assert "| after (fine-tuned) | sampled |" in report
    # Each stage's curves and the skill scores, as PNG files beside the report; the evaluated actor's card has
    # its algorithm's tag and the evaluation's table.
    for stage in ran + ["skills"]:
        if stage != "pairs":  # the sampled pairs train nothing
            assert f"(report-{stage}.png)" in report and (out / f"report-{stage}.png").read_bytes()[:4] == b"\x89PNG"
    from huggingface_hub import ModelCard

    card = ModelCard.load(out / actor / "README.md")
    assert algorithm in card.data.tags and "## Evaluation" in card.text and "| after (fine-tuned) |" in card.text


def test_a_second_driver_leaves_a_running_steps_log_alone(tmp_path):
    """A step folder another run holds (its lock taken): train.py refuses in one line and the log stays whole."""
    from utils.runtime.paths import FolderLock

    step_dir = tmp_path / "out" / "actor-models" / "tiny"
    step_dir.mkdir(parents=True)
    (step_dir / "training.log").write_text("the running step's lines\n")
    lock = FolderLock(step_dir)
    assert lock.acquire()
    try:
        result = subprocess.run([sys.executable, "train.py", "--step", "1", "--no-eval", "--output-dir",
                                 str(tmp_path / "out")], cwd=Path(train.__file__).parent, capture_output=True,
                                text=True, timeout=300)
    finally:
        lock.release()
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "is in use by another run" in errors[0], result.stderr[-2000:]
    assert (step_dir / "training.log").read_text() == "the running step's lines\n"


@pytest.mark.parametrize("argv, refused", [
    ([], "the reward stage of --algorithm ppo"),
    (["--algorithm", "dpo"], "the dpo stage of --algorithm dpo"),
    (["--algorithm", "orpo"], "the orpo stage of --algorithm orpo"),
    (["--step", "1"], None),  # SFT alone
    (["--algorithm", "grpo", "--reward-fn", "builtin"], None),  # no stage on pairs
    (["--algorithm", "dpo", "--pair-judge", "builtin"], None),  # pairs judged from the actor's answers
    (["--step2-args", "--data_path pairs.jsonl"], None),  # step 2's own data, which its stage reads
])
def test_sft_data_without_pairs_is_refused_before_any_step_where_a_stage_needs_pairs(tmp_path, monkeypatch, argv,
                                                                                     refused):
    """A ShareGPT chat file has answers to imitate but no pairs: the reward model (or DPO, ORPO) would fail after
    step 1 had trained; train.py says so before."""
    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "chats.jsonl", ({"conversations": [{"from": "human", "value": f"What is {i} + 1?"},
                                                              {"from": "gpt", "value": f"{i + 1}"}]}
                                           for i in range(10)))
    if refused is None:
        assert commands("--data-path", "chats.jsonl", *argv)[0]
        return
    with pytest.raises(ConfigError) as err:
        commands("--data-path", "chats.jsonl", *argv)
    assert f"--data-path chats.jsonl has no preference pairs (a row with a chosen and a rejected answer) for {refused}" \
        in str(err.value)


def test_a_file_whose_answers_are_under_unknown_names_is_refused_naming_its_columns_and_flags(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "pairs.jsonl", ({"id": i, "prompt": f"What is {i} + 1?", "better": f"{i + 1}",
                                            "worse": f"{i + 2}"} for i in range(10)))
    with pytest.raises(ConfigError) as err:
        commands("--data-path", "pairs.jsonl")
    assert str(err.value).endswith("its rows' columns not read as a prompt or an answer: better, id, worse (name "
                                   "the answers' with --chosen-key and --rejected-key)")
    assert commands("--data-path", "pairs.jsonl", "--chosen-key", "better", "--rejected-key", "worse")[0]
    # Alpaca's columns were read (as the prompt and the answer): only the column that was not is named.
    write_jsonl(tmp_path / "alpaca.jsonl", ({"instruction": f"Add 1 to {i}.", "input": "", "output": f"{i + 1}",
                                             "text": f"Add 1 to {i}. {i + 1}"} for i in range(10)))
    with pytest.raises(ConfigError) as err:
        commands("--data-path", "alpaca.jsonl", "--algorithm", "dpo", "--pair-judge", "none")
    assert str(err.value).endswith("its rows' columns not read as a prompt or an answer: text (name the answers' "
                                   "with --chosen-key and --rejected-key)")


def test_a_stage_that_exits_0_without_saving_fails_the_run(tmp_path, monkeypatch, capsys):
    """Before: a step whose process ended with exit 0 before saving (a reward function calling os._exit(0)) passed
    as done, and the report and evaluation took an earlier model, or none, for this run's. The stage's own
    metrics.json, written last, is what says it finished; an earlier run's does not count."""
    out = tmp_path / "out"
    earlier = out / "actor-models" / "tiny"
    earlier.mkdir(parents=True)
    (earlier / "metrics.json").write_text("{}")
    os.utime(earlier / "metrics.json", (1, 1))  # an earlier run's
    launched = []
    monkeypatch.setattr(train, "run_child", lambda command, **kwargs: launched.append(command) or 0)
    code, _, err = run_main(["--step", "1", "--no-eval", "--output-dir", str(out)], capsys)
    assert len(launched) == 1 and code == 1
    assert error_lines(err) == [f"error: step 1 failed: it exited 0 but wrote no metrics.json in {earlier} (a stage "
                                f"writes it last: it stopped before saving); its log: {earlier}/training.log; re-run "
                                "this step alone with --step 1"]
    assert not (out / "report.md").exists()


def test_a_base_model_that_is_no_model_folder_is_refused_before_any_step(tmp_path, monkeypatch, capsys):
    """Before: --reward-model naming a file was refused when step 2 started, after step 1 had trained; an empty
    --actor-model was the working directory."""
    monkeypatch.setattr(train, "run_child", never_launched)
    afile = tmp_path / "afile"
    afile.write_text("")
    code, _, err = run_main(["--step", "1", "2", "--output-dir", str(tmp_path / "out"), "--reward-model", str(afile)],
                            capsys)
    assert (code, error_lines(err)) == (2, [f"error: --reward-model {afile} is not a model folder (no config.json in "
                                            "it)"])
    monkeypatch.chdir(tmp_path)
    code, _, err = run_main(["--step", "1", "--output-dir", str(tmp_path / "out"), "--actor-model", ""], capsys)
    assert (code, error_lines(err)) == (2, ["error: --actor-model '' is not a model folder (no config.json in it)"])


def test_a_failed_stage_over_an_earlier_model_keeps_its_log(tmp_path, monkeypatch, capsys):
    """Before: the failed run's log replaced the earlier model's training.log (its weights were kept). Now the
    run logs beside it, and its log becomes the model's only once it has saved."""
    out = tmp_path / "out"
    earlier = out / "actor-models" / "tiny"
    earlier.mkdir(parents=True)
    (earlier / "config.json").write_text("{}")
    (earlier / "training.log").write_text("the earlier run's log\n")

    def fails(command, stdout, **kwargs):
        stdout.write("error: the data is bad\n")
        return 2

    monkeypatch.setattr(train, "run_child", fails)
    code, _, err = run_main(["--step", "1", "--no-eval", "--output-dir", str(out)], capsys)
    assert code == 1 and error_lines(err)[0].startswith("error: step 1 failed: the data is bad")
    assert (earlier / "training.log").read_text() == "the earlier run's log\n"
    assert "error: the data is bad" in (earlier / "training.log.partial").read_text()

    def saves(command, stdout, **kwargs):
        stdout.write("saved\n")
        (earlier / "metrics.json").write_text("{}")
        return 0

    monkeypatch.setattr(train, "run_child", saves)
    code, _, err = run_main(["--step", "1", "--no-eval", "--output-dir", str(out)], capsys)
    assert code == 0, err
    assert "saved" in (earlier / "training.log").read_text() and not (earlier / "training.log.partial").exists()
