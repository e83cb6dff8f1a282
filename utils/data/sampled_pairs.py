"""Preference pairs from a policy's own answers, judged by a reward function: the data of online / iterative DPO
(sample K answers per prompt from the current policy, score them, train on the best against the worst), and of a
reward model that should tell the actor's own right answers from its own wrong ones.

For each prompt, K sampled answers a_1..a_K with judge scores r_1..r_K:

    chosen = a_i,  i = argmax_k r_k        rejected = a_j,  j = argmin_k r_k       (the first of equal scores)

and a prompt whose K scores are all equal (max_k r_k = min_k r_k) gives no pair: it carries no preference.
Empty answers (EOS first) are left out of the K before choosing: the local data format refuses empty strings.
Where no prompt of a split gives a pair (an actor that fails, or solves, every question alike), the split takes
the data set's own pairs of those prompts instead, where it has them (`data_pairs`, counted and said), so that a
task the actor cannot yet do still trains a reward model rather than ending the run.

The pairs are written as a local data folder (`train.jsonl`, `eval.jsonl`: the pairs of the prompts of the train
and of the eval split) that `--data_path <folder>` reads in steps 2 and DPO; `meta.json`, written last, holds the
settings they were made with and the counts. Steps 2 and DPO train on all of it with `--data_split 0,1`
(PAIRS_DATA_SPLIT: their part, part 2, is the whole).
"""
import json
from dataclasses import dataclass
from pathlib import Path

from utils.data.data_utils import get_raw_dataset, reference_answers, split_part_indices
from utils.runtime.errors import DataError
from utils.runtime.paths import write_file_atomic

SPLITS = ("train", "eval")
META_FILE = "meta.json"
PAIRS_DATA_SPLIT = "0,1"
"""The --data_split under which step 2 (part 2) trains on a whole pairs folder."""


def best_and_worst(scores):
    """(i, j) = (argmax_k scores[k], argmin_k scores[k]), the first index of equal scores; None when all scores
    are equal (no preference)."""
    best = max(range(len(scores)), key=lambda k: (scores[k], -k))
    worst = min(range(len(scores)), key=lambda k: (scores[k], k))
    return None if scores[best] == scores[worst] else (best, worst)


@dataclass
class PairCounts:
    """What became of the prompts of one split: pairs kept, prompts skipped (all K scores equal; fewer than two
    non-empty answers), and the scores of all sampled answers, for their mean."""
    prompts: int = 0
    pairs: int = 0
    all_equal: int = 0
    too_few_answers: int = 0
    empty_answers: int = 0
    from_data: int = 0  # pairs the data set gave (data_pairs), counted in `pairs` too
    score_sum: float = 0.0
    answers: int = 0

    @property
    def mean_score(self):
        return self.score_sum / self.answers if self.answers else 0.0

    def summary(self, what):
        return (f"{what}: {self.prompts} prompts, {self.pairs} pairs kept, {self.all_equal} skipped (all scores "
                f"equal), {self.too_few_answers} skipped (fewer than 2 non-empty answers), {self.empty_answers} "
                f"empty answers left out; mean score {self.mean_score:.3f} over {self.answers} answers"
                + (f"; {self.from_data} pairs are the data set's own (no prompt's answers scored apart)"
                   if self.from_data else ""))

    def as_dict(self):
        return {"prompts": self.prompts, "pairs": self.pairs, "skipped_all_equal": self.all_equal,
                "skipped_too_few_answers": self.too_few_answers, "empty_answers": self.empty_answers,
                "pairs_from_data": self.from_data, "mean_score": self.mean_score}


