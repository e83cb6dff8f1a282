"""What a run reports: scalars to the trackers of --report_to (utils/runtime/trackers.py: TensorBoard, W&B,
MLflow), the same scalars as a JSON-lines history beside the step's output (what train.py's report draws its curves
from), console lines, and throughput as DeepSpeed-Chat's `print_throughput` computes it (Megatron's FLOP formula),
with the peak GPU memory on CUDA."""
import json
from pathlib import Path

import torch

from utils.data.packing import batch_counts
from utils.runtime.dist import print_rank_0
from utils.runtime.progress import is_rank_0
from utils.runtime.trackers import TrackerSettings, open_trackers


HISTORY = "history.jsonl"
"""A step's scalars, one JSON line per `Monitor.write` ({"step", "prefix", name: value...}), in its output folder."""
PARTIAL_HISTORY = HISTORY + ".partial"
"""The history of a run in progress, renamed to HISTORY when its model is saved (`Monitor.publish`): a run that
fails leaves the history of the model the folder holds as it was."""


class Monitor:
    """Scalars to the trackers of --report_to, each in a run `run_name` that holds the step's flags, and, always, to
    HISTORY in `history_dir` (if given); rank 0 only.

    All steps of a pipeline write under one --tensorboard_path (each in its own folder, so one TensorBoard shows
    the curves of the whole pipeline) and one --tracking_dir, their W&B and MLflow runs grouped by --run_group.
    The history is written to PARTIAL_HISTORY, started anew by a fresh run and continued by a resumed one (whose
    steps after its checkpoint then appear twice: `read_history` keeps the later line), and becomes HISTORY when the
    run's model is saved (`publish`)."""

    def __init__(self, args, run_name, history_dir=None, resumed=False):
        self.trackers, self.history = [], None
        self.history_path = Path(history_dir) / PARTIAL_HISTORY if history_dir is not None and is_rank_0() else None
        self.history_mode = "a" if resumed else "w"  # opened at the first write: a run that fails first leaves none
        if is_rank_0() and args.report_to:
            config = json.loads(json.dumps(vars(args), default=str))
            settings = TrackerSettings(args.tensorboard_path, args.tracking_dir or args.output_dir, args.run_group)
            self.trackers = open_trackers(args.report_to, run_name, config, settings)

    def write(self, step, prefix, **values):
        scalars = {f"{prefix}/{name}": float(value) for name, value in values.items()}
        for tracker in self.trackers:
            tracker.log(step, scalars)
        if self.history_path is not None:
            if self.history is None:
                self.history = open(self.history_path, self.history_mode)
                if self.history.tell() > 0 and not self.history_path.read_bytes().endswith(b"\n"):
                    self.history.write("\n")  # after the torn last line of a run killed mid-write
            line = {"step": int(step), "prefix": prefix, **{name: float(value) for name, value in values.items()}}
            self.history.write(json.dumps(line) + "\n")
            self.history.flush()

    def close(self):
        for tracker in self.trackers:
            tracker.close()
        self.trackers = []
        if self.history is not None:
            self.history.close()
            self.history = None

    def publish(self):
        """The run's history as the folder's HISTORY (after its model is saved), in place of an earlier run's."""
        self.close()
        if self.history_path is not None and self.history_path.is_file():
            self.history_path.replace(self.history_path.with_name(HISTORY))


def read_history(folder):
    """{prefix: {name: [(step, value), ...] by step}} of the HISTORY in `folder` ({} without one); where a resumed
    run wrote a step again, its later line wins. A line that is not a JSON object (a run killed mid-write) is
    skipped."""
    path = Path(folder) / HISTORY
    if not path.is_file():
        return {}
    latest = {}
    for text in path.read_text().splitlines():
        try:
            line = json.loads(text)
        except ValueError:
            continue
        if isinstance(line, dict) and isinstance(line.get("step"), int) and isinstance(line.get("prefix"), str):
            for name, value in line.items():
                if name not in ("step", "prefix") and isinstance(value, (int, float)):
                    latest[(line["prefix"], name, line["step"])] = float(value)
    history = {}
    for (prefix, name, step), value in sorted(latest.items()):
        history.setdefault(prefix, {}).setdefault(name, []).append((step, value))
    return history


