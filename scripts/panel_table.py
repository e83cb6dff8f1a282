"""A Markdown table of a panel of reasoning-gym runs (one `train.py --output-dir` per task and seed), from each
run's own `evaluation.json`, `metrics.json` files and `report.md`: what docs/panel.md quotes, so that no result
table is typed by hand.

    python scripts/panel_table.py --title "The panel, seed 1234" runs/chain_sum-1234 runs/gcd-1234 ... >> docs/x.md

A row per run: the task, the base model's score (where the run folder holds `base-evaluation.json`: prompt_eval.py
with the base model as its baseline, the closing evaluation's flags), step 1's optimizer steps and why it stopped,
the held-out verifier score of the step-1 and the RL actor, sampled and greedy, the share of greedy answers with
full marks (where the verifier gives partial credit, a mean can rise without one more answer right), the sampled
pass@k of both (the questions one of k answers solves: what RL can find and reinforce), the greedy score of the
best constant answer and the RL actor's distinct greedy answers, the steps RL trained and the whole
command's wall time; then whether the run meets goal 2 (+0.10 sampled and greedy, and neither a constant answer's
score nor partial credit alone: where the verifier gives partial credit, the share of greedy answers with full
marks must rise by +0.10 too) and how many runs do.
"""
import json
import os
import shlex
import sys
from pathlib import Path

if __name__ == "__main__" and os.environ.get("PYTHONHASHSEED") != "0":
    # train.py runs every stage and the evaluation with PYTHONHASHSEED=0, and some reasoning-gym tasks generate
    # other questions under another hash seed (isomorphic_strings): the answers are scored against the same ones.
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "PYTHONHASHSEED": "0"})
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from inference.evaluation import answer_stats, heldout_set, scores_as_a_constant  # noqa: E402
from utils.runtime.tool_format import ToolFormat  # noqa: E402
from scripts.seed_table import command_of, parse_table_args, provenance  # noqa: E402

GOAL = 0.10


def _json(path):
    return json.loads(path.read_text()) if path.is_file() else {}


def _only(folder, pattern):
    found = sorted(folder.glob(pattern))
    return found[0] if found else folder / "missing"


def _stop(metrics):
    """Why a stage stopped, and (--load_best_model_at_end) which step's weights it saved where not its last."""
    stopped, best = metrics.get("stopped"), metrics.get("saved_best")
    saved = f"; saved {best['step']}" if best and best["step"] != best["last_step"] else ""
    if not stopped:
        return "budget" + saved
    reason = stopped["reason"]
    return ("time" if "max_train_minutes" in reason else "deadline" if "--deadline" in reason
            else "idle" if "stop_after_idle_rounds" in reason else "eval score" if "eval score" in reason
            else "eval loss") + saved


def _wall_time(folder):
    """The report's `all | wall time` row, in minutes."""
    for line in (folder / "report.md").read_text().splitlines() if (folder / "report.md").is_file() else []:
        if line.startswith("| all | wall time |"):
            return float(line.split("|")[3].split()[0]) / 60
    return None


def _answer_stats(folder, result, decoding):
    """A model's answer_stats of one decoding, recomputed from the answers evaluation.json keeps with the verifier
    of the run's `--data-path` (so that every table reads by the definitions of now: pass@k, scored_as_constant),
    else as the run reported them."""
    stats = result["answer_stats"][decoding]
    words = shlex.split(command_of(folder))
    spec = words[words.index("--data-path") + 1] if "--data-path" in words[:-1] else None
    answers = result.get("answers", {}).get(decoding)
    if not spec or not answers:
        return stats
    if "--tools" in words:  # the answers kept are whole trajectories: the verifier reads their final answers
        if any("tool_tags" in word or "tool-tags" in word for word in words):
            return stats  # tags of its own, which the command's words do not reliably give
        answers = [ToolFormat().final_answer(answer) for answer in answers]
    prompts, checker = heldout_set([spec])
    prompts = prompts[:len(result["answers"]["greedy"])]
    return {**stats, **answer_stats(prompts, answers, checker)}


