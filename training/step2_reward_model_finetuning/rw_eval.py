"""Step 2 evaluation: what a trained reward model thinks of answers.

Three modes, all scoring prompt + answer + EOS tokenized exactly as step 2 tokenizes its pairs, at the last real
token (the end score step 2 trains and step 3 uses as the reward):

- default: a few built-in task prompts, each with a good and a bad answer (as DeepSpeed-Chat's rw_eval.py);
  prints both scores and whether the good answer scored higher.
- `--pairs_file F` (JSON lines of prompt/chosen/rejected, the local data format): each pair's scores for the
  first --num_examples, then the accuracy (chosen above rejected) and the mean chosen/rejected scores over the
  file, and the accuracy per skill when every prompt is a built-in task prompt (its eval.json, say). Pairs step 2
  would skip (identical answers, longer than --max_seq_len) are skipped and counted.
- `--heldout` (the built-in task only): for every held-out prompt, answers at every checker level (exact, near
  miss, right format only, junk, " I don't know.", truncated); prints the Pearson and Spearman correlations of
  reward-model scores with checker scores, and the pairwise accuracy over pairs of answers to the same prompt
  whose checker scores differ, overall and per skill, then per skill for the hardest pairs alone: the exact
  answer against a near miss (a sum off by one or two, an anagram, another capital).

    python training/step2_reward_model_finetuning/rw_eval.py --model_name_or_path output/reward-models/tiny --heldout
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from the clone: chatrlhf installs no packages
import json
import random

import numpy as np

import utils.runtime.threads  # noqa: F401 (first: sets OpenMP threads and wait policy before torch loads)
# isort: split
import torch

from inference.evaluation import are_task_prompts
from utils.data import builtin_task as task
from utils.data.data_utils import SampleCounter, pair_sample
from utils.model.model_utils import check_fits_context, resolve_model_path
from utils.model.reward_model import load_reward_model, score_answers, score_sequences
from utils.model.save import trained_sequence_length
from utils.runtime.args import (ArgumentParser, add_batch_size_arg, add_column_args, add_max_seq_len_arg,
                                add_model_name_or_path_arg, add_output_json_arg, add_seed_arg,
                                add_trust_remote_code_arg, check_flag_ranges, column_keys)
from utils.runtime.errors import ConfigError, DataError, cli_entry
from utils.runtime.paths import check_not_an_input, check_output_file, write_file_atomic

DEFAULT_MAX_SEQ_LEN = 256  # for a folder without saved training settings

EXAMPLES = (
    # (question, good answer, bad answer): the bad ones are near misses, answers that do not stop, wrong formats
    ("What is 7 + 12?", " 19", " 21"),
    ("What is 3 + 5?", " 8", " I don't know."),
    ('Reverse the word "cat".', " tac", " cat"),
    ('Reverse the word "plan".', " nalp", " nalp Human:"),
    ("What is the capital of France?", " Paris", " Rome"),
    ("Which city is the capital of Japan?", " Tokyo", " Japan"),
    ('Say "apple" in uppercase.', " APPLE", " apple"),
    ('Say "house" in uppercase.', " HOUSE", " HOUSE is the answer."),
)


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    add_model_name_or_path_arg(parser, help="A reward-model folder (step 2 output).", required=True)
    parser.add_argument("--pairs_file", type=str, default=None,
                        help="JSON lines (or a JSON array, or Parquet) of pairs in any shape step 2 reads, e.g. "
                             "{prompt, chosen, rejected} used verbatim (columns renamed by the data-columns flags).")
    parser.add_argument("--heldout", action="store_true",
                        help="Correlate the scores with the built-in task's checker on its held-out prompts.")
    parser.add_argument("--num_examples", type=int, default=8,
                        help="Pairs or held-out prompts printed one by one (0: none); the default mode scores "
                             "this many of its 8 examples (0: all).")
    add_max_seq_len_arg(parser, default=None, auto=False,
                        default_help=f"the model's training run's, from its saved settings; else {DEFAULT_MAX_SEQ_LEN}")
    add_batch_size_arg(parser, what="Sequences scored together")
    add_seed_arg(parser, covers="the --heldout candidate answers")
    add_output_json_arg(parser, what="every score")
    add_trust_remote_code_arg(parser)
    add_column_args(parser)
    args = parser.parse_args(argv)
    check_flag_ranges(args)
    column_keys(args)
    if args.pairs_file and args.heldout:
        raise ConfigError("--pairs_file and --heldout are two different evaluations; pass one")
    check_output_file("--output_json", args.output_json)
    return args


# --------------------------------------------------------------------------- agreement with the checker


def pearson(x, y):
    """Pearson correlation sum(dx dy) / sqrt(sum(dx^2) sum(dy^2)), d = deviation from the mean (nan when
    either side is constant)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    dx, dy = x - x.mean(), y - y.mean()
    denominator = np.sqrt((dx * dx).sum() * (dy * dy).sum())
    return float((dx * dy).sum() / denominator) if denominator > 0 else float("nan")


