"""Where a run's scalars go besides the console: the trackers of `--report_to`, as the Hugging Face Trainer names
them (TRACKERS: tensorboard, wandb, mlflow; several at once; `none`).

Each tracker is a class made with (run_name, config, settings): it opens one run for a step and logs the step's
flags (`config`) once, takes scalars at an optimizer step (`log(step, {name: float})`), and `close()`s the run.
None of them needs a server:

- tensorboard: event files under `<--tensorboard_path>/<run_name>`.
- wandb: an offline run (WANDB_MODE=offline unless WANDB_MODE is set) under `<--tracking_dir>/wandb/` (WANDB_DIR
  wins), in project WANDB_PROJECT (default chatrlhf); `wandb sync <its folder>` uploads it later.
- mlflow: a run in experiment MLFLOW_EXPERIMENT_NAME (default chatrlhf) of the local file store
  `<--tracking_dir>/mlruns` (MLFLOW_TRACKING_URI wins); `MLFLOW_ALLOW_FILE_STORE=true mlflow ui
  --backend-store-uri <that folder>` shows it (with `pip install mlflow`: the extra installs the client alone).

`--run_group` (train.py passes one per pipeline) groups the runs of a pipeline's stages: W&B's `group`, and in
MLflow a parent run of that name with each stage's run nested under it, all tagged `run_group`.
The packages of wandb and mlflow are optional extras of setup.py, imported only when asked for."""
import importlib.util
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from utils.runtime.errors import ConfigError

PROJECT = "chatrlhf"
"""The default W&B project and MLflow experiment."""
NONE = "none"
GROUP_CHARACTERS = re.compile(r"[A-Za-z0-9._:-]{1,128}")


@dataclass(frozen=True)
class TrackerSettings:
    """Where a step's trackers write: TensorBoard's folder, the folder of W&B's and MLflow's local files, the
    pipeline's group (None: a run of its own)."""
    tensorboard_path: str
    tracking_dir: str
    run_group: str = None


class TensorBoardTracker:
    def __init__(self, run_name, config, settings):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=f"{settings.tensorboard_path}/{run_name}")
        self.writer.add_text("flags", "```\n" + json.dumps(config, indent=1) + "\n```")

    def log(self, step, scalars):
        for name, value in scalars.items():
            self.writer.add_scalar(name, value, step)

    def close(self):
        self.writer.close()


class WandbTracker:
    def __init__(self, run_name, config, settings):
        import wandb

        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", PROJECT), name=run_name,
                              group=settings.run_group, config=config,
                              dir=None if os.environ.get("WANDB_DIR") else _folder(settings.tracking_dir),
                              mode=None if os.environ.get("WANDB_MODE") else "offline")

    def log(self, step, scalars):
        self.run.log(scalars, step=step)

    def close(self):
        import wandb

        self.run.finish()
        wandb.teardown()  # finish() leaves the run's file to W&B's service to write; this waits until it has


class MlflowTracker:
    def __init__(self, run_name, config, settings):
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            uri = (_folder(settings.tracking_dir) / "mlruns").resolve().as_uri()
            # MLflow 3 keeps its file store but asks for this opt-in; a local store needs no server.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", PROJECT)
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
        tags = {}
        if settings.run_group:
            tags = {"run_group": settings.run_group,
                    "mlflow.parentRunId": self._group_run(experiment_id, settings.run_group)}
        self.run_id = self.client.create_run(experiment_id, run_name=run_name, tags=tags).info.run_id
        # MLflow's params are text: JSON for all but text, cut to the 500 characters every MLflow store takes.
        params = [Param(name, (value if isinstance(value, str) else json.dumps(value))[:500])
                  for name, value in sorted(config.items())]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params a batch
            self.client.log_batch(self.run_id, params=params[start:start + 100])

    def _group_run(self, experiment_id, group):
        """The id of the pipeline's parent run: the one an earlier stage made, else a new one."""
        found = self.client.search_runs([experiment_id], f"tags.run_group = '{group}' and tags.pipeline = 'true'",
                                        max_results=1)
        if found:
            return found[0].info.run_id
        parent = self.client.create_run(experiment_id, run_name=group, tags={"run_group": group, "pipeline": "true"})
        self.client.set_terminated(parent.info.run_id)
        return parent.info.run_id

    def log(self, step, scalars):
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(name, value, now, step) for name, value in scalars.items()])

    def close(self):
        self.client.set_terminated(self.run_id)


@dataclass(frozen=True)
class Tracker:
    """One --report_to backend: its class, the module it needs, the setup.py extra that installs it ("": a
    dependency of chatrlhf itself), and whether its runs take --run_group (TensorBoard's folders group them)."""
    make: type
    module: str
    extra: str
    grouped: bool
    help: str


TRACKERS = {
    "tensorboard": Tracker(TensorBoardTracker, "tensorboard", "", False,
                           "TensorBoard event files under --tensorboard_path"),
    "wandb": Tracker(WandbTracker, "wandb", "wandb", True, "a Weights & Biases run, offline unless WANDB_MODE says "
                     "otherwise, under <--tracking_dir>/wandb (`wandb sync` uploads it)"),
    "mlflow": Tracker(MlflowTracker, "mlflow", "mlflow", True, "an MLflow run in the local file store "
                      "<--tracking_dir>/mlruns unless MLFLOW_TRACKING_URI is set"),
}


def _folder(path):
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def resolve_report_to(names, enable_tensorboard=False, flag="--report_to"):
    """The trackers asked for, each once, in order: `names` (`none` alone: no tracker), with tensorboard added by
    --enable_tensorboard. A tracker whose package is missing is refused in one line naming the extra to install."""
    names = list(names or [])
    if NONE in names and len(names) > 1:
        raise ConfigError(f"{flag} {NONE} turns every tracker off; it cannot be given with "
                          f"{' '.join(name for name in names if name != NONE)}")
    names = [name for name in dict.fromkeys(names) if name != NONE]
    if enable_tensorboard and "tensorboard" not in names:
        names.append("tensorboard")
    for name in names:
        row = TRACKERS[name]
        if importlib.util.find_spec(row.module) is None:
            install = f'pip install -e ".[{row.extra}]"' if row.extra else "pip install -e ."
            raise ConfigError(f"{flag} {name} needs the {row.module} package: {install}")
    return names


def check_run_group(group, flag="--run_group"):
    if group is not None and not GROUP_CHARACTERS.fullmatch(group):
        raise ConfigError(f"{flag} {group!r}: use 1 to 128 letters, digits, '.', '_', ':' or '-'")


def open_trackers(names, run_name, config, settings):
    """The trackers `names` (resolve_report_to's), each with a run `run_name` open, `config` logged once."""
    return [TRACKERS[name].make(run_name, config, settings) for name in names]
