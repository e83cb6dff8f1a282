"""scripts/gpu_check.sh (the GPU check, run only where a CUDA GPU is) and scripts/stage_figures.py (its table of
tokens/s and peak GPU memory per stage): the script parses, every run it makes is a train.py command whose stages
accept their flags (built and parsed in process, as train.py --dry-run builds them), the runs cover the variants
the check is for, and the figures come from the stages' own history."""
import importlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import train
from scripts.stage_figures import figures, stage_dirs, table
from training.pipeline import plan, step_command
from utils.trainer.monitor import HISTORY

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def listed_runs():
    """{run name: its train.py arguments} as `gpu_check.sh --list` prints them."""
    result = subprocess.run(["bash", str(SCRIPT), "--list"], capture_output=True, text=True, check=True)
    return {line.split()[0]: shlex.split(line)[1:] for line in result.stdout.splitlines()}


def stage_args(argv):
    """[(stage name, parsed main.py flags)] of the stages a train.py call runs, each parsed by its main.py."""
    args = train.parse_args(argv)
    parsed = []
    for run in plan(args):
        if run.spec.step in args.step and run.spec.folder:  # not sample_pairs.py, a script of inference/
            command = step_command(args, run)  # bash <its run.sh> <main.py flags>
            module = importlib.import_module(f"training.{run.spec.folder}.main")
            parsed.append((run.name, module.parse_args(command[2:])))
    return parsed


def test_the_script_parses_and_answers_help_and_a_bad_argument():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    help_text = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True).stdout
    assert "--dry-run" in help_text and "WHEELS" in help_text
    bad = subprocess.run(["bash", str(SCRIPT), "--gpu"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("error: unknown argument '--gpu'")


def test_runs_chooses_the_runs_and_their_order_and_refuses_a_name_that_is_no_run():
    env = dict(os.environ, RUNS="dpo ppo-zero2")
    result = subprocess.run(["bash", str(SCRIPT), "--list"], capture_output=True, text=True, env=env, check=True)
    assert [line.split()[0] for line in result.stdout.splitlines()] == ["dpo", "ppo-zero2"]
    env["RUNS"] = "dpo zero9"
    bad = subprocess.run(["bash", str(SCRIPT), "--list"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and bad.stderr.startswith("error: RUNS names 'zero9'") and not bad.stdout


def test_every_run_is_a_train_py_command_whose_stages_take_its_flags_and_the_runs_cover_the_variants():
    runs = listed_runs()
    stages = {name: stage_args(argv) for name, argv in runs.items()}
    every = [(name, stage, parsed) for name, found in stages.items() for stage, parsed in found]
    assert {stage for _, stage, _ in every} == {"sft", "reward", "ppo", "rl", "dpo"}
    assert all(parsed.dtype == "bf16" for _, _, parsed in every)
    assert all("smollm2-135m" in argv for argv in runs.values())
    step3 = [(parsed.actor_zero_stage, parsed.enable_hybrid_engine) for _, stage, parsed in every
             if stage in ("ppo", "rl")]
    assert {(2, False), (2, True), (3, True)} <= set(step3)
    trained = [(getattr(parsed, "zero_stage", None), parsed.lora_dim, parsed.only_optimize_lora)
               for _, stage, parsed in every if stage == "sft"]
    assert (2, 16, True) in trained and (3, 0, False) in trained  # LoRA (the recipe's) and every weight
    assert any(stage == "rl" and parsed.advantage_estimator == "grpo" for _, stage, parsed in every)


def write_history(folder, lines):
    folder.mkdir(parents=True)
    (folder / HISTORY).write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_stage_figures_take_the_median_after_the_first_report_and_the_highest_peak(tmp_path):
    run = tmp_path / "ppo-zero2"
    write_history(run / "actor-models" / "m", [{"step": s, "prefix": "train", "tokens_per_s": v, "peak_memory_gib": m}
                                               for s, v, m in ((1, 10.0, 1.0), (2, 100.0, 3.0), (3, 300.0, 2.0),
                                                               (4, 200.0, 2.5))])
    write_history(run / "step3-models" / "m", [{"step": 1, "prefix": "ppo", "tokens_per_s": 50.0}])
    (tmp_path / "other").mkdir()
    os.symlink(run / "actor-models", tmp_path / "other" / "actor-models")  # another run's stage: not counted
    assert figures(run / "actor-models" / "m") == {"tokens_per_s": 200.0, "counts": "trained",
                                                   "peak_memory_gib": 3.0, "reports": 4}
    assert figures(run / "step3-models" / "m")["tokens_per_s"] == 50.0  # one report: that one
    assert stage_dirs(tmp_path / "other") == []
    lines = table([run]).splitlines()
    assert lines[2:] == ["| ppo-zero2 | actor-models/m | 200 trained | 3.00 GiB | 4 |",
                         "| ppo-zero2 | step3-models/m | 50 generated | - | 1 |"]


@pytest.mark.e2e  # six train.py --dry-run calls: ~1-3 min on a busy 2-core CPU
def test_the_dry_run_prints_every_runs_stage_commands():
    result = subprocess.run(["bash", str(SCRIPT), "--dry-run"], capture_output=True, text=True, cwd=ROOT,
                            env=dict(os.environ, PYTHON=sys.executable), timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    launched = [line for line in result.stdout.splitlines() if " deepspeed --num_gpus 1 " in line]
    assert len(launched) == 8  # ppo-zero2's three stages, then one for each other run
    assert sum("--enable_hybrid_engine" in line for line in launched) == 2