def judged_pairs(prompts, answers, scores, counts):
    """Pair rows {"prompt", "chosen", "rejected"} of prompts answered K times each: answers[k * n + i] (scores[k *
    n + i]) answers prompts[i], n = len(prompts), as `sampled_answers` of inference/sample_pairs.py lays them out.
    chosen is a best-scored non-empty answer, rejected a worst-scored one (`best_and_worst`); `counts` (PairCounts) is updated."""
    n = len(prompts)
    rows = []
    for i, prompt in enumerate(prompts):
        group = [(answers[k], scores[k]) for k in range(i, len(answers), n)]
        kept = [(answer, score) for answer, score in group if answer]
        counts.prompts += 1
        counts.empty_answers += len(group) - len(kept)
        counts.answers += len(group)
        counts.score_sum += sum(score for _, score in group)
        if len(kept) < 2:
            counts.too_few_answers += 1
            continue
        chosen_rejected = best_and_worst([score for _, score in kept])
        if chosen_rejected is None:
            counts.all_equal += 1
            continue
        best, worst = chosen_rejected
        rows.append({"prompt": prompt, "chosen": kept[best][0], "rejected": kept[worst][0]})
        counts.pairs += 1
    return rows


def data_pairs(rows, counts):
    """The data set's own pair rows {"prompt", "chosen", "rejected"} of `rows` ((prompt, chosen, rejected) of
    `part_rows`, answers None where a row has none): what a split whose sampled answers gave no pair trains on.
    `counts` (PairCounts) counts them in `pairs` and `from_data`."""
    pairs = [{"prompt": prompt, "chosen": chosen, "rejected": rejected} for prompt, chosen, rejected in rows
             if chosen is not None and rejected is not None and chosen != rejected]
    counts.pairs += len(pairs)
    counts.from_data += len(pairs)
    return pairs


def part_rows(data_paths, data_split, train_phase, seed, output_path, split_name, columns=None):
    """(prompt, chosen, rejected) of each row of part `train_phase` of `data_split` of each data set's `split_name`
    split (its columns renamed by `columns`: get_raw_dataset; answers None where a row or the data set has none:
    the actor's own answers are judged without them), in the order the step of that phase reads its rows
    (`utils.data.data_utils.split_part_indices`); rows without a prompt left out."""
    found = []
    for data_path in data_paths:
        raw = get_raw_dataset(data_path, seed, columns)
        rows = raw.get_train_data() if split_name == "train" else raw.get_eval_data()
        if rows is None:
            continue
        part = split_part_indices(output_path, raw.clean_name, seed, split_name, data_split, train_phase - 1,
                                  len(rows))
        found += [(prompt, *reference_answers(raw, row)) for row in rows.select(part.tolist())
                  if (prompt := raw.get_prompt(row))]
    return found


def read_meta(folder):
    """The meta.json of a finished pairs folder ({} if there is none or it is unreadable)."""
    path = Path(folder) / META_FILE
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def is_complete(folder, settings):
    """Whether `folder` holds pairs made with exactly `settings` (its meta.json, written last, says so)."""
    meta = read_meta(folder)
    return meta.get("settings") == settings and all((Path(folder) / f"{split}.jsonl").is_file() for split in SPLITS)


def write_pairs(folder, rows_by_split, settings, counts_by_split):
    """Write `train.jsonl` and `eval.jsonl` (one JSON object a line), each atomically, then `meta.json` (settings
    and counts). An earlier meta.json is removed first, so a folder interrupted half-way never reads as complete.
    DataError naming the split when one has no pairs (steps 2 and DPO could not read it)."""
    for split in SPLITS:
        if not rows_by_split[split]:
            raise DataError(f"no {split} pairs: all {counts_by_split[split].prompts} {split} prompts were skipped "
                            "(every answer scored the same, or fewer than 2 were non-empty); sample more answers "
                            "per prompt, at a higher temperature, or from more prompts")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / META_FILE).unlink(missing_ok=True)
    for split in SPLITS:
        write_file_atomic(folder / f"{split}.jsonl", lambda f, rows=rows_by_split[split]: f.writelines(
            json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    meta = {"settings": settings, "counts": {split: counts_by_split[split].as_dict() for split in SPLITS}}
    write_file_atomic(folder / META_FILE, lambda f: json.dump(meta, f, indent=2))
