"""Tokens per second and peak GPU memory of each stage of train.py runs, from the history each stage's monitor
wrote (utils/trainer/monitor.py): what scripts/gpu_check.sh prints and docs/gpu.md quotes.

    python scripts/stage_figures.py RUN_DIR [RUN_DIR ...]

A RUN_DIR is a train.py --output-dir; its stages are the folders holding a history (a stage another run made,
reached through a link, is that run's). Steps 1 and 2 log training throughput ("train" lines: tokens trained per
second), step 3 its rollouts ("ppo" lines: tokens generated per second); the figure is the median over the stage's
reports, the first left out where there are several (it includes the warm-up: kernel builds, the first
allocations). Peak memory is the most any report saw (torch.cuda.max_memory_allocated, on CUDA only).
"""
import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from the clone
from utils.trainer.monitor import HISTORY, read_history  # noqa: E402

THROUGHPUT = {"train": "trained", "ppo": "generated"}  # history prefix -> what its tokens_per_s counts


def stage_dirs(run_dir):
    """The stage folders of one run (those with a history, links not followed), in the order they were made."""
    found = [Path(folder) for folder, _, files in os.walk(run_dir) if HISTORY in files]
    return sorted(found, key=lambda folder: (folder / HISTORY).stat().st_mtime)


def figures(stage_dir):
    """{"tokens_per_s", "counts", "peak_memory_gib", "reports"} of one stage (None where it logged none)."""
    history = read_history(stage_dir)
    result = {"tokens_per_s": None, "counts": None, "peak_memory_gib": None, "reports": 0}
    for prefix, what in THROUGHPUT.items():
        values = [value for _, value in history.get(prefix, {}).get("tokens_per_s", [])]
        if values:
            steady = values[1:] if len(values) > 1 else values
            result.update(tokens_per_s=statistics.median(steady), counts=what, reports=len(values))
    peaks = [value for series in history.values() for _, value in series.get("peak_memory_gib", [])]
    if peaks:
        result["peak_memory_gib"] = max(peaks)
    return result


def table(run_dirs):
    """A Markdown table: a row per stage of each run."""
    lines = ["| run | stage | tokens/s | peak GPU memory | reports |", "|---|---|---|---|---|"]
    for run_dir in run_dirs:
        for stage in stage_dirs(run_dir):
            row = figures(stage)
            speed = "-" if row["tokens_per_s"] is None else f"{row['tokens_per_s']:,.0f} {row['counts']}"
            memory = "-" if row["peak_memory_gib"] is None else f"{row['peak_memory_gib']:.2f} GiB"
            lines.append(f"| {Path(run_dir).name} | {stage.relative_to(run_dir)} | {speed} | {memory} | "
                         f"{row['reports']} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dirs", nargs="+", type=Path, help="train.py --output-dir folders")
    print(table(parser.parse_args(argv).run_dirs))


if __name__ == "__main__":
    main()