def average_ranks(values):
    """Ranks from 1, ties sharing the mean of the ranks they span: [10, 20, 20, 30] -> [1, 2.5, 2.5, 4]."""
    values = np.asarray(values, dtype=float)
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    start = 0
    for end in range(1, len(values) + 1):
        if end == len(values) or values[order[end]] != values[order[start]]:
            ranks[order[start:end]] = (start + end + 1) / 2  # mean of the 1-based ranks start+1 .. end
            start = end
    return ranks


def spearman(x, y):
    """Spearman rank correlation: the Pearson correlation of the average ranks."""
    return pearson(average_ranks(x), average_ranks(y))


def pairwise_agreement(checker_scores, rm_scores, levels=None):
    """(agreeing, total) over pairs of answers whose checker scores differ: the reward model agrees when it
    scores the better answer strictly higher. With `levels=(high, low)` only pairs of an answer scoring `high`
    and one scoring `low` count (e.g. (1.0, 0.5): the exact answer against a near miss)."""
    agreeing = total = 0
    for i in range(len(checker_scores)):
        for j in range(i + 1, len(checker_scores)):
            if checker_scores[i] != checker_scores[j]:
                better, worse = (i, j) if checker_scores[i] > checker_scores[j] else (j, i)
                if levels is not None and (checker_scores[better], checker_scores[worse]) != tuple(levels):
                    continue
                total += 1
                agreeing += rm_scores[better] > rm_scores[worse]
    return agreeing, total


def accuracy_by_group(groups, chosen_scores, rejected_scores):
    """{group: mean over its pairs of [chosen score > rejected score]}, groups in the order first seen (a tie
    does not count as right)."""
    right = {}
    for group, chosen, rejected in zip(groups, chosen_scores, rejected_scores):
        right.setdefault(group, []).append(chosen > rejected)
    return {group: sum(values) / len(values) for group, values in right.items()}


# --------------------------------------------------------------------------- the three modes


def show(text, width=40):
    """`text` as a quoted one-line repr of at most `width` characters."""
    text = repr(text)
    return text if len(text) <= width else text[:width - 3] + "..."


def eval_examples(model, tokenizer, args):
    examples = EXAMPLES[:args.num_examples] if args.num_examples else EXAMPLES
    prompts = [task.format_prompt(question) for question, _, _ in examples]
    goods = score_answers(model, tokenizer, prompts, [good for _, good, _ in examples], args.batch_size, "good")
    bads = score_answers(model, tokenizer, prompts, [bad for _, _, bad in examples], args.batch_size, "bad")
    print(f"{'prompt':40}  {'good answer':14} {'score':>7}   {'bad answer':24} {'score':>7}  good > bad")
    results = []
    for prompt, (_, good, bad), good_score, bad_score in zip(prompts, examples, goods, bads):
        print(f"{show(prompt):40}  {show(good, 14):14} {good_score:7.3f}   {show(bad, 24):24} {bad_score:7.3f}  "
              f"{'yes' if good_score > bad_score else 'NO'}")
        results.append({"prompt": prompt, "good": good, "bad": bad, "good_score": good_score,
                        "bad_score": bad_score})
    wins = sum(good > bad for good, bad in zip(goods, bads))
    print(f"good answer scored higher in {wins}/{len(examples)} examples")
    return {"mode": "examples", "accuracy": wins / len(examples), "examples": results}


