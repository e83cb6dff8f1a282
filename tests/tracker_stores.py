"""Reading back what the trackers of --report_to wrote, each with its package's own reader: TensorBoard's
EventAccumulator, MLflow's MlflowClient, and for W&B its offline run file (`run-<id>.wandb`, a LevelDB-style log of
W&B's own protobuf records, which `wandb sync` uploads) parsed with W&B's Record message.

Each reader gives the runs it finds as dicts: name, group, config ({flag: value}) and scalars ({tag: [(step,
value)]} in step order)."""
import json
import struct
from pathlib import Path

WANDB_FILE_HEADER = b":W&B\xe1\xbe\x00"  # "W&B", magic 0xBEE1, version 0
WANDB_BLOCK = 32768  # records are split across blocks of this size, each piece behind a 7-byte header
WANDB_WHOLE, WANDB_LAST_PIECE = 1, 4


def tensorboard_scalars(log_dir):
    """{tag: [(step, value)]} of the event files of one TensorBoard run folder."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(log_dir))
    accumulator.Reload()
    return {tag: [(event.step, event.value) for event in accumulator.Scalars(tag)]
            for tag in accumulator.Tags()["scalars"]}


def wandb_records(path):
    """The protobuf records of a W&B run file, in order."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    assert data[:len(WANDB_FILE_HEADER)] == WANDB_FILE_HEADER, f"{path} is not a W&B run file"
    position, pieces = len(WANDB_FILE_HEADER), []
    while position + 7 <= len(data):
        if WANDB_BLOCK - position % WANDB_BLOCK < 7:  # a block's tail too short for a header is padding
            position += WANDB_BLOCK - position % WANDB_BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[position:position + 7])
        pieces.append(data[position + 7:position + 7 + length])
        position += 7 + length
        if kind in (WANDB_WHOLE, WANDB_LAST_PIECE):
            yield wandb_internal_pb2.Record.FromString(b"".join(pieces))
            pieces = []


def wandb_runs(wandb_dir):
    """The offline runs under `wandb_dir` (the folder W&B made: <dir>/wandb), in the order they started."""
    runs = []
    for run_file in sorted(Path(wandb_dir).glob("offline-run-*/run-*.wandb")):
        run = {"folder": run_file.parent, "scalars": {}}
        for record in wandb_records(run_file):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run.update(name=record.run.display_name, group=record.run.run_group, project=record.run.project,
                           started=record.run.start_time.ToNanoseconds(),
                           config={item.key: json.loads(item.value_json) for item in record.run.config.update
                                   if not item.key.startswith("_")})
            elif kind == "history":
                for item in record.history.item:
                    key = item.key or "/".join(item.nested_key)
                    if not key.startswith("_"):  # W&B's own _step, _runtime, _timestamp
                        run["scalars"].setdefault(key, []).append((record.history.step.num,
                                                                   json.loads(item.value_json)))
        runs.append(run)
    return sorted(runs, key=lambda run: run["started"])  # folder names only have whole seconds


def mlflow_runs(tracking_uri, experiment="chatrlhf"):
    """The runs of `experiment` in an MLflow store, oldest first, with their tags and parent run's id."""
    import os
    from unittest import mock

    from mlflow.tracking import MlflowClient

    with mock.patch.dict(os.environ, {"MLFLOW_ALLOW_FILE_STORE": "true"}):  # MLflow 3 asks for it (a file store)
        client = MlflowClient(tracking_uri=str(tracking_uri))
        return _mlflow_runs(client, tracking_uri, experiment)


def _mlflow_runs(client, tracking_uri, experiment):
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no MLflow experiment {experiment} in {tracking_uri}"
    runs = []
    for run in sorted(client.search_runs([found.experiment_id]), key=lambda run: run.info.start_time):
        scalars = {key: [(metric.step, metric.value) for metric in sorted(client.get_metric_history(
            run.info.run_id, key), key=lambda metric: metric.step)] for key in run.data.metrics}
        runs.append({"id": run.info.run_id, "name": run.info.run_name, "tags": run.data.tags,
                     "group": run.data.tags.get("run_group"), "parent": run.data.tags.get("mlflow.parentRunId"),
                     "config": run.data.params, "scalars": scalars, "status": run.info.status})
    return runs
