"""Step 3 end to end through its real launch scripts (the `deepspeed` launcher, one and two processes), on the
tiny step-1 and step-2 folders of the session fixture `step3_model_dirs`, and its one-line errors for swapped
model folders. Runs over a minute are marked `e2e` (deselected by default: `pytest -m e2e`)."""
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from processes import subprocess_env

REPO = Path(__file__).resolve().parents[3]
STEP3 = REPO / "training" / "step3_rlhf_finetuning"
SMALL_FLAGS = ["--max_steps", "2", "--per_device_generation_batch_size", "4", "--per_device_training_batch_size", "2",
               "--max_prompt_seq_len", "32", "--max_answer_seq_len", "8", "--num_warmup_steps", "0"]


def run_step3(deployment, model_dirs, actor_stage, critic_stage, out_dir, *flags, timeout=600):
    actor_dir, critic_dir = model_dirs
    command = ["bash", str(STEP3 / "training_scripts" / deployment / "run.sh"),
               "--actor_model_name_or_path", str(actor_dir),
               *(["--critic_model_name_or_path", str(critic_dir)] if critic_dir else []),
               "--actor_zero_stage", str(actor_stage), "--critic_zero_stage", str(critic_stage),
               "--output_dir", str(out_dir), *SMALL_FLAGS,
               "--data_output_path", str(out_dir.parent / "data_files"), *flags]
    result = subprocess.run(command, cwd=REPO, env=subprocess_env(), capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def max_abs_difference(model_a, model_b):
    state_b = model_b.state_dict()
    return max((value - state_b[name]).abs().max().item() for name, value in model_a.state_dict().items())


def check_outputs(out_dir, model_dirs, tokenizer, with_ema=False):
    """actor/ (and actor_ema/) load as causal LMs that training moved, critic/ as a reward model, and metrics.json
    holds finite numbers for the requested two steps."""
    from transformers import AutoModelForCausalLM

    from utils.model.reward_model import RewardModel

    start = AutoModelForCausalLM.from_pretrained(model_dirs[0]).eval()
    actor = AutoModelForCausalLM.from_pretrained(out_dir / "actor").eval()
    assert not any("lora" in name for name in actor.state_dict())  # saved fused
    assert 0 < max_abs_difference(actor, start) < 1.0
    critic = RewardModel.from_pretrained(out_dir / "critic", tokenizer).eval()
    start_critic = RewardModel.from_pretrained(model_dirs[1], tokenizer).eval()
    assert not torch.equal(critic.v_head.weight, start_critic.v_head.weight)
    ids = torch.tensor([[1, 30, 31, 32, tokenizer.eos_token_id]])
    with torch.no_grad():
        assert torch.isfinite(actor(input_ids=ids).logits).all()
        assert torch.isfinite(critic.forward_value(ids, torch.ones_like(ids))[1]).all()
    assert (out_dir / "actor_ema").is_dir() == with_ema
    if with_ema:
        ema = AutoModelForCausalLM.from_pretrained(out_dir / "actor_ema").eval()
        # Between the start and the actor: closer to the start (beta = 0.992) but not equal to it.
        assert 0 < max_abs_difference(ema, start) < max_abs_difference(actor, start)
    metrics = json.loads((out_dir / "metrics.json").read_text())
    assert metrics["steps"] == 2
    for key in ("score_start", "score_end", "reward_start", "reward_end", "kl_end", "answer_length_end",
                "eos_fraction_end", "wall_time_s"):
        assert isinstance(metrics[key], (int, float)) and math.isfinite(metrics[key]), key
    assert 1 <= metrics["answer_length_end"] <= 8
    # The prompts read and kept, and the step budget (utils/trainer/engine.py step_budget), as steps 1 and 2 write.
    assert 0 < metrics["train_rows_kept"] <= metrics["train_rows_read"] and metrics["total_steps"] == 2
    # Each learning-rate schedule is as long as the optimizer steps its model took.
    assert metrics["actor_optimizer_steps"] == metrics["actor_scheduled_steps"]
    assert metrics["critic_optimizer_steps"] == metrics["critic_scheduled_steps"]
    return metrics


def test_single_gpu_run_with_ema_unsupervised_loss_and_adaptive_kl(step3_model_dirs, tiny_tokenizer, tmp_path):
    out = tmp_path / "out"
    result = run_step3("single_gpu", step3_model_dirs, 0, 0, out, "--enable_ema", "--unsupervised_dataset_name",
                       "builtin", "--adaptive_kl_target", "0.5", "--adaptive_kl_horizon", "100", "--ppo_epochs", "2")
    assert "actor: DeepSpeedEngine, ZeRO-0" in result.stdout
    metrics = check_outputs(out, step3_model_dirs, tiny_tokenizer, with_ema=True)
    # 2 rounds x 2 epochs x 2 minibatches: the critic steps 8 times; the actor 16 (a PPO and an LM step each).
    assert (metrics["critic_optimizer_steps"], metrics["actor_optimizer_steps"]) == (8, 16)
    steps = [line for line in result.stdout.splitlines() if re.search(r"step \d/2\b", line)]
    assert len(steps) == 2 and all("unsup_loss=" in line for line in steps)
    # The adaptive controller moved the coefficient off its start value (--kl_coef 0.1) after the first round.
    kl_coefs = [float(re.search(r"kl_coef=(\S+)", line).group(1)) for line in steps]
    assert kl_coefs[0] != 0.1 and kl_coefs[1] != kl_coefs[0]


@pytest.mark.e2e
def test_single_node_two_processes_zero2(step3_model_dirs, tiny_tokenizer, tmp_path):
    out = tmp_path / "out"
    result = run_step3("single_node", step3_model_dirs, 2, 2, out)
    assert "rollouts" in result.stdout and "x 2 rollouts" in result.stdout  # two processes
    assert "actor: DeepSpeedEngine, ZeRO-2" in result.stdout
    check_outputs(out, step3_model_dirs, tiny_tokenizer)


@pytest.mark.e2e
def test_single_node_two_processes_zero3_hybrid_engine_lora_ema(step3_model_dirs, tiny_tokenizer, tmp_path):
    out = tmp_path / "out"
    result = run_step3("single_node", step3_model_dirs, 3, 3, out, "--enable_hybrid_engine", "--enable_ema",
                       "--actor_lora_dim", "100", "--only_optimize_lora")
    assert "x 2 rollouts" in result.stdout
    assert "actor: DeepSpeedHybridEngine, ZeRO-3" in result.stdout
    check_outputs(out, step3_model_dirs, tiny_tokenizer, with_ema=True)


def check_critic_free_outputs(out_dir, actor_dir):
    """actor/ alone (no critic/), moved by training; held-out evaluations in metrics.json."""
    from transformers import AutoModelForCausalLM

    assert sorted(p.name for p in out_dir.iterdir() if p.is_dir()) == ["actor"]
    start = AutoModelForCausalLM.from_pretrained(actor_dir).eval()
    actor = AutoModelForCausalLM.from_pretrained(out_dir / "actor").eval()
    assert 0 < max_abs_difference(actor, start) < 1.0
    metrics = json.loads((out_dir / "metrics.json").read_text())
    assert metrics["steps"] == 2 and math.isfinite(metrics["heldout_sampled_end"])


def length_reward(tmp_path):
    """A reward function of the user's: a random actor's answers all get the same score from the built-in
    checker, so nothing would be learned from it."""
    reward_file = tmp_path / "length_reward.py"
    reward_file.write_text("def score(prompts, answers):\n    return [len(answer) % 3 for answer in answers]\n")
    return f"{reward_file}:score"


@pytest.mark.e2e
def test_single_node_two_processes_zero2_grpo_with_a_reward_function(step3_model_dirs, tmp_path):
    out = tmp_path / "out"
    result = run_step3("single_node", (step3_model_dirs[0], ""), 2, 2, out, "--advantage_estimator", "grpo",
                       "--num_samples_per_prompt", "2", "--reward_fn", length_reward(tmp_path), "--eval_interval", "1",
                       "--eval_prompts", "4", "--use_kl_loss", "--per_device_training_batch_size", "4")
    assert "PPO (grpo)" in result.stdout and "8 x 2 rollouts" in result.stdout
    assert "critic: ZeRO" not in result.stdout and "reward: frozen" not in result.stdout  # neither built
    assert len(re.findall(r"eval at step \d", result.stdout)) == 3  # before, after step 1 and after step 2
    check_critic_free_outputs(out, step3_model_dirs[0])


@pytest.mark.e2e
def test_single_node_two_processes_zero3_lora_reinforce_pp_dynamic_sampling(step3_model_dirs, tmp_path):
    """Dynamic sampling over two ZeRO-3 processes: every row's forward pass runs on both (they gather the weights
    together), the rows kept may differ, and each round trains the rows the process with the fewest has."""
    out = tmp_path / "out"
    result = run_step3("single_node", (step3_model_dirs[0], ""), 3, 3, out, "--advantage_estimator", "reinforce_pp",
                       "--reward_fn", length_reward(tmp_path), "--actor_lora_dim", "8", "--only_optimize_lora",
                       "--eval_interval", "2", "--eval_prompts", "4", "--num_samples_per_prompt", "2",
                       "--filter_zero_variance", "--max_generation_batches", "3")
    assert "actor: DeepSpeedEngine, ZeRO-3" in result.stdout
    drawn = [float(value) for value in re.findall(r"drawn_batches=([0-9.]+)", result.stdout)]
    assert drawn and all(1 <= value <= 3 for value in drawn)
    check_critic_free_outputs(out, step3_model_dirs[0])


@pytest.mark.parametrize("swap, message", [
    ("actor", "is a reward model (step 2 output)"),
    ("critic", "is not a reward model (its config.json"),
])
def test_swapped_model_folders_end_in_one_error_line_and_exit_2(step3_model_dirs, tmp_path, swap, message):
    actor_dir, critic_dir = step3_model_dirs
    actor, critic = (critic_dir, critic_dir) if swap == "actor" else (actor_dir, actor_dir)
    result = subprocess.run([sys.executable, str(STEP3 / "main.py"), "--actor_model_name_or_path", str(actor),
                             "--critic_model_name_or_path", str(critic), "--output_dir", str(tmp_path / "out")],
                            cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_resolve_step_models_checks_each_folders_kind(step3_model_dirs):
    from training.step3_rlhf_finetuning.main import parse_args, resolve_step_models
    from utils.runtime.errors import ConfigError

    actor_dir, critic_dir = map(str, step3_model_dirs)

    def args(actor, critic):
        return parse_args(["--actor_model_name_or_path", actor, "--critic_model_name_or_path", critic,
                           "--output_dir", "unused"])

    assert resolve_step_models(args(actor_dir, critic_dir)) == (actor_dir, critic_dir)
    with pytest.raises(ConfigError, match="is a reward model"):
        resolve_step_models(args(critic_dir, critic_dir))
    with pytest.raises(ConfigError, match="is not a reward model"):
        resolve_step_models(args(actor_dir, actor_dir))


def test_only_optimize_lora_is_accepted_with_an_actor_or_critic_lora_dim():
    from training.step3_rlhf_finetuning.main import parse_args
    from utils.runtime.errors import ConfigError

    base = ["--actor_model_name_or_path", "a", "--critic_model_name_or_path", "b", "--output_dir", "unused"]
    assert parse_args(base + ["--actor_lora_dim", "4", "--only_optimize_lora"]).only_optimize_lora
    assert parse_args(base + ["--critic_lora_dim", "4", "--only_optimize_lora"]).only_optimize_lora
    with pytest.raises(ConfigError, match="--actor_lora_dim or --critic_lora_dim"):
        parse_args(base + ["--only_optimize_lora"])


@pytest.mark.parametrize("extra, expected", [
    ({}, (8, 8)),
    ({"unsupervised_dataset_name": "builtin"}, (16, 8)),
    ({"unsupervised_dataset_name": "builtin", "gradient_accumulation_steps": 4}, (4, 2)),
    ({"critic_warmup_steps": 1, "gradient_accumulation_steps": 2}, (2, 4)),
    ({"generation_batches": 2, "ppo_epochs": 1}, (4, 4)),
    ({"gradient_accumulation_steps": 3}, (2, 2)),
    ({"num_samples_per_prompt": 4}, (32, 32)),
])
def test_planned_optimizer_steps(extra, expected):
    """(actor, critic) schedule lengths of 2 prompt batches of 4 rows, minibatches of 2, 2 PPO epochs."""
    from training.step3_rlhf_finetuning.main import parse_args, planned_optimizer_steps

    args = parse_args(["--actor_model_name_or_path", "a", "--critic_model_name_or_path", "c", "--output_dir", "o",
                       "--per_device_generation_batch_size", "4", "--per_device_training_batch_size", "2",
                       "--ppo_epochs", "2"])
    for key, value in extra.items():
        setattr(args, key, value)
    assert planned_optimizer_steps(args, total_steps=2) == expected
