"""Tests of train.py's stage table: which stages each algorithm runs, what each starts from, the flags every stage
gets from the pipeline, the closing evaluation's models, and the interpreter the run scripts use. Commands are
built in process, or printed by `train.py --dry-run` (no launcher runs);
tests/training/step1_supervised_finetuning/test_step1.py runs the real thing."""
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import train
from tests.files import write_jsonl
from utils.runtime.errors import ConfigError, DataError


def commands(*argv):
    """{stage: its run.sh command} and the evaluation command of a `train.py` call."""
    args = train.parse_args(["--output-dir", "out", *argv])
    dirs = train.output_dirs(args)
    stages = [name for name in train.pipeline(args) if train.stage_spec(name).step in args.step]
    return {stage: train.step_command(args, stage, dirs) for stage in stages}, \
        train.evaluation_command(args, stages, dirs)


def write_rows(folder, *names, answered=True):
    """Small JSON-lines data files `names` in `folder`: prompts with completions, or prompts alone."""
    for name in names:
        write_jsonl(folder / name, ({"prompt": f"What is {i} + 1?", **({"completion": f" {i + 1}"} if answered else {})}
                                    for i in range(10)))


def script_folder(command):
    return Path(command[1]).parents[2].name


@pytest.mark.parametrize("argv, expected", [
    ([], ["sft", "reward", "ppo"]),
    (["--algorithm", "dpo"], ["sft", "dpo"]),
    (["--algorithm", "grpo"], ["sft", "reward", "rl"]),
    (["--algorithm", "rloo", "--reward-fn", "builtin"], ["sft", "rl"]),
    (["--algorithm", "dpo", "--step", "2"], ["dpo"]),
    (["--step", "1", "3"], ["sft", "ppo"]),
])
def test_each_algorithm_runs_its_stages_in_order(argv, expected):
    stage_commands, _ = commands(*argv)
    assert list(stage_commands) == expected
    for stage, command in stage_commands.items():
        assert script_folder(command) == train.STAGES[stage].folder


def test_each_stage_starts_from_the_outputs_before_it():
    stage_commands, evaluation = commands("--algorithm", "dpo")
    assert stage_commands["dpo"][2:5] == ["out/dpo-models/tiny", "0", "out/actor-models/tiny"]
    assert evaluation[evaluation.index("--model_name_or_path_baseline") + 1] == "out/actor-models/tiny"
    assert evaluation[evaluation.index("--model_name_or_path_finetune") + 1] == "out/dpo-models/tiny"
    assert "--reward_model" not in evaluation

    stage_commands, evaluation = commands("--algorithm", "grpo", "--reward-fn", "builtin")
    rl = stage_commands["rl"]
    assert rl[2:4] == ["out/actor-models/tiny", ""]  # no reward model: the run script gets no critic
    assert rl[rl.index("--advantage_estimator") + 1] == "grpo" and rl[rl.index("--reward_fn") + 1] == "builtin"
    assert evaluation[evaluation.index("--model_name_or_path_finetune") + 1] == "out/step3-models/tiny/actor_ema"

    stage_commands, evaluation = commands()
    assert evaluation[evaluation.index("--model_name_or_path_finetune") + 1] == "out/step3-models/tiny/actor"
    assert stage_commands["ppo"][2:4] == ["out/actor-models/tiny", "out/reward-models/tiny"]
    assert evaluation[evaluation.index("--reward_model") + 1] == "out/reward-models/tiny"


def test_step_3_with_ema_is_evaluated_on_its_moving_average():
    _, evaluation = commands("--step3-args=--enable_ema --ema_beta 0.99")
    assert evaluation[evaluation.index("--model_name_or_path_finetune") + 1] == "out/step3-models/tiny/actor_ema"
    _, evaluation = commands("--algorithm", "dpo", "--step2-args=--beta 0.2")
    assert evaluation[evaluation.index("--model_name_or_path_finetune") + 1] == "out/dpo-models/tiny"


def test_step_one_alone_is_evaluated_against_the_base_model():
    _, evaluation = commands("--step", "1")
    assert evaluation[evaluation.index("--model_name_or_path_baseline") + 1] == "tiny"
    assert commands("--step", "2")[1] is None  # a reward model alone: no actor to compare


