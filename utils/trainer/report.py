"""The table a pipeline run ends with: what each step measured (its `metrics.json`), how long it took, and the
side-by-side evaluation of the actors. `train.py` writes it to `<output>/report.md`; the README quotes one."""
import json
from pathlib import Path


def _load(path):
    path = Path(path)
    return json.loads(path.read_text()) if path.is_file() else None


def _fmt(value, digits=3):
    return "-" if value is None else f"{value:.{digits}f}"


def _change(metrics, before, after, digits=3):
    if metrics is None or before not in metrics or after not in metrics:
        return "-"
    return f"{metrics[before]:.{digits}f} -> {metrics[after]:.{digits}f}"


def pipeline_report(stage_dirs, wall_times, evaluation=None, command=None):
    """Markdown for the stages whose metrics exist. stage_dirs: {stage name (train.py's STAGES): its output
    folder}; wall_times: {stage: seconds} of this run; evaluation: `inference.evaluation.evaluate_models` output
    with models "baseline" (step-1 actor) and "finetune" (the final actor)."""
    sft, reward, ppo, rl = (_load(Path(stage_dirs[name]) / "metrics.json") if name in stage_dirs else None
                            for name in ("sft", "reward", "ppo", "rl"))
    rows = []
    if sft:
        rows.append(("1 SFT", "eval perplexity", _change(sft, "perplexity_before", "perplexity_after", 2)))
    rounds = any("@" in name for name in stage_dirs)
    for name, folder in stage_dirs.items():  # each round of train.py's --pair-rounds: "pairs", "dpo", "pairs@2", ...
        stage, _, round_ = name.partition("@")
        label = f" (round {round_ or 1})" if rounds else ""
        pairs = _load(Path(folder) / "meta.json") if stage == "pairs" else None
        if pairs:
            train = pairs.get("counts", {}).get("train", {})
            rows.append((f"2 sampled pairs{label}", "train pairs kept / prompts (mean judge score of the answers)",
                         f"{train.get('pairs', '-')} / {train.get('prompts', '-')} ({_fmt(train.get('mean_score'))})"))
        dpo = _load(Path(folder) / "metrics.json") if stage == "dpo" else None
        if dpo:
            rows.append((f"2 DPO{label}", "eval preference accuracy (chosen > rejected)",
                         _change(dpo, "accuracy_before", "accuracy_after")))
    if reward:
        rows.append(("2 reward model", "eval accuracy (chosen > rejected)",
                     _change(reward, "accuracy_before", "accuracy_after")))
        rows.append(("2 reward model", "eval mean score chosen / rejected",
                     f"{_fmt(reward.get('chosen_score_after'))} / {_fmt(reward.get('rejected_score_after'))}"))
    for name, metrics in (("3 PPO", ppo), ("3 RL", rl)):
        if metrics:
            rows.append((name, "mean score (first -> last tenth)", _change(metrics, "score_start", "score_end")))
            rows.append((name, "KL to reference, nats per answer (last tenth)", _fmt(metrics.get("kl_end"))))
            rows.append((name, "answers ending in EOS (last tenth)", _fmt(metrics.get("eos_fraction_end"))))
    if evaluation and {"baseline", "finetune"} <= set(evaluation):
        # The evaluation compares the step-1 actor with the final one, or the base model with the step-1 actor
        # when step 1 is the last (or only the RL actor with the base model, when step 1 could not run).
        later = any(name in stage_dirs for name in ("dpo", "ppo", "rl"))
        models = "step-1 -> final actor" if later and "sft" in stage_dirs else "base model -> final actor"
        for decoding in ("sampled", "greedy"):
            before, after = evaluation["baseline"].get(decoding, {}), evaluation["finetune"].get(decoding, {})
            if "all" in before and "all" in after:
                rows.append(("eval", f"held-out checker score, {decoding} ({models})",
                             f"{before['all']:.3f} -> {after['all']:.3f}"))
            if "reward" in before and "reward" in after:
                rows.append(("eval", f"held-out reward-model score, {decoding} ({models})",
                             f"{before['reward']:.3f} -> {after['reward']:.3f}"))
    for stage, seconds in wall_times.items():
        rows.append((stage, "wall time", f"{seconds:.0f} s"))
    if wall_times:
        rows.append(("all", "wall time", f"{sum(wall_times.values()):.0f} s"))
    lines = ["| step | measure | value |", "|---|---|---|"] + [f"| {a} | {b} | {c} |" for a, b, c in rows]
    if command:
        lines.insert(0, f"Measured by `{command}`:\n")
    if evaluation:
        lines += ["", skill_table(evaluation)]
    return "\n".join(lines) + "\n"


def skill_table(evaluation):
    """Held-out checker score per group (the built-in task's skills, a reasoning-gym spec's tasks), per model and
    decoding."""
    names = {"baseline": "before (baseline)", "finetune": "after (fine-tuned)"}
    groups = {key: None for result in evaluation.values() for decoding in ("sampled", "greedy")
              for key in result.get(decoding, {}) if key not in ("all", "reward")}
    columns = ["all", *groups]
    lines = ["| actor | decoding | " + " | ".join(columns) + " |", "|---|---|" + "---|" * len(columns)]
    for model, result in evaluation.items():
        for decoding in ("sampled", "greedy"):
            scores = result.get(decoding, {})
            if "all" in scores:
                cells = " | ".join(_fmt(scores.get(column)) for column in columns)
                lines.append(f"| {names.get(model, model)} | {decoding} | {cells} |")
    return "\n".join(lines)
