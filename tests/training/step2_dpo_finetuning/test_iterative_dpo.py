"""Iterative DPO end to end through train.py (`--algorithm dpo --pair-judge FN --pair-rounds 2`): round 2 samples
its pairs from round 1's DPO actor and trains DPO from it; the report has a row per round."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
JUDGE = '''def longer(prompts, answers):
    return [float(len(answer)) for answer in answers]
'''


@pytest.mark.e2e  # two rounds of sampling and DPO through the launcher: ~1-2 min on a quiet 2-core CPU
def test_round_2_samples_from_round_1s_actor_and_trains_from_it(tmp_path):
    out = tmp_path / "out"
    (tmp_path / "judge.py").write_text(JUDGE)  # answers that differ in length make a pair
    step1_flags = f"--max_steps 40 --per_device_train_batch_size 16 --max_seq_len 64 --learning_rate 3e-3 " \
                  f"--data_output_path {tmp_path / 'data'}"  # answers short enough to end within step 2's lengths
    dpo_flags = "--max_steps 2 --per_device_train_batch_size 4 --per_device_eval_batch_size 8 --print_interval 1 " \
                "--num_warmup_steps 0"
    result = subprocess.run(
        [sys.executable, "train.py", "--algorithm", "dpo", "--pair-judge", f"{tmp_path / 'judge.py'}:longer",
         "--pair-rounds", "2", "--pair-prompts", "8", "--pair-samples", "3", "--no-eval", "--output-dir", str(out),
         "--step1-args", step1_flags, "--step2-args", dpo_flags],
        cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    round_1, final = out / "dpo-models" / "tiny-round1", out / "dpo-models" / "tiny"
    for actor in (round_1, final):
        assert (actor / "model.safetensors").is_file() and (actor / "metrics.json").is_file()
    pairs_1, pairs_2 = out / "sampled-pairs" / "tiny", out / "sampled-pairs" / "tiny-round2"
    assert json.loads((pairs_1 / "meta.json").read_text())["settings"]["model"] == str(out / "actor-models" / "tiny")
    assert json.loads((pairs_2 / "meta.json").read_text())["settings"]["model"] == str(round_1)
    final_log = (final / "training.log").read_text()
    assert f"--model_name_or_path {round_1} " in final_log and f"--data_path {pairs_2} " in final_log
    report = (out / "report.md").read_text()
    assert "| 2 sampled pairs (round 2) |" in report and "| 2 DPO (round 2) |" in report
