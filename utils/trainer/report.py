"""The table a pipeline run ends with: what each step measured (its `metrics.json`: scores, the rows it kept of
those it read, the steps it trained), which loss and estimator it trained with (its saved flags, described by their
registries), how long it took, and the side-by-side evaluation of the actors (with what their answers were: the best
constant answer's score, distinct answers, answers cut at the limit), then the pictures (utils/trainer/plots.py):
each stage's curves and the scores per skill before and after. `train.py` writes it to `<output>/report.md`, the
pictures beside it; the README quotes one."""
import json
from pathlib import Path

from inference.evaluation import DECODINGS, TOOL_FIGURES, constant_likeness, scores_as_a_constant
from utils.model.save import read_training_settings
from utils.rl.estimators import ESTIMATORS
from utils.rl.policy_losses import POLICY_LOSSES
from utils.rl.preference_losses import PREFERENCE_LOSSES
from utils.runtime.provenance import code_commit, cpu_name, gpu_name
from utils.trainer.plots import report_figures

# The registry flags whose value a stage's report rows name, with the registry that describes each value.
VARIANT_FLAGS = {
    "dpo": {"loss_type": PREFERENCE_LOSSES},
    "ppo": {"advantage_estimator": ESTIMATORS, "policy_loss": POLICY_LOSSES},
    "rl": {"advantage_estimator": ESTIMATORS, "policy_loss": POLICY_LOSSES},
}


REPORT_START = "Measured by "
"""How a pipeline report (pipeline_report with its command) begins: train.py knows its own report.md by it."""


def _load(path):
    path = Path(path)
    return json.loads(path.read_text()) if path.is_file() else None


def _fmt(value, digits=3):
    return "-" if value is None else f"{value:.{digits}f}"


def _change(metrics, before, after, digits=3):
    if metrics is None or before not in metrics or after not in metrics:
        return "-"
    return f"{metrics[before]:.{digits}f} -> {metrics[after]:.{digits}f}"


def _sized(value, metrics, unit):
    """An eval figure with the eval rows it was measured on beside it ("eval_rows_scored" of run_counts), when the
    step wrote them."""
    if value == "-" or "eval_rows_scored" not in metrics:
        return value
    return f"{value} ({metrics['eval_rows_scored']} {unit})"


def data_rows(label, metrics, steps="optimizer steps"):
    """A step's counts (utils/trainer/loop.py run_counts; step 3 writes the same): the rows each split kept of
    those it read (and how many of them lost earlier turns to fit), the `steps` it trained when --num_train_epochs
    gave fewer than --max_steps asked, and where a stop rule ended it early (utils/trainer/stopping.py)."""
    rows = []
    if "train_rows_kept" in metrics:
        kept = [f"{metrics[f'{split}_rows_kept']} of {metrics[f'{split}_rows_read']}"
                + (f" ({metrics[f'{split}_rows_trimmed']} with earlier turns dropped)"
                   if f"{split}_rows_trimmed" in metrics else "")
                if f"{split}_rows_kept" in metrics else "-" for split in ("train", "eval")]
        rows.append((label, "rows kept (train / eval)", " / ".join(kept)))
    if metrics.get("steps_asked", 0) > metrics.get("total_steps", float("inf")):
        rows.append((label, steps, f"{metrics['total_steps']} of {metrics['steps_asked']} asked "
                                   f"({metrics['epochs_asked']} epochs)"))
    if metrics.get("stopped"):
        stopped = metrics["stopped"]
        rows.append((label, f"{steps}, stopped early",
                     f"{stopped['step']} of {metrics.get('total_steps', '-')}: {stopped['reason']}"))
    if metrics.get("saved_best"):  # --load_best_model_at_end (steps 1, 2, DPO, KTO)
        best = metrics["saved_best"]
        rows.append((label, "model saved: its best evaluation (--load_best_model_at_end)",
                     f"step {best['step']} of {best['last_step']} (eval {best['metric']} {_fmt(best['value'])})"))
    return rows


def answer_rows(before, after, decoding, models):
    """The closing evaluation's rows on what the answers were, before -> after (answer_stats of each model): the
    best constant answer's held-out score, the questions one of k sampled answers solves (pass@k), the distinct
    answers and the most frequent one's share, the answers cut at max_new_tokens."""
    rows = []
    if "best_constant" in before and "best_constant" in after:
        rows.append(("eval", f"held-out score of the best constant answer, {decoding} ({models})",
                     f"{before['best_constant']['all']:.3f} -> {after['best_constant']['all']:.3f}"))
    if "pass_at_k" in before and "pass_at_k" in after and after.get("k", 1) > 1:
        rows.append(("eval", f"held-out questions solved by one of {after['k']} answers (pass@{after['k']}), "
                             f"{decoding} ({models})",
                     f"{before['pass_at_k']['all']:.3f} -> {after['pass_at_k']['all']:.3f}"))
    rows.append(("eval", f"distinct answers / top answer's share, {decoding} ({models})",
                 f"{before['distinct_answers']['all']} / {before['top_answer_share']['all']:.0%} -> "
                 f"{after['distinct_answers']['all']} / {after['top_answer_share']['all']:.0%}"))
    rows.append(("eval", f"answers cut at max_new_tokens ({after.get('max_new_tokens', '-')}), {decoding} ({models})",
                 f"{before['hit_limit']} -> {after['hit_limit']} of {after['answers']}"))
    return rows