def peak_memory():
    """{"peak_memory_gib": the most GPU memory this process's tensors have held} on CUDA; {} elsewhere."""
    if not torch.cuda.is_available():
        return {}
    return {"peak_memory_gib": torch.cuda.max_memory_allocated() / 2 ** 30}


def format_scalars(**values):
    return " ".join(f"{name}={value:.4g}" if isinstance(value, float) else f"{name}={value}"
                    for name, value in values.items())


def model_shape(config):
    """(layers, hidden size, vocab size) across the naming schemes of HF configs."""
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None)
    hidden = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None)
    return layers, hidden, getattr(config, "vocab_size", 0)


def training_flops(config, batch_size, seq_length, gradient_checkpointing=False, lora_dim=0):
    """FLOPs of one forward+backward over batch_size x seq_length tokens (Megatron; as DeepSpeed-Chat):
    24 * f * B * s * L * h^2 * (1 + s / (6h) + V / (16 L h)), f = 3 (4 with activation recomputation,
    less the frozen weights' gradient share with LoRA)."""
    layers, hidden, vocab = model_shape(config)
    factor = 4 if gradient_checkpointing else 3
    if lora_dim > 0:
        factor -= 1 - lora_dim * 2 / hidden
    return (24 * factor * batch_size * seq_length * layers * hidden ** 2
            * (1.0 + seq_length / (6.0 * hidden) + vocab / (16.0 * layers * hidden)))


class Throughput:
    """Accumulates samples, tokens and FLOPs between reports; `report()` prints one DS-Chat-style line for the
    steps since the last report and returns the figures for TensorBoard."""

    def __init__(self, config, world_size, gradient_checkpointing=False, lora_dim=0):
        self.config, self.world_size = config, world_size
        self.gradient_checkpointing, self.lora_dim = gradient_checkpointing, lora_dim
        self._reset()

    def _reset(self):
        self.seconds, self.steps, self.samples, self.tokens, self.flops = 0.0, 0, 0, 0, 0.0

    def add(self, seconds, batch_size, seq_length, real_tokens, samples=None):
        """One micro-step of `seconds` (forward, backward, optimizer) over a padded batch_size x seq_length
        holding `samples` samples (default batch_size: one per row)."""
        self.seconds += seconds
        self.steps += 1
        self.samples += batch_size if samples is None else samples
        self.tokens += real_tokens
        self.flops += training_flops(self.config, batch_size, seq_length, self.gradient_checkpointing,
                                     self.lora_dim)

    def add_batch(self, seconds, batch):
        """`add` for a collated batch, padded or packed: FLOPs over its rows as padded, its samples and real
        tokens as `utils.data.packing.batch_counts` counts them."""
        samples, real_tokens = batch_counts(batch)
        self.add(seconds, *batch["input_ids"].shape, real_tokens, samples=samples)

    def report(self):
        if self.steps == 0:
            return {}
        elapsed = max(self.seconds, 1e-9)
        figures = {"samples_per_s": self.samples * self.world_size / elapsed,
                   "tokens_per_s": self.tokens * self.world_size / elapsed,
                   "tflops": self.flops / elapsed / 1e12,
                   "latency_s": elapsed / self.steps, **peak_memory()}
        memory = f", peak GPU memory {figures['peak_memory_gib']:.2f} GiB" if "peak_memory_gib" in figures else ""
        print_rank_0(f"throughput: latency {figures['latency_s']:.3f} s/step, "
                     f"{figures['samples_per_s']:.1f} samples/s, {figures['tokens_per_s']:.0f} tokens/s, "
                     f"{figures['tflops']:.4f} TFLOPs per process{memory}")
        self._reset()
        return figures
