"""The bench's results as a page under docs/: the tables `bench.run.format_report` prints, headed by the exact
command, the CPU (utils/runtime/provenance.py), the dtype, the commit and the load, and a plot of every paired ratio beside it (a
PNG of the same name; not drawn, and the page says so, where matplotlib is not installed)."""
import shlex
from pathlib import Path

from utils.runtime.provenance import code_commit, cpu_name



def command_line(argv):
    """The command that ran the bench, as typed (`argv`: its arguments)."""
    return " ".join(["python -m bench", *(shlex.quote(arg) for arg in argv)])


def ratio_rows(results, targets):
    """(label, summary of the ratio ours / baseline, target or None) of each paired measurement in `results`."""
    rows = []
    for model, r in results.get("step1", {}).items():
        target = targets["step1_smollm2_ratio"] if model == "smollm2-135m" else targets["step1_ratio"]
        rows.append((f"step 1 {model} vs bare PyTorch", r["ratio"], target))
    for label, r in results.get("head", {}).items():
        rows.append((f"{label}: fused output layer vs full logits", r["ratio"], None))
    if "rollout" in results:
        rows.append(("step 3 rollouts tiny vs HF generate", results["rollout"]["ratio"], targets["rollout_ratio"]))
    for r in results.get("sampler", {}).values():
        rows.append((f"sampler {r['model']} {r['shape']} vs {r['baseline_decoding']}", r["ratio"],
                     targets["rollout_ratio"] if "greedy" in r["baseline_decoding"] else None))
    if "packing" in results:
        rows.append(("step 1 tiny --packing vs padding", results["packing"]["ratio"], targets["packing_ratio"]))
    for model, r in results.get("groups", {}).items():
        rows.append((f"step 3 answer groups {model}: prompt once vs every row", r["ratio"], None))
    for model, r in results.get("compile", {}).items():
        rows.append((f"step 1 {model} --compile vs eager", r["ratio"], None))
    return rows


def plot_ratios(rows, path, title):
    """A horizontal bar a row: the median ratio, a line from its min to its max, the target as a mark, 1 as a
    line. False (nothing written) without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.4))
    y = list(range(len(rows)))[::-1]
    medians = [r["median"] for _, r, _ in rows]
    ax.barh(y, medians, color="#4c72b0", height=0.6)
    ax.errorbar(medians, y, xerr=[[m - r["min"] for m, (_, r, _) in zip(medians, rows)],
                                  [r["max"] - m for m, (_, r, _) in zip(medians, rows)]],
                fmt="none", ecolor="black", capsize=3)
    for row_y, (_, _, target) in zip(y, rows):
        if target is not None:
            ax.plot([target], [row_y], marker="|", markersize=18, color="#c44e52", markeredgewidth=2)
    ax.axvline(1.0, color="gray", linewidth=1, linestyle="--")
    ax.set_yticks(y, [label for label, _, _ in rows], fontsize=8)
    ax.set_xlabel("ratio ours / baseline (bar: median; line: min-max; red mark: target)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def write_report(results, tables, path, targets, argv):
    """Write the page (and its plot) to `path`, for a bench run with the arguments `argv`; the paths written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    machine = results["machine"]
    settings = results["settings"]
    head = (f"CPU: {cpu_name()}; dtype {machine['dtype']}; commit {code_commit()}; torch {machine['torch']}, "
            f"transformers {machine['transformers']}, deepspeed {machine['deepspeed']}; {settings['repeats']} "
            f"repeats after {settings['warmup']} warm-up; {results['wall_time_s']:.0f} s")
    rows = ratio_rows(results, targets)
    plot = path.with_suffix(".png")
    plotted = bool(rows) and plot_ratios(rows, plot, head if len(head) < 120 else head[:117] + "...")
    lines = ["# Bench results", "", "Written by `python -m bench` (bench/report.py); do not edit by hand: run the "
             "command again.", "", "```", command_line(argv), "```", "", head, "", tables, ""]
    if plotted:
        lines += [f"![paired ratios]({plot.name})", ""]
    elif rows:
        lines += ["(No plot: matplotlib is not installed.)", ""]
    path.write_text("\n".join(lines))
    return [path, plot] if plotted else [path]