def eval_pairs(model, tokenizer, args):
    from utils.data.pair_formats import UNUSABLE
    from utils.data.raw_datasets import read_local_split

    rows = read_local_split(args.pairs_file, column_keys(args))
    counter = SampleCounter(args.pairs_file)
    kept = []
    for row in rows:
        if row["prompt"] is None:  # a row the text form cannot hold (pair_formats)
            counter.skip(row.get(UNUSABLE) or "no prompt")
            continue
        if row["chosen"] is None or row["rejected"] is None:  # a prompt alone, a tie, or an answer left empty
            counter.skip(row.get(UNUSABLE) or "no answer")
            continue
        sample = pair_sample(tokenizer, row["prompt"], row["chosen"], row["rejected"], args.max_seq_len, counter)
        if sample is not None:
            kept.append((row, sample))
    print(counter.report())
    if not kept:
        raise DataError(f"{args.pairs_file}: no pair left to score (see the skipped counts above)")
    chosen = score_sequences(model, [s["chosen_ids"] for _, s in kept], tokenizer.pad_token_id, args.batch_size,
                             "chosen")
    rejected = score_sequences(model, [s["rejected_ids"] for _, s in kept], tokenizer.pad_token_id,
                               args.batch_size, "rejected")
    pairs = [dict(row, chosen_score=c, rejected_score=r) for (row, _), c, r in zip(kept, chosen, rejected)]
    if args.num_examples:
        print(f"{'prompt':40}  {'chosen':20} {'score':>7}   {'rejected':20} {'score':>7}  chosen > rejected")
    for pair in pairs[:args.num_examples]:
        print(f"{show(pair['prompt']):40}  {show(pair['chosen'], 20):20} {pair['chosen_score']:7.3f}   "
              f"{show(pair['rejected'], 20):20} {pair['rejected_score']:7.3f}  "
              f"{'yes' if pair['chosen_score'] > pair['rejected_score'] else 'NO'}")
    summary = {"accuracy": float(np.mean([c > r for c, r in zip(chosen, rejected)])),
               "chosen_score": float(np.mean(chosen)), "rejected_score": float(np.mean(rejected)),
               "num_pairs": len(pairs), "skipped": counter.skipped}
    print(f"accuracy {summary['accuracy']:.4f} over {len(pairs)} pairs; mean score chosen "
          f"{summary['chosen_score']:.3f}, rejected {summary['rejected_score']:.3f}")
    prompts = [pair["prompt"] for pair in pairs]
    if are_task_prompts(prompts):
        by_skill = accuracy_by_group([task.parse_prompt(prompt)[0] for prompt in prompts], chosen, rejected)
        summary["accuracy_by_skill"] = {skill: by_skill[skill] for skill in task.SKILLS if skill in by_skill}
        print("accuracy by skill: " + ", ".join(f"{skill} {value:.4f}"
                                                for skill, value in summary["accuracy_by_skill"].items()))
    return {"mode": "pairs", "pairs_file": args.pairs_file, **summary, "pairs": pairs}