def test_data_without_reference_answers_skips_step_1_and_rl_starts_from_the_base_model(capsys):
    """reasoning-gym tasks that any valid solution answers (graph_color) give prompts only: nothing to imitate."""
    spec = "reasoning_gym:graph_color?size=40"
    stage_commands, evaluation = commands("--algorithm", "grpo", "--reward-fn", "reasoning_gym", "--data-path", spec)
    assert list(stage_commands) == ["rl"]
    assert stage_commands["rl"][2:4] == ["tiny", ""]
    assert evaluation[evaluation.index("--model_name_or_path_baseline") + 1] == "tiny"
    # the tiny recipe keeps a moving average of the actor, which the evaluation compares
    assert evaluation[evaluation.index("--model_name_or_path_finetune") + 1] == "out/step3-models/tiny/actor_ema"
    mixed, _ = commands("--algorithm", "grpo", "--reward-fn", "builtin", "--data-path", spec, "builtin")
    assert list(mixed) == ["sft", "rl"]  # another data set has answers: step 1 trains on those
    with pytest.raises(SystemExit):
        train.main(["--output-dir", "out", "--algorithm", "grpo", "--reward-fn", "reasoning_gym", "--data-path",
                    spec, "--step", "1", "--dry-run"])
    out, err = capsys.readouterr()
    assert "step 1 skipped: reasoning_gym:graph_color?size=40 has no reference answers" in out
    assert err.strip() == "error: --step 1: nothing to run for --algorithm grpo"


def test_a_local_file_of_prompts_alone_skips_step_1_and_one_with_answers_does_not(tmp_path):
    questions, answered = tmp_path / "questions.jsonl", tmp_path / "answered.jsonl"
    write_rows(tmp_path, questions.name, answered=False)
    write_rows(tmp_path, answered.name)
    stage_commands, _ = commands("--algorithm", "rloo", "--reward-fn", "builtin", "--data-path", str(questions))
    assert list(stage_commands) == ["rl"]
    stage_commands, _ = commands("--algorithm", "rloo", "--reward-fn", "builtin", "--data-path", str(answered))
    assert list(stage_commands) == ["sft", "rl"]


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
    assert evaluation[evaluation.index("--reward_fn") + 1] == spec
    for data in (["--data-path", "builtin"], []):  # the built-in checker (or a verifier) is the yardstick there
        _, evaluation = commands("--algorithm", "grpo", "--reward-fn", spec, *data)
        assert "--reward_fn" not in evaluation


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
    assert stage_commands["sft"][3] == "3" and stage_commands["ppo"][4:6] == ["3", "3"]
    assert "--data_path a.jsonl b.jsonl" in shlex.join(evaluation)
    plain, _ = commands()
    assert all("--data_path" not in command and "--seed" not in command for command in plain.values())


def test_per_model_zero_stages_override_the_pipeline_one():
    stage_commands, _ = commands("--zero-stage", "2", "--reward-zero-stage", "3")
    assert stage_commands["sft"][3] == "2" and stage_commands["reward"][3] == "3"
    assert stage_commands["ppo"][4:6] == ["2", "3"]


def test_critic_free_stage_takes_step_3_recipe_then_its_own():
    stage_commands, _ = commands("--algorithm", "grpo", "--reward-fn", "builtin")
    from training.recipes import recipe_flags

    text = shlex.join(stage_commands["rl"])
    assert shlex.join(recipe_flags("tiny", 3)) in text
    assert text.index(shlex.join(recipe_flags("tiny", 3))) < text.index("--enable_tensorboard")


def test_a_reward_function_needs_a_critic_free_algorithm():
    with pytest.raises(ConfigError, match="--reward-fn needs a critic-free --algorithm"):
        train.parse_args(["--reward-fn", "builtin"])


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
    assert pairs[:2] == [sys.executable, str(Path(train.__file__).parent / "inference" / "sample_pairs.py")]
    text = shlex.join(pairs)
    recipe = shlex.join(recipe_flags("tiny", "pairs"))
    assert recipe and f"{recipe} --model_name_or_path out/actor-models/tiny --reward_fn builtin --output_dir " \
        "out/sampled-pairs/tiny --samples_per_prompt 6" in text  # --pair-samples after the recipe: it wins
    assert text.endswith("--resume --data_path a.jsonl --seed 7")  # the prompts: part 2 of the pipeline's data
    step2_text = shlex.join(stage_commands[step2])
    assert step2_text.endswith(f"--data_path out/sampled-pairs/tiny --data_split {PAIRS_DATA_SPLIT}")  # wins
    for stage in set(stage_commands) - {"pairs", step2}:
        assert "sampled-pairs" not in shlex.join(stage_commands[stage])
    assert "sampled-pairs" not in shlex.join(evaluation)
    with_args, _ = commands("--algorithm", algorithm, "--pair-judge", "builtin", "--step2-args", "--data_split 1,1")
    assert shlex.join(with_args[step2]).endswith("--data_split 1,1")  # the user's step-2 flags still win


