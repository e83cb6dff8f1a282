"""What a step says of its data and its length: the steps an epoch caps (utils/trainer/engine.py step_budget, said
by utils/trainer/loop.py step_engine) and the rows each split read and kept, in its metrics.json."""
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.files import write_jsonl
from utils.trainer.engine import count_training_steps, step_budget

ROOT = Path(__file__).resolve().parents[3]


def test_step_budget_by_hand_and_the_warning_when_epochs_cap_max_steps():
    # 10 batches an epoch, 3 accumulated per optimizer step: ceil(10 / 3) = 4 steps an epoch, 8 in 2 epochs.
    budget, warning = step_budget(10, 3, 2, max_steps=20)
    assert budget == {"steps_asked": 20, "epochs_asked": 2, "steps_per_epoch": 4, "total_steps": 8}
    assert warning == ("WARNING: 20 steps asked, 2 epochs of the data give only 8 (4 an epoch); raise "
                       "--num_train_epochs to train them all")
    assert step_budget(10, 3, 2, max_steps=5) == ({"steps_asked": 5, "epochs_asked": 2, "steps_per_epoch": 4,
                                                   "total_steps": 5}, None)
    assert step_budget(10, 3, 2, max_steps=8)[1] is None  # exactly what the epochs give
    assert step_budget(10, 3, 2)[0]["total_steps"] == 8 == count_training_steps(10, 3, 2)


def test_step1_says_the_epoch_cap_and_writes_rows_read_and_kept_to_metrics_json(tmp_path):
    def row(split, i):  # one answer in ten too long for --max_seq_len 40 with its EOS
        words = 30 if i % 10 == 9 else 1 + i % 3
        return {"prompt": f" Human: {split} question {i}? Assistant:", "chosen": " " + " ".join(["ok"] * words)}

    data = tmp_path / "data"
    write_jsonl(data / "train.jsonl", [row("train", i) for i in range(40)])
    no_answer = {"prompt": " Human: no answer? Assistant:"}
    write_jsonl(data / "eval.jsonl", [row("eval", i) for i in range(10)] + [no_answer])
    out = tmp_path / "out"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    result = subprocess.run(
        [sys.executable, "training/step1_supervised_finetuning/main.py", "--data_path", str(data), "--data_split",
         "1", "--data_output_path", str(tmp_path / "cache"), "--max_seq_len", "40", "--per_device_train_batch_size",
         "8", "--num_train_epochs", "2", "--max_steps", "50", "--output_dir", str(out), "--print_interval", "5"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # 36 train samples kept, 8 a batch: 5 batches (steps) an epoch, 10 in 2 epochs
    assert "WARNING: 50 steps asked, 2 epochs of the data give only 10 (5 an epoch)" in result.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert {key: metrics[key] for key in ("train_rows_read", "train_rows_kept", "eval_rows_read", "eval_rows_kept",
                                          "eval_rows_scored")} == \
        {"train_rows_read": 40, "train_rows_kept": 36, "eval_rows_read": 11, "eval_rows_kept": 9,
         "eval_rows_scored": 9}
    assert metrics["rows_skipped"] == {"train": {"longer than --max_seq_len with its EOS": 4},
                                       "eval": {"longer than --max_seq_len with its EOS": 1, "no answer": 1}}
    assert {key: metrics[key] for key in ("steps_asked", "epochs_asked", "steps_per_epoch", "total_steps")} == \
        {"steps_asked": 50, "epochs_asked": 2, "steps_per_epoch": 5, "total_steps": 10}
    assert metrics["optimizer_steps"] == 10