def eval_heldout(model, tokenizer, args):
    from utils.data.raw_datasets import builtin_data_dir

    rng = random.Random(args.seed)
    records = task.heldout_prompts(builtin_data_dir())
    groups = [(record, task.candidate_answers(record["prompt"], rng)) for record in records]
    prompts = [record["prompt"] for record, answers in groups for _ in answers]
    answers = [answer for _, group_answers in groups for answer in group_answers]
    checker = [task.score_answer(prompt, answer) for prompt, answer in zip(prompts, answers)]
    rm = score_answers(model, tokenizer, prompts, answers, args.batch_size, "score")

    by_skill, exact_by_skill, start, shown = {}, {}, 0, []
    for record, group_answers in groups:
        end = start + len(group_answers)
        agreeing, total = pairwise_agreement(checker[start:end], rm[start:end])
        counts = by_skill.setdefault(record["skill"], [0, 0])
        counts[0], counts[1] = counts[0] + agreeing, counts[1] + total
        exact_agreeing, exact_total = pairwise_agreement(checker[start:end], rm[start:end], levels=(1.0, 0.5))
        counts = exact_by_skill.setdefault(record["skill"], [0, 0])
        counts[0], counts[1] = counts[0] + exact_agreeing, counts[1] + exact_total
        if len(shown) < args.num_examples:
            ranked = sorted(range(start, end), key=lambda k: -rm[k])
            shown.append(f"{agreeing}/{total} pairs in order  {show(record['prompt'], 44):44}  by RM score: "
                         + "  ".join(f"{answers[k]!r}({checker[k]:g})" for k in ranked))
        start = end
    agreeing, total = (sum(counts[i] for counts in by_skill.values()) for i in (0, 1))
    levels = sorted(set(checker), reverse=True)
    result = {
        "mode": "heldout", "num_prompts": len(records), "num_answers": len(answers),
        "pearson": pearson(rm, checker), "spearman": spearman(rm, checker),
        "pairwise_accuracy": agreeing / total, "num_pairs": total,
        "pairwise_accuracy_by_skill": {skill: a / t for skill, (a, t) in by_skill.items()},
        "exact_over_near_miss_by_skill": {skill: a / t for skill, (a, t) in exact_by_skill.items() if t},
        "mean_score_by_checker_level": {
            str(level): float(np.mean([s for s, c in zip(rm, checker) if c == level])) for level in levels},
        "answers": [{"prompt": p, "answer": a, "checker_score": c, "rm_score": s}
                    for p, a, c, s in zip(prompts, answers, checker, rm)],
    }
    if shown:
        print("\n".join(shown))
    print(f"{len(records)} held-out prompts, {len(answers)} answers; checker score 1 exact, 0.5 near miss, "
          "0.25 right format only, 0 otherwise")
    print("mean RM score by checker score: " + ", ".join(
        f"{level:g}: {result['mean_score_by_checker_level'][str(level)]:.3f} ({checker.count(level)})"
        for level in levels))
    print(f"pearson {result['pearson']:.4f}  spearman {result['spearman']:.4f}  "
          f"pairwise accuracy {result['pairwise_accuracy']:.4f} over {total} pairs ("
          + ", ".join(f"{skill} {value:.3f}" for skill, value in result["pairwise_accuracy_by_skill"].items())
          + ")")
    print("exact answer above a near miss: " + ", ".join(
        f"{skill} {value:.3f}" for skill, value in result["exact_over_near_miss_by_skill"].items()))
    return result


@cli_entry
def main(argv=None):
    args = parse_args(argv)
    check_not_an_input("--output_json", args.output_json, [("--pairs_file", args.pairs_file),
                                                           ("--model_name_or_path", args.model_name_or_path)])
    from utils.runtime.dist import quiet_transformers

    quiet_transformers()
    if args.max_seq_len is not None:
        check_fits_context(resolve_model_path(args.model_name_or_path), {"--max_seq_len": args.max_seq_len},
                           args.trust_remote_code)
    model, tokenizer = load_reward_model(args.model_name_or_path, args.trust_remote_code)
    if torch.cuda.is_available():
        model.cuda()
    if args.max_seq_len is None:
        args.max_seq_len = trained_sequence_length(resolve_model_path(args.model_name_or_path)) or DEFAULT_MAX_SEQ_LEN
    print(f"reward model {args.model_name_or_path} (--max_seq_len {args.max_seq_len})")
    if args.heldout:
        result = eval_heldout(model, tokenizer, args)
    elif args.pairs_file:
        result = eval_pairs(model, tokenizer, args)
    else:
        result = eval_examples(model, tokenizer, args)
    if args.output_json:
        write_file_atomic(args.output_json,
                          lambda f: json.dump({"model": args.model_name_or_path, **result}, f, indent=2))
        print(f"wrote {args.output_json}")


if __name__ == "__main__":
    main()