def test_pair_rounds_sample_each_round_from_the_round_before_and_the_last_round_is_evaluated():
    from utils.data.sampled_pairs import PAIRS_DATA_SPLIT

    stage_commands, evaluation = commands("--algorithm", "dpo", "--pair-judge", "builtin", "--pair-rounds", "3")
    assert list(stage_commands) == ["sft", "pairs", "dpo", "pairs@2", "dpo@2", "pairs@3", "dpo@3"]

    def flag(stage, name):
        command = stage_commands[stage]
        return command[command.index(name) + 1]

    assert [(flag(stage, "--model_name_or_path"), flag(stage, "--output_dir"))
            for stage in ("pairs", "pairs@2", "pairs@3")] == [
        ("out/actor-models/tiny", "out/sampled-pairs/tiny"),
        ("out/dpo-models/tiny-round1", "out/sampled-pairs/tiny-round2"),
        ("out/dpo-models/tiny-round2", "out/sampled-pairs/tiny-round3")]
    assert [stage_commands[stage][2:5] for stage in ("dpo", "dpo@2", "dpo@3")] == [  # output, ZeRO stage, start
        ["out/dpo-models/tiny-round1", "0", "out/actor-models/tiny"],
        ["out/dpo-models/tiny-round2", "0", "out/dpo-models/tiny-round1"],
        ["out/dpo-models/tiny", "0", "out/dpo-models/tiny-round2"]]
    from training.recipes import recipe_flags

    recipe = shlex.join(recipe_flags("tiny", "dpo") + recipe_flags("tiny", "dpo_pairs"))  # the second wins
    for stage, pairs in (("dpo", "tiny"), ("dpo@2", "tiny-round2"), ("dpo@3", "tiny-round3")):
        text = shlex.join(stage_commands[stage])
        assert recipe_flags("tiny", "dpo_pairs") and recipe in text
        assert text.endswith(f"--data_path out/sampled-pairs/{pairs} --data_split {PAIRS_DATA_SPLIT}")
        assert "--ref_model_name_or_path" not in text  # each round's reference: the actor it starts from
    assert evaluation[evaluation.index("--model_name_or_path_baseline") + 1] == "out/actor-models/tiny"
    assert evaluation[evaluation.index("--model_name_or_path_finetune") + 1] == "out/dpo-models/tiny"
    step_2, _ = commands("--algorithm", "dpo", "--pair-judge", "builtin", "--pair-rounds", "2", "--step", "2")
    assert list(step_2) == ["pairs", "dpo", "pairs@2", "dpo@2"]  # every round is step 2


def test_sampled_pairs_come_before_step_2_when_step_1_cannot_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_rows(tmp_path, "questions.jsonl", answered=False)
    stage_commands, _ = commands("--algorithm", "dpo", "--pair-judge", "builtin", "--data-path", "questions.jsonl")
    assert list(stage_commands) == ["pairs", "dpo"]
    pairs = stage_commands["pairs"]
    assert pairs[pairs.index("--model_name_or_path") + 1] == "tiny"  # the base model's own answers


def test_dry_run_shows_the_sampled_pairs_between_step_1_and_step_2(tmp_path):
    result = subprocess.run([sys.executable, "train.py", "--dry-run", "--algorithm", "dpo", "--pair-judge", "builtin",
                             "--output-dir", str(tmp_path / "out")], cwd=Path(train.__file__).parent,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [("step1_supervised_finetuning/main.py" in line, "sample_pairs.py" in line, "step2_dpo" in line,
             "prompt_eval.py" in line) for line in lines] == [(True, False, False, False), (False, True, False, False),
                                   (False, False, True, False), (False, False, False, True)]
    assert not (tmp_path / "out").exists()  # nothing ran


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
                            cwd=Path(train.__file__).parent, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "wrong python" not in result.stderr
    assert result.stdout.startswith("OMP_NUM_THREADS="), result.stdout  # the probe ran
    assert "deepspeed --num_gpus 1" in result.stdout


def test_smollm2_on_reasoning_gym_data_takes_its_data_recipe_in_every_stage_and_the_evaluation():
    spec = "reasoning_gym:chain_sum?max_digits=1"
    stage_commands, evaluation = commands("--actor-model", "smollm2-135m", "--data-path", spec, "--algorithm",
                                          "grpo", "--reward-fn", "reasoning_gym")
    assert list(stage_commands) == ["sft", "rl"]

    def last(command, flag):  # argparse keeps a flag's last value
        return command[len(command) - 1 - command[::-1].index(flag) + 1]

    assert last(stage_commands["sft"], "--max_seq_len") == "auto"
    rl = stage_commands["rl"]
    assert last(rl, "--max_answer_seq_len") == last(rl, "--max_prompt_seq_len") == "auto"
    assert int(last(rl, "--num_samples_per_prompt")) > 1 and int(last(rl, "--eval_interval")) > 0
    assert last(evaluation, "--max_new_tokens") == "auto" and last(evaluation, "--data_path") == spec
    plain, _ = commands("--actor-model", "smollm2-135m")  # the built-in task: the model's recipe alone
    assert last(plain["sft"], "--max_seq_len") == "64"
