"""A Markdown table of several runs of one command (seeds), from each run's own `evaluation.json` and `report.md`:
what docs/ quotes, so that no result table is typed by hand.

    python scripts/seed_table.py --title "python train.py" out-seed1234 out-seed2 out-seed3 >> docs/defaults.md

Each run folder is a `train.py --output-dir`. A row per run: held-out checker score sampled and greedy, before ->
after, and the change of the skill (or task) whose greedy score changed least; then the mean and the spread
(sample standard deviation) of the gains. The header names the command (report.md's first line), the CPU and the
commit the table was made at.
"""
import argparse
import json
import platform
import statistics
import subprocess
from pathlib import Path


def cpu_name():
    """The CPU's model name and whether it has native bf16 (the dtype `--dtype auto` picks)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown CPU"
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")),
                 "unknown CPU")
    flags = set(next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), []))
    bf16 = "native bf16" if flags & {"amx_bf16", "avx512_bf16"} else "no native bf16 (fp32)"
    return f"{model}, {bf16}"


def commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True, cwd=Path(__file__).resolve().parents[1]).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run_row(folder):
    """(seed label, sampled before, after, greedy before, after, worst greedy skill change, its skill) of a run."""
    folder = Path(folder)
    evaluation = json.loads((folder / "evaluation.json").read_text())
    before, after = evaluation["baseline"], evaluation["finetune"]
    skills = [key for key in before["greedy"] if key not in ("all", "reward")]
    worst = min(skills, key=lambda skill: after["greedy"][skill] - before["greedy"][skill]) if skills else None
    change = after["greedy"][worst] - before["greedy"][worst] if worst else 0.0
    return (before["sampled"]["all"], after["sampled"]["all"], before["greedy"]["all"], after["greedy"]["all"],
            change, worst)


def command_of(folder):
    report = Path(folder) / "report.md"
    first = report.read_text().splitlines()[0] if report.is_file() else ""
    return first.removeprefix("Measured by `").removesuffix("`:") if first.startswith("Measured by") else "?"


def table(folders, title):
    rows = [(Path(folder).name, *run_row(folder)) for folder in folders]
    lines = [f"### {title}", "", f"Command: `{command_of(folders[0])}` (with `--seed S --output-dir <run>`); "
             f"CPU: {cpu_name()}; commit: {commit()}.", "",
             "| run | sampled | greedy | worst greedy skill |", "|---|---|---|---|"]
    for name, s0, s1, g0, g1, change, skill in rows:
        lines.append(f"| {name} | {s0:.3f} -> {s1:.3f} ({s1 - s0:+.3f}) | {g0:.3f} -> {g1:.3f} ({g1 - g0:+.3f}) "
                     f"| {skill} {change:+.3f} |")
    gains = [s1 - s0 for _, s0, s1, *_ in rows]
    worst = [row[5] for row in rows]
    spread = f" (sd {statistics.stdev(gains):.3f})" if len(gains) > 1 else ""
    lines.append(f"| mean of {len(rows)} | {statistics.mean(gains):+.3f}{spread} | "
                 f"{statistics.mean(g1 - g0 for _, _, _, g0, g1, *_ in rows):+.3f} | lowest {min(worst):+.3f} |")
    return "\n".join(lines) + "\n"


def parse_table_args(description, argv=None, title="Runs"):
    """The flags of a table script (this one, scripts/panel_table.py): the run folders and --title."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("runs", nargs="+", help="train.py output folders, each holding evaluation.json.")
    parser.add_argument("--title", default=title, help="The table's heading; default %(default)s.")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_table_args(__doc__.splitlines()[0], argv)
    print(table(args.runs, args.title))


if __name__ == "__main__":
    main()
