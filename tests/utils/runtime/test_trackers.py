"""The trackers of --report_to (utils/runtime/trackers.py) with the real packages in their local modes: what each is
given is what its own reader finds (TensorBoard's event files, W&B's offline run, MLflow's file store); runs of one
--run_group are grouped; the flag's values (none, the --enable_tensorboard alias, a missing package) resolve or are
refused in one line. A tracker whose package is not installed is skipped, with the reason."""
import importlib.util
import sys

import pytest

from tests.tracker_stores import mlflow_runs, tensorboard_scalars, wandb_runs
from utils.runtime.errors import ConfigError
from utils.runtime.trackers import TRACKERS, TrackerSettings, open_trackers, resolve_report_to

CONFIG = {"learning_rate": 0.001, "data_path": ["builtin"], "lora_dim": 0, "output_dir": "out", "dtype": None}
STEPS = {0: {"eval/loss": 2.5}, 1: {"train/loss": 2.25, "train/lr": 2 ** -10},
         2: {"train/loss": 1.75, "train/lr": 2 ** -11}, 3: {"train/loss": 1.5, "eval/loss": 1.625}}


def needs(name):
    """Skip unless tracker `name`'s package is installed (the test extra installs them all)."""
    module = TRACKERS[name].module
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (pip install -e \".[{TRACKERS[name].extra}]\")")


@pytest.fixture(autouse=True)
def local_only(monkeypatch):
    """No setting of the user's environment sends a run elsewhere: each tracker's own default applies."""
    for name in ("WANDB_MODE", "WANDB_DIR", "WANDB_PROJECT", "WANDB_RUN_GROUP", "WANDB_API_KEY", "MLFLOW_TRACKING_URI",
                 "MLFLOW_EXPERIMENT_NAME", "MLFLOW_ALLOW_FILE_STORE"):
        monkeypatch.delenv(name, raising=False)


def write_run(names, run_name, settings, steps=STEPS):
    trackers = open_trackers(names, run_name, CONFIG, settings)
    for step, scalars in steps.items():
        for tracker in trackers:
            tracker.log(step, scalars)
    for tracker in trackers:
        tracker.close()


def logged(steps=STEPS):
    """{tag: [(step, value)]} of `steps`."""
    series = {}
    for step, scalars in steps.items():
        for tag, value in scalars.items():
            series.setdefault(tag, []).append((step, value))
    return series


def read_runs(name, settings):
    """The runs tracker `name` wrote under `settings`, as tests/tracker_stores.py reads them."""
    if name == "tensorboard":
        from pathlib import Path

        return [{"name": folder.name, "scalars": tensorboard_scalars(folder)}
                for folder in sorted(Path(settings.tensorboard_path).iterdir())]
    if name == "wandb":
        return wandb_runs(f"{settings.tracking_dir}/wandb")
    return mlflow_runs(f"file:{settings.tracking_dir}/mlruns")


@pytest.mark.parametrize("name", TRACKERS)
def test_each_tracker_holds_the_scalars_it_was_given_at_their_steps(name, tmp_path):
    needs(name)
    settings = TrackerSettings(str(tmp_path / "tb"), str(tmp_path / "tracking"))
    write_run([name], "step1_sft", settings)
    runs = [run for run in read_runs(name, settings) if run.get("tags", {}).get("pipeline") != "true"]
    assert [run["name"] for run in runs] == ["step1_sft"]
    assert runs[0]["scalars"] == logged()  # every value is exactly representable in float32 (TensorBoard's)


def test_wandb_runs_offline_under_the_tracking_dir_with_the_flags_and_the_default_project(tmp_path):
    needs("wandb")
    settings = TrackerSettings(str(tmp_path / "tb"), str(tmp_path / "tracking"))
    write_run(["wandb"], "step2_dpo", settings)
    (run,) = wandb_runs(tmp_path / "tracking" / "wandb")
    assert run["project"] == "chatrlhf" and run["group"] == ""
    assert run["config"] == CONFIG


