"""Stopping before the step budget (utils/trainer/stopping.py): the rule itself, then step 1 and step 3 through
their real CLIs on the tiny model: early stopping on a flat eval loss, the time budget, a resumed run that stops
where it had stopped, and the report's row."""
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from processes import subprocess_env

from utils.runtime.errors import ConfigError
from utils.trainer import stopping
from utils.trainer.report import data_rows
from utils.trainer.stopping import Reserve, StopRule

REPO = Path(__file__).resolve().parents[2]
STEP1 = REPO / "training" / "step1_supervised_finetuning" / "main.py"
STEP3 = REPO / "training" / "step3_rlhf_finetuning" / "main.py"
STEP1_FLAGS = ["--data_split", "10,1000,1000", "--per_device_train_batch_size", "4", "--per_device_eval_batch_size",
               "8", "--max_seq_len", "64", "--num_train_epochs", "3", "--max_steps", "40", "--print_interval", "10"]


def run(command):
    result = subprocess.run(command, cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def test_patience_counts_evaluations_without_a_strictly_lower_loss():
    rule = StopRule(patience=2)
    for step, loss in ((2, 1.0), (4, 0.9), (6, 0.9), (8, 0.95)):
        assert rule.reason(step - 1) is None
        rule.observe(step, {"loss": loss})
    assert rule.reason(8) == ("stopped at step 8: the eval loss has not improved for 2 evaluations (best 0.9000 at "
                              "step 4; --early_stopping_patience 2)")
    assert rule.metrics()["stopped"]["step"] == 8
    assert StopRule(patience=0).metrics() == {}


def test_a_new_best_resets_the_count():
    rule = StopRule(patience=2)
    for step, loss in ((1, 1.0), (2, 1.1), (3, 0.5), (4, 0.6)):
        rule.observe(step, {"loss": loss})
    assert rule.reason(4) is None and rule.bad_evaluations == 1


def test_a_score_improves_upward():
    rule = StopRule(patience=2, metric="score")
    for step, score in ((2, 0.2), (4, 0.5), (6, 0.5), (8, 0.4)):
        rule.observe(step, {"loss": 1.0, "score": score})
    assert rule.reason(8) == ("stopped at step 8: the eval score has not improved for 2 evaluations, nor the eval "
                              "loss (lowest 1.0000) (best 0.5000 at step 4; --early_stopping_patience 2)")


def test_a_flat_score_goes_on_while_the_loss_falls_and_a_tie_is_won_by_the_lower_loss():
    """A task the model rarely solves yet: 4 questions of 64 at every evaluation while the loss falls (lcm, where
    the score alone stopped step 1 at step 50 and kept step 20's model); equal scores, the lower loss the better."""
    rule = StopRule(patience=3, metric="score")
    news = [rule.observe(step, {"loss": 2.0 / step, "score": 0.0625}) for step in (10, 20, 30, 40, 50)]
    assert news == [True] * 5 and rule.reason(50) is None and rule.best_step == 50
    assert not rule.observe(60, {"loss": 0.01, "score": 0.03})  # a lower score: not the best, though progress
    assert rule.bad_evaluations == 0 and rule.best_step == 50
    for step in (70, 80, 90):
        assert not rule.observe(step, {"loss": 0.5, "score": 0.0625})
    assert rule.reason(90).startswith("stopped at step 90: the eval score has not improved for 3 evaluations, nor "
                                      "the eval loss (lowest 0.0100)")
    resumed = StopRule(patience=3, metric="score", state=rule.state_dict())
    assert (resumed.best_loss, resumed.lowest_loss) == (0.04, 0.01)


def test_the_time_budget_counts_the_minutes_of_a_resumed_run(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(stopping.time, "monotonic", lambda: clock[0])
    rule = StopRule(max_minutes=2)
    clock[0] += 90
    assert rule.reason(3) is None
    state = rule.state_dict()
    assert state["trained_s"] == 90 and state["stopped"] is None
    resumed = StopRule(max_minutes=2, state=state)  # a new life: its clock starts at 90 s
    clock[0] += 29
    assert resumed.reason(4) is None
    clock[0] += 2
    assert resumed.reason(5) == "stopped at step 5: --max_train_minutes 2 is spent"
    assert StopRule(max_minutes=2, state=resumed.state_dict()).stopped == {"step": 5, "reason": "--max_train_minutes "
                                                                                                 "2 is spent"}


def test_idle_rounds_count_rounds_in_a_row_that_trained_nothing():
    rule = StopRule(idle_rounds=3)
    for step, trained_rows in enumerate((0, 0, 32, 0, 0), start=1):
        rule.observe_round(trained_rows)
        assert rule.reason(step) is None
    resumed = StopRule(idle_rounds=3, state=rule.state_dict())  # the count travels in checkpoints
    resumed.observe_round(0)
    assert resumed.reason(6) == ("stopped at step 6: 3 rounds in a row found no group whose answers' scores differ: "
                                 "every prompt is answered alike, nothing is left to train on "
                                 "(--stop_after_idle_rounds 3)")
    never = StopRule()
    for _ in range(5):
        never.observe_round(0)
    assert never.reason(5) is None


def test_a_deadline_stops_when_the_time_left_is_what_the_step_still_needs(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(stopping.time, "time", lambda: clock[0])
    rule = StopRule(deadline=1100.0)
    rule.reserve_s = 60.0
    clock[0] = 1039.0
    assert rule.reason(3) is None
    clock[0] = 1040.0
    assert rule.reason(4) == ("stopped at step 4: --deadline is 60 s away, and saving and evaluating after training "
                              "need about 60 s")
    assert StopRule().reason(4) is None  # no deadline, no stop


def test_the_reserve_is_setup_longest_round_one_evaluation_and_the_answers_at_the_evaluations_rate():
    reserve = Reserve(setup_s=30.0, answers=1000)
    reserve.observe_round(5.0, 2.0, 32)  # before any evaluation: the rollouts' rate
    assert reserve.seconds() == pytest.approx(30 + 5 + 1000 * 2 / 32)
    reserve.observe_evaluation(10.0, 100)
    reserve.observe_round(4.0, 4.0, 32)  # a shorter round: the longest is kept
    assert reserve.seconds() == pytest.approx(30 + 5 + 10 + 1000 * 0.1)


def test_where_the_greedy_answers_are_known_each_decoding_is_reserved_at_its_own_rate():
    """Greedy answers that loop to the token limit take longer than sampled ones: a closing evaluation of 800
    sampled and 200 greedy answers is reserved at each decoding's rate, the evaluation's other seconds (scoring)
    shared out by each decoding's generation time; without the split, at the mean rate."""
    reserve = Reserve(setup_s=30.0, answers=1000, greedy_answers=200)
    reserve.observe_round(5.0, 2.0, 32)
    # 50 sampled answers in 2 s, 50 greedy in 6 s of generation; 10 s in all (2 s of it scoring)
    reserve.observe_evaluation(10.0, 100, {"sampled": (2.0, 50), "greedy": (6.0, 50)})
    sampled, greedy = 10.0 * 2 / 8 / 50, 10.0 * 6 / 8 / 50
    assert reserve.seconds() == pytest.approx(30 + 5 + 10 + 800 * sampled + 200 * greedy)
    assert reserve.seconds() < 30 + 5 + 10 + 1000 * 0.1  # the mean rate: half the answers greedy
    mean = Reserve(setup_s=30.0, answers=1000)
    mean.observe_round(5.0, 2.0, 32)
    mean.observe_evaluation(10.0, 100, {"sampled": (2.0, 50), "greedy": (6.0, 50)})
    assert mean.seconds() == pytest.approx(30 + 5 + 10 + 1000 * 0.1)


def test_the_report_says_where_and_why_a_step_stopped():
    metrics = {"total_steps": 40, "stopped": {"step": 6, "reason": "--max_train_minutes 1 is spent"}}
    assert data_rows("1 SFT", metrics) == [("1 SFT", "optimizer steps, stopped early",
                                            "6 of 40: --max_train_minutes 1 is spent")]


def test_patience_without_evaluations_is_refused():
    from training.step1_supervised_finetuning.main import parse_args

    with pytest.raises(ConfigError, match="^--early_stopping_patience needs --eval_interval > 0"):
        parse_args(["--output_dir", "x", "--early_stopping_patience", "2"])


def test_step1_stops_when_its_eval_loss_is_flat(tmp_path):
    """At a learning rate of 1e-30 no weight moves, so the eval loss at steps 2, 4, 6 is the same: the second
    evaluation without improvement (step 6) ends the run, which saves its model and says so."""
    out = tmp_path / "out"
    log = run([sys.executable, str(STEP1), *STEP1_FLAGS, "--learning_rate", "1e-30", "--eval_interval", "2",
               "--eval_iters", "2", "--early_stopping_patience", "2", "--output_dir", str(out),
               "--data_output_path", str(tmp_path / "data")])
    assert "stopped at step 6: the eval loss has not improved for 2 evaluations" in log
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["optimizer_steps"] == 6 and metrics["total_steps"] == 40
    assert metrics["stopped"]["step"] == 6
    assert (out / "model.safetensors").is_file()


def test_a_score_to_stop_on_needs_patience_and_data_with_a_checker(tmp_path):
    from training.step1_supervised_finetuning.main import parse_args, validation

    with pytest.raises(ConfigError, match="^--early_stopping_metric score needs --early_stopping_patience > 0"):
        parse_args(["--output_dir", "x", "--early_stopping_metric", "score", "--eval_interval", "2"])
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"prompt": " Human: hi Assistant:", "chosen": " hello", "rejected": " go"}) + "\n")
    args = parse_args(["--output_dir", "x", "--early_stopping_metric", "score", "--eval_interval", "2",
                       "--early_stopping_patience", "2", "--data_path", str(pairs)])
    with pytest.raises(ConfigError, match=f"^--early_stopping_metric score needs data with a checker .* "
                                          f"--data_path {pairs} has none"):
        validation(args)
    assert parse_args(["--output_dir", "x"]).max_new_tokens is None  # the loss: no answers to measure
    from inference.evaluation import validation_set

    assert validation_set(["reasoning_gym:chain_sum?max_digits=1"])[1] is not None  # one spec: its verifier
    assert validation_set(["reasoning_gym:chain_sum?max_digits=1", "reasoning_gym:spell_backward"]) is None


