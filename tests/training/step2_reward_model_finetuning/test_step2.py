"""Tests of step 2 (training/step2_reward_model_finetuning/main.py): the eval accuracy on hand-worked scores,
the data edge cases of reward pairs, bad data ending in one `error:` line, and end-to-end runs through the real
launch scripts (one process; two processes under ZeRO-3) whose saved model reproduces the reported accuracy."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.files import write_jsonl
from utils.data.data_utils import create_prompt_dataset, get_raw_dataset
from utils.runtime.errors import ConfigError, DataError

REPO = Path(__file__).resolve().parents[3]
STEP_DIR = REPO / "training" / "step2_reward_model_finetuning"
PROMPT = " Human: What is 7 + 12? Assistant:"


def good_rows(n):
    return [{"prompt": f" Human: What is {i} + 1? Assistant:", "chosen": f" {i + 1}", "rejected": f" {i + 3}"}
            for i in range(n)]


def run(command, timeout):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


# --------------------------------------------------------------------------- evaluation arithmetic


class FakeEngine:
    """Stands in for the DeepSpeed engine: returns fixed end scores, batch by batch."""

    def __init__(self, batches):
        self.batches, self.calls, self.training = iter(batches), 0, True

    def __call__(self, **batch):
        self.calls += 1
        chosen, rejected = next(self.batches)
        return {"chosen_end_scores": torch.tensor(chosen), "rejected_end_scores": torch.tensor(rejected)}

    def eval(self):
        self.training = False

    def train(self):
        self.training = True


def test_evaluate_reward_hand_worked():
    from training.step2_reward_model_finetuning.main import evaluate_reward

    # pairs: (1, 0) right, (0, 0) a tie counts as wrong, (3, 1) right, (-1, 2) wrong
    engine = FakeEngine([([1.0, 0.0], [0.0, 0.0]), ([3.0, -1.0], [1.0, 2.0]), ([9.0], [-9.0])])
    loader = [{"input_ids": torch.zeros(1)}] * 3
    scores = evaluate_reward(engine, loader, torch.device("cpu"), eval_iters=2)
    assert engine.calls == 2 and engine.training  # stopped after eval_iters batches, back in training mode
    assert scores["accuracy"] == pytest.approx(2 / 4)
    assert scores["chosen_score"] == pytest.approx(3 / 4)
    assert scores["rejected_score"] == pytest.approx(3 / 4)
    assert scores["score_diff"] == pytest.approx(0.0)
    # the Bradley-Terry loss of the four pairs, what early stopping and --load_best_model_at_end watch
    assert scores["loss"] == pytest.approx(sum(math.log1p(math.exp(-d)) for d in (1.0, 0.0, 2.0, -3.0)) / 4)


def test_output_dir_is_required():
    from training.step2_reward_model_finetuning.main import parse_args

    with pytest.raises(ConfigError, match="--output_dir"):
        parse_args(["--model_name_or_path", "tiny"])


# --------------------------------------------------------------------------- data edge cases


def test_identical_and_too_long_pairs_are_skipped_and_counted(tmp_path, tiny_tokenizer, capsys):
    rows = good_rows(8)
    rows[2]["rejected"] = rows[2]["chosen"]                                  # no preference
    rows[5]["rejected"] = " " + " ".join(["very long rambling answer"] * 20)  # does not fit in 64 tokens
    write_jsonl(tmp_path / "data" / "train.json", rows)
    write_jsonl(tmp_path / "data" / "eval.json", good_rows(3))
    train, evaluation = create_prompt_dataset([str(tmp_path / "data")], "0,10,0", str(tmp_path / "cache"), 2,
                                              1234, tiny_tokenizer, 64)
    assert len(train) == 6 and len(evaluation) == 3
    assert all(sample["chosen_ids"] != sample["rejected_ids"] for sample in train.samples)
    assert all(len(sample["rejected_ids"]) <= 64 for sample in train.samples)
    out = capsys.readouterr().out
    assert "phase 2 train: 6 samples (skipped: 1 identical chosen and rejected, 1 longer than --max_seq_len)" in out


@pytest.mark.parametrize("broken, message", [
    ({"rejected": ""}, "row 1 (line 2): field 'rejected' is empty"),
    ({"chosen": ""}, "row 1 (line 2): field 'chosen' is empty"),
    ({"chosen": None}, "row 1 (line 2): missing field 'chosen'"),
    ({"prompt": 7}, "row 1 (line 2): field 'prompt' must be a string, got int"),
])
def test_bad_rows_are_refused_naming_file_row_and_field(tmp_path, broken, message):
    rows = good_rows(4)
    rows[1].update(broken)
    rows[1] = {k: v for k, v in rows[1].items() if v is not None}
    write_jsonl(tmp_path / "data" / "train.json", rows)
    write_jsonl(tmp_path / "data" / "eval.json", good_rows(2))
    with pytest.raises(DataError) as err:
        get_raw_dataset(str(tmp_path / "data"), 1234)
    assert str(tmp_path / "data" / "train.json") in str(err.value) and message in str(err.value)


def test_bad_data_file_exits_2_with_one_error_line_and_no_output(tmp_path):
    rows = good_rows(6)
    rows[3]["chosen"] = ""
    data = write_jsonl(tmp_path / "pairs.jsonl", rows)
    out = tmp_path / "rm"
    result = run([sys.executable, str(STEP_DIR / "main.py"), "--data_path", str(data), "--output_dir", str(out),
                  "--data_output_path", str(tmp_path / "cache"), "--max_steps", "1"], timeout=300)
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {data}: row 3 (line 4): field 'chosen' is empty"]
    assert "Traceback" not in result.stderr
    assert not out.exists()


# --------------------------------------------------------------------------- end to end, through run.sh


def check_saved_model(out, eval_pairs):
    """The saved folder loads as a reward model and reproduces the accuracy and mean scores that the run
    reported on its first `eval_pairs` eval pairs (the same pairs evaluate_reward saw with --eval_iters)."""
    from utils.model.reward_model import load_reward_model, score_answers, score_sequences

    metrics = json.loads((out / "metrics.json").read_text())
    model, tokenizer = load_reward_model(str(out))
    _, evaluation = create_prompt_dataset(["builtin"], "2,4,4", str(out.parent / "cache"), 2, 1234, tokenizer, 64)
    pairs = [evaluation[i] for i in range(eval_pairs)]
    chosen = score_sequences(model, [p["chosen_ids"] for p in pairs], tokenizer.pad_token_id)
    rejected = score_sequences(model, [p["rejected_ids"] for p in pairs], tokenizer.pad_token_id)
    accuracy = sum(c > r for c, r in zip(chosen, rejected)) / eval_pairs
    assert accuracy == pytest.approx(metrics["accuracy_after"], abs=1.01 / eval_pairs)
    assert sum(chosen) / eval_pairs == pytest.approx(metrics["chosen_score_after"], abs=1e-4)
    assert sum(rejected) / eval_pairs == pytest.approx(metrics["rejected_score_after"], abs=1e-4)
    scores = score_answers(model, tokenizer, [PROMPT, PROMPT], [" 19", " 21"])
    assert all(torch.isfinite(torch.tensor(scores)))
    return metrics


def launch(tmp_path, deployment, zero_stage, max_steps, timeout):
    out = tmp_path / "rm"
    result = run(["bash", str(STEP_DIR / "training_scripts" / deployment / "run.sh"), "--output_dir", str(out),
                  "--zero_stage", str(zero_stage), "--model_name_or_path", "tiny", "--max_steps", str(max_steps), "--per_device_train_batch_size", "32", "--max_seq_len",
                  "64", "--eval_iters", "4", "--per_device_eval_batch_size", "16", "--print_interval", "10",
                  # fp32: the saved folder, loaded in fp32, must reproduce the run's own scores to 1e-4 (a bf16 run,
                  # auto on a CPU with native bf16, scores in bf16 arithmetic: ~1e-3 apart).
                  "--dtype", "fp32", "--data_output_path", str(tmp_path / "cache")], timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "eval after training: accuracy=" in result.stdout
    return out


def test_single_gpu_run_learns_and_saves(tmp_path):
    """40 steps from the untrained tiny model: accuracy on 64 eval pairs goes from ~0.45 to ~0.83 (measured).
    ~45 s on a quiet 2-core machine, so it stays in the default run."""
    out = launch(tmp_path, "single_gpu", 0, 40, timeout=900)
    metrics = check_saved_model(out, eval_pairs=64)
    assert metrics["optimizer_steps"] == 40
    assert metrics["accuracy_after"] > metrics["accuracy_before"] + 0.15
    assert metrics["score_diff_after"] > metrics["score_diff_before"]


@pytest.mark.e2e
def test_two_processes_under_zero3_learn_and_save_whole(tmp_path):
    """30 steps of 2 x 32 pairs under ZeRO-3: accuracy on 2 x 64 eval pairs ~0.46 -> ~0.72 (measured); the
    save gathers the partitioned weights, so the folder reproduces the run's own evaluation. ~75 s: e2e."""
    out = launch(tmp_path, "single_node", 3, 30, timeout=1200)
    metrics = check_saved_model(out, eval_pairs=128)
    assert metrics["optimizer_steps"] == 30
    assert metrics["accuracy_after"] > metrics["accuracy_before"] + 0.15
