"""A Markdown table of several runs of one command (seeds), from each run's own `evaluation.json` and `report.md`:
what docs/ quotes, so that no result table is typed by hand.

    python scripts/seed_table.py --title "python train.py" out-seed1234 out-seed2 out-seed3 >> docs/defaults.md

Each run folder is a `train.py --output-dir`. A row per run: held-out checker score sampled and greedy, before ->
after, and the change of the skill (or task) whose greedy score changed least; then the mean and the spread
(sample standard deviation) of the gains; `--report-rows` adds columns read from each report.md. The header names
the command (report.md's first line), and the CPU and the commit of the runs (their reports' rows; this machine's
and this clone's where a run predates those rows).
"""
import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from utils.runtime.provenance import code_commit, cpu_name  # noqa: E402


def report_value(folder, measure):
    """The value of report.md's row `| all | <measure> | value |` in a run folder, None where it has none."""
    report = Path(folder) / "report.md"
    prefix = f"| all | {measure} | "
    lines = report.read_text().splitlines() if report.is_file() else []
    return next((line[len(prefix):].rstrip(" |") for line in lines if line.startswith(prefix)), None)


def provenance(folders):
    """"CPU: ...; commit: ..." of the runs, as their reports name them (each value once); what a run does not
    name is this machine's CPU and this clone's commit, marked as the table's."""
    parts = []
    for label, measure, here in (("CPU", "CPU", cpu_name), ("commit", "code commit", code_commit)):
        named = [report_value(folder, measure) for folder in folders]
        values = list(dict.fromkeys(filter(None, named)))
        if None in named:
            values.append(f"{here()} (where a run does not say: the table's)")
        parts.append(f"{label}: {', '.join(values)}")
    return "; ".join(parts)


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


def report_row(folder, wanted):
    """The value of the first report.md row whose measure starts with `wanted` (`STAGE: measure`: in that
    stage's rows only), "-" where there is none."""
    stage, _, measure = wanted.rpartition(": ")
    report = Path(folder) / "report.md"
    for line in report.read_text().splitlines() if report.is_file() else []:
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[1].startswith(measure) and (not stage or cells[0] == stage):
            return cells[2]
    return "-"


def table(folders, title, report_rows=()):
    """The table of the runs `folders`, headed `title`, with a column for each of `report_rows` (report_row)."""
    rows = [(Path(folder).name, *run_row(folder)) for folder in folders]
    extra = "".join(f" {wanted} |" for wanted in report_rows)
    lines = [f"### {title}", "", f"Command: `{command_of(folders[0])}` (with `--seed S --output-dir <run>`); "
             f"{provenance(folders)}.", "",
             f"| run | sampled | greedy | worst greedy skill |{extra}", "|---|---|---|---|" + "---|" * len(report_rows)]
    for folder, (name, s0, s1, g0, g1, change, skill) in zip(folders, rows):
        values = "".join(f" {report_row(folder, wanted)} |" for wanted in report_rows)
        lines.append(f"| {name} | {s0:.3f} -> {s1:.3f} ({s1 - s0:+.3f}) | {g0:.3f} -> {g1:.3f} ({g1 - g0:+.3f}) "
                     f"| {f'{skill} {change:+.3f}' if skill else '-'} |{values}")
    gains = [s1 - s0 for _, s0, s1, *_ in rows]
    worst = [row[5] for row in rows if row[6]]
    spread = f" (sd {statistics.stdev(gains):.3f})" if len(gains) > 1 else ""
    lowest = f"lowest {min(worst):+.3f}" if worst else "-"
    lines.append(f"| mean of {len(rows)} | {statistics.mean(gains):+.3f}{spread} | "
                 f"{statistics.mean(g1 - g0 for _, _, _, g0, g1, *_ in rows):+.3f} | {lowest} |"
                 + " |" * len(report_rows))
    return "\n".join(lines) + "\n"


def parse_table_args(description, argv=None, title="Runs"):
    """The flags of a table script (this one, scripts/panel_table.py): the run folders and --title."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("runs", nargs="+", help="train.py output folders, each holding evaluation.json.")
    parser.add_argument("--title", default=title, help="The table's heading; default %(default)s.")
    parser.add_argument("--report-rows", nargs="+", default=[], metavar="MEASURE",
                        help="More columns: each run's report.md value of the first measure starting with MEASURE "
                             "('STAGE: MEASURE': that stage's), e.g. 'all: wall time'.")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_table_args(__doc__.splitlines()[0], argv)
    print(table(args.runs, args.title, args.report_rows))


if __name__ == "__main__":
    main()