def test_step1_stops_when_its_checker_score_on_unseen_questions_is_flat(tmp_path):
    """--early_stopping_metric score: greedy answers to --eval_prompts questions of the built-in task's eval split,
    scored by its checker at each evaluation; at a learning rate of 1e-30 the score never improves."""
    from inference.evaluation import heldout_set, validation_set

    questions, _ = validation_set(["builtin"])
    assert questions and not set(questions) & set(heldout_set(["builtin"])[0])  # never the closing evaluation's
    out = tmp_path / "out"
    log = run([sys.executable, str(STEP1), *STEP1_FLAGS, "--learning_rate", "1e-30", "--eval_interval", "2",
               "--eval_iters", "1", "--early_stopping_patience", "2", "--early_stopping_metric", "score",
               "--eval_prompts", "16", "--output_dir", str(out), "--data_output_path", str(tmp_path / "data")])
    assert "stopped at step 6: the eval score has not improved for 2 evaluations" in log
    metrics = json.loads((out / "metrics.json").read_text())
    assert 0 <= metrics["score_before"] <= 1 and metrics["score_after"] == metrics["score_before"]
    assert metrics["optimizer_steps"] == 6


def test_step1_time_budget_stops_and_a_resumed_run_trains_no_further(tmp_path):
    out = tmp_path / "out"
    command = [sys.executable, str(STEP1), *STEP1_FLAGS, "--max_train_minutes", "1e-6", "--save_steps", "20",
               "--output_dir", str(out), "--data_output_path", str(tmp_path / "data")]
    log = run(command)
    assert "stopped at step 1: --max_train_minutes 1e-06 is spent" in log
    assert (out / "checkpoints" / "step1").is_dir()  # the stop's own checkpoint, though 1 is no multiple of 20
    weights = (out / "model.safetensors").read_bytes()
    run([*command, "--resume", "--max_train_minutes", "1e-6"])
    assert json.loads((out / "metrics.json").read_text())["optimizer_steps"] == 1
    assert (out / "model.safetensors").read_bytes() == weights