def variant_rows(stage, folder, label):
    """(label, --flag, "name: what it is") for each VARIANT_FLAGS flag of `stage` its saved model's settings record
    (the folder's or its actor/'s training_settings.json); a name the registry no longer has is shown alone."""
    folder = Path(folder)
    settings = read_training_settings(folder) or (read_training_settings(folder / "actor")
                                                  if (folder / "actor").is_dir() else {})
    rows = []
    for flag, registry in VARIANT_FLAGS.get(stage, {}).items():
        name = settings.get(flag)
        if isinstance(name, str):
            rows.append((label, f"--{flag}", f"{name}: {registry[name].help}" if name in registry else name))
    return rows


def pipeline_report(stage_dirs, wall_times, evaluation=None, command=None, figures_dir=None, eval_note=None):
    """Markdown for the stages whose metrics exist. stage_dirs: {stage name (train.py's STAGES): its output
    folder}; wall_times: {stage: seconds} of this run; evaluation: `inference.evaluation.evaluate_models` output
    with models "baseline" (step-1 actor) and "finetune" (the final actor); figures_dir: where the pictures are
    drawn (report.md's folder: the markdown links them by name), None for none; eval_note: why the evaluation
    answered fewer prompts than asked (train.py's fit to --time-budget), None where it did not."""
    sft, reward, ppo, rl = (_load(Path(stage_dirs[name]) / "metrics.json") if name in stage_dirs else None
                            for name in ("sft", "reward", "ppo", "rl"))
    rows = []
    if sft:
        perplexity = _change(sft, "perplexity_before", "perplexity_after", 2)
        rows.append(("1 SFT", "eval perplexity", _sized(perplexity, sft, "rows")))
        rows += data_rows("1 SFT", sft)
    rounds = any("@" in name for name in stage_dirs)
    for name, folder in stage_dirs.items():  # each round of train.py's --pair-rounds: "pairs", "dpo", "pairs@2", ...
        stage, _, round_ = name.partition("@")
        label = f" (round {round_ or 1})" if rounds else ""
        pairs = _load(Path(folder) / "meta.json") if stage == "pairs" else None
        if pairs:
            train = pairs.get("counts", {}).get("train", {})
            own = f", {train['pairs_from_data']} of them the data set's own" if train.get("pairs_from_data") else ""
            rows.append((f"2 sampled pairs{label}", "train pairs kept / prompts (mean judge score of the answers)",
                         f"{train.get('pairs', '-')} / {train.get('prompts', '-')} ({_fmt(train.get('mean_score'))}"
                         f"{own})"))
        preference = _load(Path(folder) / "metrics.json") if stage in ("dpo", "kto", "orpo") else None
        if preference:  # the actor's stage 2: its eval figure, its data's counts, its variant
            name = f"2 {stage.upper()}{label}"
            if "accuracy_after" in preference:
                rows.append((name, "eval preference accuracy (chosen > rejected)",
                             _sized(_change(preference, "accuracy_before", "accuracy_after"), preference, "pairs")))
            elif "loss_after" in preference:
                rows.append((name, "eval loss", _sized(_change(preference, "loss_before", "loss_after"), preference,
                                                       "answers")))
            rows += data_rows(name, preference)
            rows += variant_rows(stage, folder, name)
    if reward:
        rows.append(("2 reward model", "eval accuracy (chosen > rejected)",
                     _sized(_change(reward, "accuracy_before", "accuracy_after"), reward, "pairs")))
        rows.append(("2 reward model", "eval mean score chosen / rejected",
                     f"{_fmt(reward.get('chosen_score_after'))} / {_fmt(reward.get('rejected_score_after'))}"))
        rows += data_rows("2 reward model", reward)
    for stage, name, metrics in (("ppo", "3 PPO", ppo), ("rl", "3 RL", rl)):
        if metrics:
            rows.append((name, "mean score (first -> last tenth)", _change(metrics, "score_start", "score_end")))
            kl = _fmt(metrics["kl_end"]) if metrics.get("kl_end") is not None else "- (no KL term: no reference model)"
            rows.append((name, "KL to reference, nats per answer (last tenth)", kl))
            rows.append((name, "answers ending in EOS (last tenth)", _fmt(metrics.get("eos_fraction_end"))))
            if "best_step" in metrics:  # --load_best_model_at_end
                rows.append((name, "actor saved: its best validation evaluation (score)",
                             f"step {metrics['best_step']} ({_fmt(metrics.get('best_validation_score'))})"))
            rows += data_rows(name, metrics, steps="steps (prompt batches)")
            rows += variant_rows(stage, stage_dirs[stage], name)
    if eval_note:
        rows.append(("eval", "held-out prompts answered, cut to the time budget", eval_note))
    if evaluation and {"baseline", "finetune"} <= set(evaluation):
        # The evaluation compares the step-1 actor with the final one, or the base model with the step-1 actor
        # when step 1 is the last (or only the RL actor with the base model, when step 1 could not run).
        later = any(name in stage_dirs for name in ("dpo", "ppo", "rl"))
        models = "step-1 -> final actor" if later and "sft" in stage_dirs else "base model -> final actor"
        for decoding in DECODINGS:
            before, after = evaluation["baseline"].get(decoding, {}), evaluation["finetune"].get(decoding, {})
            if "all" in before and "all" in after:
                rows.append(("eval", f"held-out checker score, {decoding} ({models})",
                             f"{before['all']:.3f} -> {after['all']:.3f}"))
            if "reward" in before and "reward" in after:
                rows.append(("eval", f"held-out reward-model score, {decoding} ({models})",
                             f"{before['reward']:.3f} -> {after['reward']:.3f}"))
            for key, what in TOOL_ROWS:  # an evaluation with --tools
                if key in before and key in after:
                    rows.append(("eval", f"{what}, {decoding} ({models})", f"{before[key]:.3f} -> {after[key]:.3f}"))
            stats = [evaluation[model].get("answer_stats", {}).get(decoding) for model in ("baseline", "finetune")]
            if all(stats):
                rows += answer_rows(*stats, decoding, models)
    for stage, seconds in wall_times.items():
        rows.append((stage, "wall time", f"{seconds:.0f} s"))
    if wall_times:
        rows.append(("all", "wall time", f"{sum(wall_times.values()):.0f} s"))
    rows += [("all", "code commit", code_commit()), ("all", "CPU", cpu_name())]
    gpu = gpu_name()
    if gpu:
        rows.append(("all", "GPU", gpu))
    lines = ["| step | measure | value |", "|---|---|---|"] + [f"| {a} | {b} | {c} |" for a, b, c in rows]
    if command:
        lines.insert(0, f"{REPORT_START}`{command}`:\n")
    table = skill_table(evaluation) if evaluation else ""
    if table:
        lines += ["", table]
    if figures_dir is not None:
        for figure in report_figures(stage_dirs, evaluation, figures_dir):
            lines += ["", figure]
    return "\n".join(lines) + "\n"


