"""ORPO through DPO's stage (`--loss_type orpo`, utils/rl/orpo.py): from the base model, with no reference loaded,
a run from the CLI learns the chosen answers and the preference at once and saves a model that reproduces its own
evaluation."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.files import saved_pair_logps

REPO = Path(__file__).resolve().parents[3]
STEP_DIR = REPO / "training" / "step2_dpo_finetuning"


def test_orpo_trains_the_base_model_without_a_reference(tiny_tokenizer, tmp_path):
    """40 steps of 16 pairs from the untrained built-in `tiny` model, through the CLI in a fresh process."""
    out = tmp_path / "orpo"
    command = [sys.executable, str(STEP_DIR / "main.py"), "--model_name_or_path", "tiny", "--loss_type", "orpo",
               "--beta", "1.0", "--output_dir", str(out), "--data_split", "1000,100,1000", "--data_output_path",
               str(tmp_path / "cache"), "--per_device_train_batch_size", "16", "--per_device_eval_batch_size", "16",
               "--max_seq_len", "64", "--learning_rate", "3e-3", "--num_warmup_steps", "0", "--max_steps", "40",
               "--print_interval", "10", "--eval_iters", "2", "--dtype", "fp32"]
    from processes import subprocess_env

    result = subprocess.run(command, cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "reference" not in result.stdout  # no reference loaded, none precomputed
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["optimizer_steps"] == 40
    # Measured: the NLL of the chosen answers 5.85 -> 2.93 nats per token, the log-odds margin 0.01 -> 1.28.
    assert metrics["nll_after"] < metrics["nll_before"] - 1.5
    assert metrics["margins_after"] > metrics["margins_before"] + 0.5
    assert metrics["loss_after"] < metrics["loss_before"] - 1.5
    settings = json.loads((out / "training_settings.json").read_text())
    assert (settings["loss_type"], settings["model_name_or_path"]) == ("orpo", "tiny")
    # The saved folder gives the log-probs the run reported for its first two eval batches.
    chosen, _ = saved_pair_logps(out, tmp_path / "cache", tiny_tokenizer)
    assert chosen == pytest.approx(metrics["chosen_logps_after"], abs=1e-3)