def run_step3_grpo(actor_dir, tmp_path, score_body, *flags):
    """Step 3's GRPO (groups of two, at most 10 prompt batches) with the reward function `def score(prompts,
    answers): return <score_body>` into tmp_path/out; its output."""
    reward_file = tmp_path / "reward.py"
    reward_file.write_text(f"def score(prompts, answers):\n    return {score_body}\n")
    return run([sys.executable, str(STEP3), "--actor_model_name_or_path", str(actor_dir), "--advantage_estimator",
                "grpo", "--reward_fn", f"{reward_file}:score", "--data_split", "1000,1000,5",
                "--per_device_generation_batch_size", "2", "--num_samples_per_prompt", "2",
                "--per_device_training_batch_size", "4", "--max_prompt_seq_len", "32", "--max_answer_seq_len", "8",
                "--max_steps", "10", "--dtype", "fp32", *flags, "--output_dir", str(tmp_path / "out"),
                "--data_output_path", str(tmp_path / "data")])


def test_step3_time_budget_ends_after_one_round_with_its_evaluation(step3_model_dirs, tmp_path):
    out = tmp_path / "out"
    log = run_step3_grpo(step3_model_dirs[0], tmp_path, "[len(answer) % 3 for answer in answers]",
                         "--eval_interval", "5", "--eval_prompts", "4", "--max_train_minutes", "1e-6")
    assert "stopped at step 1: --max_train_minutes 1e-06 is spent" in log
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["stopped"]["step"] == 1 and metrics["actor_optimizer_steps"] >= 1
    assert "heldout_sampled_end" in metrics  # the closing evaluation of the held-out prompts still runs
    assert (out / "actor" / "model.safetensors").is_file()