TOOL_ROWS = (("all_without_tools", "held-out checker score without the tool"),
             ("tool_call_rate", "answers calling the tool"), ("tool_success_rate", "tool calls that ran cleanly"))
"""The report's rows of an evaluation with --tools (inference.evaluation.TOOL_FIGURES)."""


def skill_table(evaluation):
    """Held-out checker score per group (the built-in task's skills, a reasoning-gym spec's tasks), per model and
    decoding; then a "best constant" row, the best score one answer given to every question of a group earned
    (the best of answer_stats' over the models and decodings); then, under the table, a line for each model and
    decoding that mostly gives one answer and scores no more than that answer (scores_as_a_constant). "" when no
    checker scored the answers (a reward model's scores are report rows)."""
    if not any("all" in result.get(decoding, {}) for result in evaluation.values() for decoding in DECODINGS):
        return ""
    names = {"baseline": "before (baseline)", "finetune": "after (fine-tuned)"}
    groups = {key: None for result in evaluation.values() for decoding in DECODINGS
              for key in result.get(decoding, {}) if key not in ("all", "reward", *TOOL_FIGURES)}
    columns = ["all", *groups]
    lines = ["| actor | decoding | " + " | ".join(columns) + " |", "|---|---|" + "---|" * len(columns)]
    notes = []
    for model, result in evaluation.items():
        for decoding in DECODINGS:
            scores = result.get(decoding, {})
            if "all" in scores:
                cells = " | ".join(_fmt(scores.get(column)) for column in columns)
                lines.append(f"| {names.get(model, model)} | {decoding} | {cells} |")
            stats = result.get("answer_stats", {}).get(decoding)
            if stats and scores_as_a_constant(scores.get("all"), stats):
                notes.append(f"{names.get(model, model)}, {decoding}: {constant_likeness(stats)} and the score "
                             f"{scores['all']:.3f} is not above the best constant answer's, "
                             f"{stats['best_constant']['all']:.3f} "
                             f"({stats['best_constant_answer']['all']!r} to every question): the "
                             f"{'gain' if model == 'finetune' else 'score'} is a constant answer, not the skill.")
    constants = [result["answer_stats"][decoding]["best_constant"] for result in evaluation.values()
                 for decoding in DECODINGS if "best_constant" in result.get("answer_stats", {}).get(decoding, {})]
    if constants:
        best = [max((constant[column] for constant in constants if column in constant), default=None)
                for column in columns]
        lines.append("| best constant | - | " + " | ".join(_fmt(value) for value in best) + " |")
    return "\n".join(lines + ([""] + notes if notes else []))
