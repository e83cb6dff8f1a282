"""Steps trained on data by its hub name and on a save_to_disk folder, their columns renamed by the data-columns
flags, each step a fresh process with `datasets` offline (HF_DATASETS_OFFLINE=1 on a temporary cache): step 1 on a
cached hub data set of questions and answers, step 2 (reward model) on HH-RLHF dialogues in which two final answers
are empty, skipped and counted."""
import json
import os
import subprocess
import sys
from pathlib import Path

import datasets

from tests.files import cache_hub_dataset, offline_env

ROOT = Path(__file__).resolve().parents[2]
QUICK = ["--max_steps", "2", "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "8",
         "--max_seq_len", "64", "--print_interval", "1"]


def run_step(folder, tmp_path, *flags):
    out = tmp_path / "out"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **offline_env(tmp_path / "hf" / "datasets"))
    result = subprocess.run([sys.executable, f"training/{folder}/main.py", "--output_dir", str(out),
                             "--data_output_path", str(tmp_path / "cache"), *QUICK, *flags],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (out / "model.safetensors").is_file()
    return json.loads((out / "metrics.json").read_text()), result.stdout


def test_step1_trains_on_a_cached_hub_data_set_by_name_with_its_columns_renamed(tmp_path):
    rows = {split: [{"question": f" Human: What is {i} + {k}? Assistant:", "answer": f" {i + k}"} for i in range(n)]
            for split, k, n in (("train", 1, 24), ("test", 2, 6))}
    cache_hub_dataset(tmp_path / "hf" / "datasets", "tests/sums", rows)
    metrics, _ = run_step("step1_supervised_finetuning", tmp_path, "--data_path", "tests/sums", "--data_split", "1",
                          "--prompt_key", "question", "--completion_key", "answer")
    assert {key: metrics[key] for key in ("train_rows_read", "train_rows_kept", "eval_rows_read", "eval_rows_kept")} \
        == {"train_rows_read": 24, "train_rows_kept": 24, "eval_rows_read": 6, "eval_rows_kept": 6}
    assert metrics["rows_skipped"] == {"train": {}, "eval": {}}


def test_step2_trains_on_a_save_to_disk_folder_of_hh_dialogues_skipping_the_empty_answers(tmp_path):
    def dialogues(n, empty_at=()):
        return [{"better": f"\n\nHuman: What is {i} + 1?\n\nAssistant:" + ("" if i in empty_at else f" {i + 1}"),
                 "worse": f"\n\nHuman: What is {i} + 1?\n\nAssistant: {i + 3}"} for i in range(n)]

    folder = tmp_path / "hh"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(dialogues(16, empty_at=(4, 9))),
                          "test": datasets.Dataset.from_list(dialogues(8))}).save_to_disk(folder)
    metrics, stdout = run_step("step2_reward_model_finetuning", tmp_path, "--data_path", str(folder), "--data_split",
                               "0,1", "--chosen_key", "better", "--rejected_key", "worse")
    assert "phase 2 train: 14 samples (skipped: 2 no answer)" in stdout
    assert (metrics["train_rows_read"], metrics["train_rows_kept"]) == (16, 14)
    assert metrics["rows_skipped"] == {"train": {"no answer": 2}, "eval": {}}