def _pass_at_k(folder, result):
    """A model's sampled pass@k (the questions one of its k answers solves) and k; None where it cannot be had."""
    stats = _answer_stats(folder, result, "sampled")
    return (stats["pass_at_k"]["all"], stats["k"]) if "pass_at_k" in stats else None


def run_row(folder):
    folder = Path(folder)
    evaluation = _json(folder / "evaluation.json")
    before, after = evaluation["baseline"], evaluation["finetune"]
    step1 = _json(_only(folder, "actor-models/*") / "metrics.json")
    rl = _json(_only(folder, "step3-models/*") / "metrics.json")
    gains = {decoding: after[decoding]["all"] - before[decoding]["all"] for decoding in ("sampled", "greedy")}
    constant = any(scores_as_a_constant(after[decoding]["all"], _answer_stats(folder, after, decoding))
                   for decoding in ("sampled", "greedy"))
    solved = [result["greedy"].get("solved") for result in (before, after)]
    partial = None not in solved and round(solved[1] - solved[0], 9) < GOAL <= round(min(gains.values()), 9)
    stats = after["answer_stats"]["greedy"]
    base = _json(folder / "base-evaluation.json").get("baseline")
    passes = [_pass_at_k(folder, result) for result in (before, after)]
    return {
        "task": folder.name, "step1": f"{step1.get('optimizer_steps', '-')} ({_stop(step1)})",
        "base": f"{base['sampled']['all']:.3f} / {base['greedy']['all']:.3f}" if base else "-",
        "sampled": f"{before['sampled']['all']:.3f} -> {after['sampled']['all']:.3f} ({gains['sampled']:+.3f})",
        "greedy": f"{before['greedy']['all']:.3f} -> {after['greedy']['all']:.3f} ({gains['greedy']:+.3f})",
        "solved": (f"{before['greedy']['solved']:.3f} -> {after['greedy']['solved']:.3f}"
                   if "solved" in before["greedy"] and "solved" in after["greedy"] else "-"),
        "pass": (f"{passes[0][0]:.3f} -> {passes[1][0]:.3f}" if all(passes) else "-"),
        "constant": f"{stats['best_constant']['all']:.3f}",
        "distinct": f"{stats['distinct_answers']['all']} ({stats['top_answer_share']['all']:.0%})",
        "rl": f"{rl.get('total_steps', '-') if not rl.get('stopped') else rl['stopped']['step']} "
              f"({_stop(rl)})",
        "minutes": f"{_wall_time(folder):.1f}" if _wall_time(folder) is not None else "-",
        "met": round(min(gains.values()), 9) >= GOAL and not constant and not partial,  # 0.77 - 0.67 is 0.0999...
        "constant_answer": constant, "partial_credit": partial,
    }


def table(folders, title):
    rows = [run_row(folder) for folder in folders]
    lines = [f"### {title}", "", f"Command: `{command_of(folders[0])}` (each task's spec, `--seed S --output-dir "
             f"<run>`); {provenance(folders)}.", "",
             "| run | base model, sampled / greedy | step-1 steps (stop) | sampled, step 1 -> RL | greedy, step 1 -> RL | solved, greedy "
             "| pass@k, step 1 -> RL | best constant, greedy | distinct greedy answers (top share) | RL rounds (stop) | minutes | goal |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        verdict = ("met" if row["met"] else "constant answer" if row["constant_answer"] else
                   "partial credit" if row["partial_credit"] else "-")
        lines.append(f"| {row['task']} | {row['base']} | {row['step1']} | {row['sampled']} | {row['greedy']} | {row['solved']} "
                     f"| {row['pass']} | {row['constant']} "
                     f"| {row['distinct']} | {row['rl']} | {row['minutes']} | {verdict} |")
    met = sum(row["met"] for row in rows)
    lines += ["", f"Goal 2 (+{GOAL:.2f} sampled and greedy over the step-1 actor, not a constant answer's score nor "
                  f"partial credit alone) met in {met} of {len(rows)} runs ({met / len(rows):.0%})."]
    return "\n".join(lines) + "\n"


def main(argv=None):
    args = parse_table_args(__doc__.splitlines()[0], argv, title="Panel")
    print(table(args.runs, args.title))


if __name__ == "__main__":
    main()