def test_step3_deadline_ends_training_when_the_time_left_is_what_saving_and_evaluating_need(step3_model_dirs,
                                                                                              tmp_path):
    """A deadline 10 minutes away but 10^6 answers to reserve: the first round's check stops the run, which still
    evaluates, saves and says why."""
    out = tmp_path / "out"
    log = run_step3_grpo(step3_model_dirs[0], tmp_path, "[len(answer) % 3 for answer in answers]",
                         "--eval_interval", "5", "--eval_prompts", "4", "--deadline", str(time.time() + 600),
                         "--reserve_answers", "1000000")
    assert "stopped at step 1: --deadline is" in log and "saving and evaluating after training need about" in log
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["stopped"]["step"] == 1 and "heldout_sampled_end" in metrics
    assert (out / "actor" / "model.safetensors").is_file()


def test_step3_stops_when_no_round_finds_answers_that_score_differently(step3_model_dirs, tmp_path):
    """A reward function that scores every answer 1: every group is dropped (dynamic sampling), no round trains,
    and after two such rounds the run stops, says why and saves the actor it started from."""
    from safetensors.torch import load_file

    actor_dir, out = step3_model_dirs[0], tmp_path / "out"
    log = run_step3_grpo(actor_dir, tmp_path, "[1.0 for answer in answers]", "--filter_zero_variance",
                         "--max_generation_batches", "2", "--stop_after_idle_rounds", "2")
    assert "stopped at step 2: 2 rounds in a row found no group whose answers' scores differ" in log
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["stopped"]["step"] == 2 and metrics["actor_optimizer_steps"] == 0
    start, saved = load_file(actor_dir / "model.safetensors"), load_file(out / "actor" / "model.safetensors")
    assert all((saved[name] == start[name]).all() for name in start)  # nothing trained


def test_step1_saves_its_best_evaluation_with_load_best_model_at_end(tmp_path):
    """Train answers that the eval split contradicts: the eval loss rises from the first evaluation on, so with
    --load_best_model_at_end step 1 saves the weights of step 2, its best evaluation: the same, to the bit, as a
    run of 2 steps (a constant rate, so both take the same steps), and says so in metrics.json and the log."""
    from safetensors.torch import load_file

    data = tmp_path / "conflict"
    data.mkdir()
    for split, answer, count in (("train", "yes yes yes", 64), ("eval", "no no no", 16)):
        (data / f"{split}.jsonl").write_text("".join(
            json.dumps({"prompt": f" Human: Is {i} odd? Assistant:", "chosen": f" {answer}"}) + "\n"
            for i in range(count)))
    flags = ["--data_path", str(data), "--data_split", "1,0,0", "--per_device_train_batch_size", "4",
             "--per_device_eval_batch_size", "8", "--max_seq_len", "32", "--learning_rate", "1e-2",
             "--lr_scheduler_type", "constant", "--num_warmup_steps", "0", "--num_train_epochs", "10",
             "--print_interval", "2", "--data_output_path", str(tmp_path / "data")]
    best, short = tmp_path / "best", tmp_path / "short"
    log = run([sys.executable, str(STEP1), *flags, "--max_steps", "8", "--eval_interval", "2",
               "--load_best_model_at_end", "--output_dir", str(best)])
    run([sys.executable, str(STEP1), *flags, "--max_steps", "2", "--output_dir", str(short)])
    metrics = json.loads((best / "metrics.json").read_text())
    assert metrics["optimizer_steps"] == 8
    assert metrics["saved_best"]["step"] == 2 and metrics["saved_best"]["last_step"] == 8
    kept, last = map(float, re.search(r"--load_best_model_at_end: the model of step 2 is saved \(eval loss "
                                      r"([\d.]+), against ([\d.]+) at step 8\)", log).groups())
    assert kept < last and metrics["loss_after"] == metrics["saved_best"]["value"] == pytest.approx(kept, abs=1e-4)
    saved, two_steps = load_file(best / "model.safetensors"), load_file(short / "model.safetensors")
    assert all(torch.equal(saved[name], two_steps[name]) for name in two_steps)
    assert ("1 SFT", "model saved: its best evaluation (--load_best_model_at_end)",
            f"step 2 of 8 (eval loss {metrics['loss_after']:.3f})") in data_rows("1 SFT", metrics)


def test_load_best_model_at_end_needs_evaluations():
    from training.step1_supervised_finetuning.main import parse_args

    with pytest.raises(ConfigError, match="^--load_best_model_at_end needs --eval_interval > 0"):
        parse_args(["--output_dir", "x", "--load_best_model_at_end"])
    from training.step3_rlhf_finetuning.arguments import parse_args as step3_args

    actor = ["--actor_model_name_or_path", "tiny", "--output_dir", "x"]
    with pytest.raises(ConfigError, match="^--load_best_model_at_end needs --eval_interval > 0"):
        step3_args([*actor, "--load_best_model_at_end"])
