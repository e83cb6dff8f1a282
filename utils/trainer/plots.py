"""The pictures of a pipeline's report: each stage's curves against its steps (from the history its monitor wrote,
utils/trainer/monitor.py HISTORY) and the closing evaluation's scores per skill or task, before and after, as PNG
files beside report.md. Drawn with matplotlib's Agg backend (no display); without matplotlib the report says so
and has no pictures."""
from pathlib import Path

from inference.evaluation import DECODINGS
from utils.trainer.monitor import HISTORY, read_history

MATPLOTLIB_MISSING = (f"Curves: the plots need matplotlib (`pip install matplotlib`); each stage's figures are in "
                      f"its {HISTORY}.")

# The panels of a stage's picture, each (title, [(prefix, name) of Monitor.write], log scale): a panel is drawn
# where the stage wrote one of its series at least. Step 3 writes "ppo" and "eval_<decoding>", the others "train"
# and "eval".
PANELS = (
    ("loss", [("train", "loss"), ("ppo", "actor_loss"), ("ppo", "critic_loss")], False),
    ("score / reward", [("ppo", "score"), ("ppo", "reward"), ("train", "margins")], False),
    ("KL to the reference (nats per answer)", [("ppo", "kl")], False),
    ("answer length (tokens)", [("ppo", "answer_length")], False),
    ("accuracy / held-out score", [("train", "accuracy"), ("train", "batch_accuracy"), ("eval", "accuracy"),
                                   *((f"eval_{decoding}", "all") for decoding in DECODINGS)], False),
    ("eval perplexity", [("eval", "perplexity")], True),
)
MODEL_NAMES = {"baseline": "before", "finetune": "after"}


def pyplot():
    """matplotlib's pyplot on the Agg backend, or None without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def image_name(stage):
    """report-<stage>.png: "dpo@2" (round 2 of --pair-rounds) -> report-dpo-round2.png."""
    return "report-" + stage.replace("@", "-round") + ".png"


def stage_panels(history):
    """[(title, [(label, steps, values)], log)] of PANELS that `history` (read_history) has data for."""
    panels = []
    for title, series, log in PANELS:
        lines = [(f"{prefix}/{name}", *zip(*history[prefix][name])) for prefix, name in series
                 if history.get(prefix, {}).get(name)]
        if lines:
            panels.append((title, lines, log))
    return panels


def plot_stage(plt, stage, panels, path, columns=3):
    """One picture of `panels` (stage_panels), `columns` to a row, against the stage's steps."""
    from matplotlib.ticker import MaxNLocator

    rows = -(-len(panels) // columns)
    width = min(columns, len(panels))
    figure, axes = plt.subplots(rows, width, figsize=(4.2 * width, 3.2 * rows), squeeze=False)
    for axis in axes.flat[len(panels):]:
        axis.set_visible(False)
    for axis, (title, lines, log) in zip(axes.flat, panels):
        for label, steps, values in lines:
            axis.plot(steps, values, marker="o" if len(steps) < 12 else None, markersize=3, label=label)
        axis.set_title(title, fontsize=10)
        axis.set_xlabel("step")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        if log:
            axis.set_yscale("log")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    figure.suptitle(stage)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


def plot_skills(plt, evaluation, path):
    """Bars of the held-out checker score per group ("all" first), before and after, one panel per decoding; False
    (nothing drawn) when the evaluation has no checker scores."""
    decodings = [decoding for decoding in DECODINGS
                 if all("all" in evaluation.get(model, {}).get(decoding, {}) for model in MODEL_NAMES)]
    if not decodings:
        return False
    figure, axes = plt.subplots(1, len(decodings), figsize=(5.5 * len(decodings), 3.4), squeeze=False)
    for axis, decoding in zip(axes[0], decodings):
        groups = ["all", *dict.fromkeys(key for model in MODEL_NAMES for key in evaluation[model][decoding]
                                        if key not in ("all", "reward"))]
        width = 0.8 / len(MODEL_NAMES)
        for i, (model, name) in enumerate(MODEL_NAMES.items()):
            scores = [evaluation[model][decoding].get(group, 0.0) for group in groups]
            bars = axis.bar([x + (i - 0.5) * width for x in range(len(groups))], scores, width, label=name)
            axis.bar_label(bars, fmt="%.2f", fontsize=6)
        axis.set_xticks(range(len(groups)), groups, rotation=30 if len(groups) > 6 else 0, fontsize=8)
        axis.set_ylim(0, 1.08)
        axis.set_title(f"held-out checker score, {decoding}", fontsize=10)
        axis.grid(axis="y", alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return True


def report_figures(stage_dirs, evaluation, folder):
    """Draw each stage's curves (those with a history) and the skill scores into `folder`; the markdown lines that
    show them (image links relative to `folder`, where report.md is), or the line saying matplotlib is missing."""
    plt = pyplot()
    if plt is None:
        return [MATPLOTLIB_MISSING]
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for stage, stage_dir in stage_dirs.items():
        panels = stage_panels(read_history(stage_dir))
        if panels:
            plot_stage(plt, stage, panels, folder / image_name(stage))
            lines.append(f"![{stage}: training curves]({image_name(stage)})")
    if evaluation and plot_skills(plt, evaluation, folder / "report-skills.png"):
        lines.append("![held-out score per skill or task, before and after](report-skills.png)")
    return lines
