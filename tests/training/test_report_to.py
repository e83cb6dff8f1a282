"""Real steps through train.py with `--report-to tensorboard wandb mlflow`, W&B offline and MLflow in its local file
store: each tracker holds the same losses at the same steps, the ones the step printed and saved in metrics.json,
and the stages of one train.py run are one group (W&B's group; MLflow runs nested under one parent run)."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tracker_stores import mlflow_runs, tensorboard_scalars, wandb_runs
from utils.runtime.trackers import TRACKERS

ROOT = Path(__file__).resolve().parents[2]
QUICK = "--max_steps 4 --per_device_train_batch_size 16 --per_device_eval_batch_size 32 --max_seq_len 64 " \
        "--print_interval 2 --learning_rate 2e-3"
TRACKER_ENV = ("WANDB_MODE", "WANDB_DIR", "WANDB_PROJECT", "WANDB_RUN_GROUP", "WANDB_API_KEY", "MLFLOW_TRACKING_URI",
               "MLFLOW_EXPERIMENT_NAME", "MLFLOW_ALLOW_FILE_STORE")


@pytest.fixture(autouse=True)
def tracker_packages():
    missing = [row.module for row in TRACKERS.values() if importlib.util.find_spec(row.module) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (pip install -e \".[test]\" installs them)")


def train(out, *argv):
    env = {key: value for key, value in os.environ.items() if key not in TRACKER_ENV}
    result = subprocess.run([sys.executable, "train.py", "--no-eval", "--output-dir", str(out), "--report-to",
                             "tensorboard", "wandb", "mlflow", *argv], cwd=ROOT, capture_output=True, text=True,
                            timeout=1200, env=dict(env, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return (out / "run_group").read_text().strip()


def tracked(out, group):
    """{run name: {tracker: its scalars}} of a train.py run's stages, after checking that every W&B and MLflow run
    is in `group` (MLflow's nested under the one parent run named after it)."""
    runs = {}
    for run in wandb_runs(out / "wandb"):
        assert run["folder"].name.startswith("offline-run-") and run["project"] == "chatrlhf"
        assert run["group"] == group
        runs.setdefault(run["name"], {})["wandb"] = run["scalars"]
    found = mlflow_runs((out / "mlruns").as_uri())
    (parent,) = [run for run in found if run["tags"].get("pipeline") == "true"]
    assert parent["name"] == group
    for run in found:
        if run is not parent:
            assert run["group"] == group and run["parent"] == parent["id"] and run["status"] == "FINISHED"
            runs.setdefault(run["name"], {})["mlflow"] = run["scalars"]
    for folder in (out / "tensorboard").iterdir():
        runs.setdefault(folder.name, {})["tensorboard"] = tensorboard_scalars(folder)
    return runs


def assert_same_everywhere(scalars):
    """The three trackers hold the same tags at the same steps with the same values (TensorBoard's in float32)."""
    wandb, mlflow, tensorboard = scalars["wandb"], scalars["mlflow"], scalars["tensorboard"]
    assert set(wandb) == set(mlflow) == set(tensorboard)
    for tag in wandb:
        assert wandb[tag] == mlflow[tag], tag
        assert [step for step, _ in tensorboard[tag]] == [step for step, _ in wandb[tag]], tag
        assert [value for _, value in tensorboard[tag]] == pytest.approx([value for _, value in wandb[tag]],
                                                                          rel=1e-6), tag


def test_step1_reports_its_losses_to_every_tracker_in_the_runs_group(tmp_path):
    out = tmp_path / "out"
    group = train(out, "--step", "1", "--step1-args", f"{QUICK} --data_output_path {tmp_path / 'data'}")
    assert group.startswith("out-")
    runs = tracked(out, group)
    assert list(runs) == ["step1_sft"]
    scalars = runs["step1_sft"]
    assert_same_everywhere(scalars)
    wandb = scalars["wandb"]
    assert [step for step, _ in wandb["train/loss"]] == [2, 4]
    metrics = json.loads((out / "actor-models" / "tiny" / "metrics.json").read_text())
    assert wandb["eval/loss"] == [(0, metrics["loss_before"]), (4, metrics["loss_after"])]
    assert {"train/lr", "train/tokens_per_s", "eval/perplexity"} <= set(wandb)


@pytest.mark.e2e  # two stages through the launcher: ~3 min on a busy 2-core CPU
def test_the_stages_of_one_train_py_run_are_one_group_in_every_tracker(tmp_path):
    out, data = tmp_path / "out", f"--data_output_path {tmp_path / 'data'}"
    group = train(out, "--algorithm", "dpo", "--pair-judge", "none", "--step1-args", f"{QUICK} {data}",
                  "--step2-args", f"--max_steps 2 --per_device_train_batch_size 8 --print_interval 1 --eval_iters 1 "
                  f"{data}")
    runs = tracked(out, group)
    assert sorted(runs) == ["step1_sft", "step2_dpo"]
    for scalars in runs.values():
        assert_same_everywhere(scalars)
    assert [step for step, _ in runs["step2_dpo"]["wandb"]["train/accuracy"]] == [1, 2]
