"""Step 1 end to end through train.py and the launch scripts, and its dry-run commands (its answers to bad input
are in tests/test_bad_inputs.py)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
QUICK = "--max_steps 12 --per_device_train_batch_size 16 --per_device_eval_batch_size 32 --max_seq_len 64 " \
        "--print_interval 4 --learning_rate 2e-3"


def run(command, **kwargs):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, **kwargs)


def train_step1(tmp_path, deployment, zero_stage):
    out = tmp_path / "out"
    result = run([sys.executable, "train.py", "--step", "1", "--deployment-type", deployment,
                  "--actor-zero-stage", str(zero_stage), "--output-dir", str(out), "--no-eval",
                  "--step1-args", f"{QUICK} --data_output_path {tmp_path / 'data'}"])
    actor = out / "actor-models" / "tiny"
    assert result.returncode == 0, result.stdout[-3000:] + (actor / "training.log").read_text()[-3000:]
    return actor, result


def assert_trained_actor(actor):
    metrics = json.loads((actor / "metrics.json").read_text())
    assert metrics["perplexity_after"] < metrics["perplexity_before"] / 2
    assert (actor / "model.safetensors").is_file() and (actor / "tokenizer.json").is_file()
    settings = json.loads((actor / "training_settings.json").read_text())  # the evaluation tools' lengths
    assert settings["step"] == 1 and settings["max_seq_len"] == 64
    assert "training.log" in os.listdir(actor)
    answer = run([sys.executable, "chat.py", "--path", str(actor), "--prompt", "What is 3 + 4?", "--greedy",
                  "--max_new_tokens", "8"])
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.count("\n") == 1  # one answer line (a 12-step model may well answer with EOS at once)


def test_step1_one_process_through_train_py(tmp_path):
    actor, result = train_step1(tmp_path, "single_gpu", 0)
    assert "step 1 done" in result.stdout
    assert "OMP_NUM_THREADS=1" in (actor / "training.log").read_text()  # the caller's setting is kept
    assert_trained_actor(actor)


@pytest.mark.e2e  # a minute on 2 cores; two processes stay in the default run through tests/utils/runtime/test_ds_utils.py
def test_step1_two_processes_zero2_through_train_py(tmp_path):
    actor, _ = train_step1(tmp_path, "single_node", 2)
    assert "2 process(es)" in (actor / "training.log").read_text()
    assert_trained_actor(actor)


@pytest.mark.e2e
def test_step1_two_processes_zero3_through_train_py(tmp_path):
    actor, _ = train_step1(tmp_path, "single_node", 3)
    assert "ZeRO-3, 2 process(es)" in (actor / "training.log").read_text()
    assert_trained_actor(actor)


def test_dry_run_prints_the_launcher_commands_of_each_deployment():
    commands = {}
    for deployment in ("single_gpu", "single_node", "multi_node"):
        result = run([sys.executable, "train.py", "--dry-run", "--pair-judge", "none", "--deployment-type", deployment,
                      "--actor-model", "facebook/opt-1.3b", "--reward-model", "facebook/opt-350m",
                      "--hostfile", "/etc/hosts.ds"])
        assert result.returncode == 0, result.stderr
        commands[deployment] = result.stdout.splitlines()
    single_gpu, single_node, multi_node = commands["single_gpu"], commands["single_node"], commands["multi_node"]
    assert len(single_gpu) == 4  # three steps, then the evaluation
    assert "deepspeed --num_gpus 1" in single_gpu[0] and "--zero_stage 0" in single_gpu[0]
    assert "--num_gpus" in single_node[0] and "--zero_stage 2" in single_node[0]
    assert "--hostfile /etc/hosts.ds" in multi_node[0] and "--num_gpus" not in multi_node[0]
    assert "--model_name_or_path facebook/opt-1.3b" in single_gpu[0]
    assert "--output_dir output/actor-models/opt-1.3b" in single_gpu[0]
    assert "--model_name_or_path facebook/opt-350m" in single_gpu[1]
    assert "--output_dir output/reward-models/opt-350m" in single_gpu[1]
    assert ("--actor_model_name_or_path output/actor-models/opt-1.3b "
            "--critic_model_name_or_path output/reward-models/opt-350m") in single_gpu[2]
    assert "--enable_hybrid_engine" in single_gpu[2]  # DeepSpeed-Chat's recipe for real models
    assert "--model_name_or_path_finetune output/step3-models/opt-1.3b/actor" in single_gpu[3]
    for line in single_gpu[:3]:
        assert line.startswith("OMP_NUM_THREADS=")


def test_reward_model_starts_from_the_step1_actor_when_both_steps_share_a_base_model():
    """InstructGPT's choice: with one base model for actor and reward model, step 2 starts from the SFT weights
    (which know the task); --no-reward-from-sft starts it from the base model."""
    def step2_line(*flags):
        result = run([sys.executable, "train.py", "--dry-run", "--pair-judge", "none", "--step", "1", "2",
                      "--actor-model", "tiny", "--reward-model", "tiny", *flags])
        assert result.returncode == 0, result.stderr
        return result.stdout.splitlines()[1]

    assert "--model_name_or_path output/actor-models/tiny " in step2_line()
    assert "--output_dir output/reward-models/tiny " in step2_line()
    assert "--model_name_or_path tiny " in step2_line("--no-reward-from-sft")


def test_launch_scripts_parse():
    for script in ROOT.glob("training/*/training_scripts/*/run.sh"):
        assert run(["bash", "-n", str(script)]).returncode == 0, script