def test_mlflow_keeps_the_flags_as_params_and_ends_the_run(tmp_path):
    needs("mlflow")
    write_run(["mlflow"], "step3_ppo", TrackerSettings(str(tmp_path / "tb"), str(tmp_path)))
    (run,) = mlflow_runs(f"file:{tmp_path}/mlruns")
    assert run["config"] == {"learning_rate": "0.001", "data_path": '["builtin"]', "lora_dim": "0",
                             "output_dir": "out", "dtype": "null"}
    assert run["status"] == "FINISHED" and run["group"] is None and run["parent"] is None


@pytest.mark.parametrize("name", ["wandb", "mlflow"])
def test_the_runs_of_one_group_are_grouped_and_another_group_apart(name, tmp_path):
    """Two stages of one pipeline and one of another, as train.py's stages open them, one process after another."""
    needs(name)
    runs = [("step1_sft", "out-20250101-000000"), ("step2_dpo", "out-20250101-000000"), ("step1_sft", "other-1")]
    for run_name, group in runs:
        write_run([name], run_name, TrackerSettings(str(tmp_path / "tb"), str(tmp_path), group))
    found = read_runs(name, TrackerSettings(str(tmp_path / "tb"), str(tmp_path)))
    if name == "wandb":
        assert [(run["name"], run["group"]) for run in found] == runs
        return
    parents = {run["group"]: run for run in found if run["tags"].get("pipeline") == "true"}
    stages = [run for run in found if run["tags"].get("pipeline") != "true"]
    assert sorted(parents) == ["other-1", "out-20250101-000000"]
    assert all(parent["name"] == group and parent["parent"] is None for group, parent in parents.items())
    assert [(run["name"], run["group"]) for run in stages] == runs
    assert [run["parent"] for run in stages] == [parents[group]["id"] for _, group in runs]


def test_the_environment_of_each_package_wins_over_the_defaults(tmp_path, monkeypatch):
    """WANDB_DIR, WANDB_PROJECT, MLFLOW_TRACKING_URI and MLFLOW_EXPERIMENT_NAME, as each package documents them."""
    needs("wandb"), needs("mlflow")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_home"))
    monkeypatch.setenv("WANDB_PROJECT", "mine")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file:{tmp_path}/elsewhere")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "my-experiment")
    write_run(["wandb", "mlflow"], "step1_sft", TrackerSettings(str(tmp_path / "tb"), str(tmp_path / "unused")))
    assert not (tmp_path / "unused").exists()
    (run,) = wandb_runs(tmp_path / "wandb_home" / "wandb")
    assert run["project"] == "mine" and run["scalars"] == logged()
    (run,) = mlflow_runs(f"file:{tmp_path}/elsewhere", experiment="my-experiment")
    assert run["scalars"] == logged()


def test_report_to_resolves_none_the_tensorboard_alias_and_repeats():
    assert resolve_report_to(["none"]) == [] and resolve_report_to(None) == []
    assert resolve_report_to(["none"], enable_tensorboard=True) == ["tensorboard"]
    assert resolve_report_to(["tensorboard", "tensorboard"], enable_tensorboard=True) == ["tensorboard"]
    with pytest.raises(ConfigError, match="^--report_to none turns every tracker off; it cannot be given with "
                                          "tensorboard$"):
        resolve_report_to(["none", "tensorboard"])


@pytest.mark.parametrize("name", ["wandb", "mlflow"])
def test_a_tracker_whose_package_is_missing_is_refused_naming_its_extra(name, monkeypatch):
    monkeypatch.setitem(sys.modules, TRACKERS[name].module, None)  # as if not installed
    with pytest.raises(ConfigError, match=rf'^--report-to {name} needs the {name} package: pip install -e '
                                          rf'"\.\[{name}\]"$'):
        resolve_report_to(["tensorboard", name], flag="--report-to")
