"""Step 3 with --load_best_model_at_end, run as a user runs it (a subprocess, the tiny step-1 actor, the built-in
task): evaluations on the validation split, and the actor saved is the one of the best of them."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from processes import subprocess_env
from safetensors.torch import load_file

from training.step3_rlhf_finetuning.arguments import parse_args
from utils.runtime.errors import ConfigError

REPO = Path(__file__).resolve().parents[3]
STEP3 = REPO / "training" / "step3_rlhf_finetuning" / "main.py"


def run_grpo(actor_dir, tmp_path, name, *flags):
    """GRPO on groups of two answers scored by a reward function of the user's, at a rate that moves the tiny
    actor, a constant schedule (the weights at step N do not depend on --max_steps); its output folder and log."""
    reward_file = tmp_path / "reward.py"
    reward_file.write_text("def score(prompts, answers):\n    return [len(answer) % 3 for answer in answers]\n")
    out = tmp_path / name
    result = subprocess.run(
        [sys.executable, str(STEP3), "--actor_model_name_or_path", str(actor_dir), "--advantage_estimator", "grpo",
         "--reward_fn", f"{reward_file}:score", "--data_split", "1000,1000,40", "--per_device_generation_batch_size",
         "2", "--num_samples_per_prompt", "2", "--per_device_training_batch_size", "4", "--max_prompt_seq_len", "32",
         "--max_answer_seq_len", "8", "--dtype", "fp32", "--actor_learning_rate", "1e-2", "--lr_scheduler_type",
         "constant", "--num_warmup_steps", "0", *flags, "--output_dir", str(out),
         "--data_output_path", str(tmp_path / "data")],
        cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out, result.stdout


def evaluations(out):
    """{step: mean of the sampled and greedy scores} of the run's evaluations (its history.jsonl)."""
    rows = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    scores = {}
    for row in rows:
        if row.get("prefix") in ("eval_sampled", "eval_greedy"):
            scores.setdefault(row["step"], []).append(row["all"])
    return {step: sum(pair) / 2 for step, pair in scores.items()}


def test_the_actor_saved_is_the_one_of_its_best_validation_score(step3_model_dirs, tmp_path):
    actor_dir = step3_model_dirs[0]
    out, log = run_grpo(actor_dir, tmp_path, "best", "--max_steps", "8", "--eval_interval", "2", "--eval_prompts",
                        "6", "--load_best_model_at_end")
    assert "eval at step 0 (6 validation prompts)" in log
    scores = evaluations(out)
    assert sorted(scores) == [0, 2, 4, 6, 8]
    best_step = max(scores, key=lambda step: (scores[step], -step))  # the first of the highest
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["best_step"] == best_step and metrics["actor_optimizer_steps"] > 0
    assert abs(metrics["best_validation_score"] - scores[best_step]) < 1e-6
    assert "heldout_sampled_end" not in metrics  # the evaluations scored validation prompts, and say so
    assert (metrics["validation_sampled_end"] + metrics["validation_greedy_end"]) / 2 == \
        pytest.approx(scores[best_step])  # "end": the actor saved, at its best step
    saved = load_file(out / "actor" / "model.safetensors")
    if best_step == 0:
        expected = load_file(actor_dir / "model.safetensors")
    else:  # the same run stopped at the best step (nothing in it depends on --max_steps)
        expected = load_file(run_grpo(actor_dir, tmp_path, "short", "--max_steps", str(best_step))[0]
                             / "actor" / "model.safetensors")
    assert all(torch.equal(saved[name], expected[name]) for name in expected)
    if best_step != 8:
        assert f"the actor of step {best_step} is saved" in log


def test_the_flag_needs_evaluations_and_no_moving_average():
    base = ["--actor_model_name_or_path", "tiny", "--reward_fn", "builtin", "--advantage_estimator", "grpo",
            "--num_samples_per_prompt", "2", "--output_dir", "unused", "--load_best_model_at_end"]
    with pytest.raises(ConfigError, match="needs --eval_interval"):
        parse_args(base)
    with pytest.raises(ConfigError, match="not the moving average's"):
        parse_args([*base, "--eval_interval", "2", "--enable_ema"])
    assert parse_args([*base, "--eval_interval", "2"]).load_best_model_at_end
