"""From raw data sets to batches: DeepSpeed-Chat's `data_split` across the training steps, tokenization with
answer-only labels, and the collators of each kind of sample.

`--data_split 2,4,4` cuts every data set's train and eval splits into parts in those proportions, after a seeded
shuffle: step 1 (SFT) uses part 0, step 2 (reward model or DPO) part 1, step 3 (RL) part 2, so no example is
trained on twice. A split may have fewer or more parts, as long as every step that runs has its own.
Phase 1 makes SFT samples (prompt + answer), phase 2 preference pairs, phase 3 prompts. The shuffled indices of each part are cached in `--data_output_path` as `.npy` files written
and read without pickle.
"""
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from utils.data.prompting import (dialogue_system, dialogue_text, encode_prompt_text, model_answer, model_prompt,
                                  parse_dialogue, shorter_prompts, with_system)
from utils.data.raw_datasets import (HUB_DATASETS, LOCAL_SUFFIXES, Builtin, LoadedDataset, LocalJsonFile, RawDataset,
                                     builtin_data_dir, is_saved_dataset, load_hub, local_records, split_choice)
from utils.data.reasoning_gym_data import ReasoningGym
from utils.data.text_files import DEAD_LINK, check_text, data_suffix, read_lines
from utils.runtime.args import AUTO, column_flag, column_keys, is_auto
from utils.runtime.dist import print_rank_0
from utils.runtime.errors import ConfigError, DataError
from utils.runtime.paths import write_file_atomic

IGNORE_INDEX = -100
PHASES = (1, 2, 3)
KNOWN_NAMES = (*HUB_DATASETS, "builtin", "local/jsonfile")
HUB_NAME = re.compile(r"[A-Za-z0-9_][\w.-]*(/[\w.-]+)?")
"""A name that may be a hub data set's (`name` or `owner/name`), not a local path (`./x`, `/x`, `~/x`, `a/b/c`)."""


def has_fixed_fields(name: str) -> bool:
    """Whether data set `name`'s fields are fixed (a registry name, builtin, a reasoning-gym spec): the
    --<field>_key flags do not rename its columns."""
    return name in HUB_DATASETS or name == "builtin" or name.startswith("reasoning_gym:")


def check_columns_apply(data_paths: list[str], columns: dict | None, dashes: bool = False) -> None:
    """Refuse --<field>_key flags (`dashes`: train.py's --<field>-key) where no data path has columns for them to
    name (they would be ignored)."""
    if columns and all(has_fixed_fields(name) for name in data_paths):
        flags = ", ".join(column_flag(field).replace("_", "-") if dashes else column_flag(field) for field in columns)
        raise ConfigError(f"{flags} names columns of local files, hub data sets or save_to_disk folders; "
                          f"{' '.join(data_paths)} has fixed fields, which the flag would not rename")


def get_raw_dataset(name: str, seed: int, columns: dict | None = None) -> RawDataset:
    """The raw data set called `name`: a known hub name, `builtin`, `local/jsonfile` (./data under the current
    directory), a `reasoning_gym:` spec, an existing local path (a save_to_disk folder, or local files), or any
    other name `datasets.load_dataset` reads (from the Hugging Face cache offline). `columns` ({field: column},
    the --<field>_key flags) renames the columns of the last three kinds; the others have fixed fields."""
    if name in HUB_DATASETS:  # the fixed-field kinds first (has_fixed_fields)
        return HUB_DATASETS[name](seed=seed)
    if name == "builtin":
        return Builtin(seed=seed)
    if name == "local/jsonfile":
        data = Path.cwd() / "data"
        if not data.is_dir():
            raise DataError(f"local/jsonfile: {data}: no such directory (local/jsonfile reads train.json "
                            f"and eval.json from ./data under the current directory)")
        return LocalJsonFile(data, seed=seed, name="local/jsonfile", columns=columns)
    if name.startswith("reasoning_gym:"):
        return ReasoningGym(name, seed=seed)
    name, splits = split_choice(name) if not os.path.exists(os.path.expanduser(name)) else (name, {})
    if os.path.exists(os.path.expanduser(name)):
        if is_saved_dataset(os.path.expanduser(name)):
            return LoadedDataset.from_disk(name, seed=seed, columns=columns, chosen_splits=splits)
        return LocalJsonFile(name, seed=seed, columns=columns, splits=splits)
    if os.path.islink(os.path.expanduser(name)):
        raise DataError(f"{name}: {DEAD_LINK}")
    unknown = (f"unknown data set '{name}': it is not a known name ({', '.join(KNOWN_NAMES)}) and no such local "
               "path exists")
    if not HUB_NAME.fullmatch(name) or name.lower().removesuffix(".gz").endswith(LOCAL_SUFFIXES):
        raise DataError(unknown)
    try:
        loaded = load_hub(name)
    except DataError as err:
        raise DataError(f"{unknown}, and {err}") from None
    return LoadedDataset(name, loaded, seed=seed, columns=columns, chosen_splits=splits)


def parse_data_split(data_split):
    """`"2,4,4"` -> [0.2, 0.4, 0.4]; refuses anything but finite non-negative numbers with a positive sum."""
    try:
        parts = [float(part) for part in data_split.split(",")]
    except ValueError:
        parts = []
    if not parts or not all(0 <= part < float("inf") for part in parts) or max(parts) <= 0:
        raise ConfigError(f"--data_split {data_split!r} must be comma-separated finite non-negative numbers with a "
                          "positive sum, one per step, like 2,4,4")
    parts = [part / max(parts) for part in parts]  # 1e308,1e308,1: a sum of the parts as given overflows to inf
    total = sum(parts)
    return [part / total for part in parts]


def split_bounds(data_size, fractions):
    """Start and end index of each part: cumulative fractions rounded, so the parts tile [0, data_size)."""
    cumulative = np.round(np.cumsum([0.0] + fractions) * data_size).astype(int)
    cumulative[-1] = data_size
    return list(zip(cumulative[:-1], cumulative[1:]))


def shuffled_indices(seed, data_size):
    """DeepSpeed-Chat's `get_shuffle_idx`: a permutation of range(data_size) from a seeded NumPy generator."""
    dtype = np.uint32 if data_size < 2 ** 32 - 1 else np.int64
    indices = np.arange(data_size, dtype=dtype)
    np.random.RandomState(seed=seed).shuffle(indices)
    return indices


def split_part_indices(output_path, dataset_name, seed, split_name, data_split, part, data_size):
    """Indices of part `part` of a split of `data_size` rows, cached per data set, seed, split and data_split."""
    fractions = parse_data_split(data_split)
    if part >= len(fractions):
        raise ConfigError(f"--data_split {data_split} has {len(fractions)} part(s), but step {part + 1} trains on "
                          f"part {part + 1}: give one part per step, like 2,4,4")
    cache_file = os.path.join(output_path, f"{dataset_name}_seed{seed}_{split_name}_{data_split}_{part}.npy")
    start, end = split_bounds(data_size, fractions)[part]
    if os.path.isfile(cache_file):
        indices = np.load(cache_file, allow_pickle=False)
        if indices.size == end - start and (indices.size == 0 or int(indices.max()) < data_size):
            return indices
        # A cache made for a data set of another size under the same name: rebuild it.
    indices = shuffled_indices(seed, data_size)[start:end]
    os.makedirs(output_path, exist_ok=True)
    write_file_atomic(cache_file, lambda f: np.save(f, indices, allow_pickle=False), mode="wb")
    return indices


def tokenize_prompt(tokenizer, prompt):
    """Prompt token ids, in the model's chat format when it has one, with the special tokens the tokenizer
    adds at the start (e.g. a BOS)."""
    return encode_prompt_text(tokenizer, model_prompt(tokenizer, prompt))


def tokenize_answer(tokenizer, answer):
    """Answer token ids followed by EOS: the model is trained to stop there and nowhere else (a special token's
    text in the answer, as `</s>` or `<|im_end|>`, is tokenized as text)."""
    return tokenizer(model_answer(tokenizer, answer), add_special_tokens=False,
                     split_special_tokens=True)["input_ids"] + [tokenizer.eos_token_id]


class SampleCounter:
    """Counts samples kept and skipped (by reason) while a data set is built, for one summary line; and, for the
    rows checked against a length limit, the tokens each needs whole and how many the limit dropped, for
    `length_warning`."""

    def __init__(self, what, context=None):
        self.what, self.kept, self.skipped, self.trimmed, self.turns = what, 0, {}, 0, 0
        self.needed, self.too_long, self.limit, self.context = [], 0, None, context

    def skip(self, reason):
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def measure(self, needed, flag, limit):
        """A row that needs `needed` tokens to be kept whole, checked against `flag` = `limit`."""
        self.needed.append(needed)
        self.limit = (flag, limit)

    def skip_too_long(self, reason):
        self.skip(reason)
        self.too_long += 1

    def summary(self):
        skipped = ", ".join(f"{count} {reason}" for reason, count in sorted(self.skipped.items()))
        trimmed = f", {self.trimmed} of them with earlier turns dropped to fit" if self.trimmed else ""
        turns = f", and {self.turns} of their earlier turns (--train_every_turn)" if self.turns else ""
        return f"{self.what}: {self.kept} samples{trimmed}{turns}" + (f" (skipped: {skipped})" if skipped else "")

    def length_warning(self):
        """One line when the length limit dropped more than a tenth of the rows it checked (None otherwise): the
        counts, and the limit that would keep 95% of them whole (the 95th percentile of the tokens they need,
        sorted(needed)[ceil(0.95 n) - 1]), or, where that is past the model's `context`, that no limit would."""
        rows = len(self.needed)
        if self.too_long * 10 <= rows:
            return None
        flag, limit = self.limit
        keep_95 = sorted(self.needed)[math.ceil(0.95 * rows) - 1]
        advice = (f"{flag} {keep_95} would keep 95% of them whole" if self.context is None or keep_95 <= self.context
                  else f"95% of them need {keep_95} tokens, past the model's context of {self.context}: a model with "
                       "a longer context, or shorter rows, would keep them")
        return (f"WARNING: {flag} {limit} dropped {self.too_long} of {rows} rows of {self.what} "
                f"({self.too_long / rows:.0%}); {advice}")

    def counts(self):
        """{"read": rows, "kept": samples, "skipped": {reason: rows}}, and "trimmed": the kept samples whose prompt
        lost its earlier turns (fit_prompt), "turns": the samples of earlier turns (earlier_turns), where there are
        any: every row read is kept or skipped."""
        counts = {"read": self.kept + sum(self.skipped.values()), "kept": self.kept, "skipped": dict(self.skipped)}
        counts.update({key: value for key, value in (("trimmed", self.trimmed), ("turns", self.turns)) if value})
        return counts

    def report(self):
        """The summary line, then the length warning on a line of its own if there is one."""
        warning = self.length_warning()
        return self.summary() + (f"\n{warning}" if warning else "")


def fit_prompt(tokenizer, prompt, answer_tokens, flag, limit, counter):
    """(prompt text, prompt ids) that leave room for `answer_tokens` more within `limit` (None: no bound): the whole
    prompt, else the prompt with its earliest exchanges dropped until it fits (shorter_prompts; counted as
    trimmed), else None: a dialogue's older turns are the context a length limit gives up first, never an answer.
    The row's whole length is measured against `flag` for the length warning."""
    prompt_ids = tokenize_prompt(tokenizer, prompt)
    counter.measure(len(prompt_ids) + answer_tokens, flag, limit)
    if limit is None or len(prompt_ids) + answer_tokens <= limit:
        return prompt, prompt_ids
    for shorter in shorter_prompts(prompt):
        prompt_ids = tokenize_prompt(tokenizer, shorter)
        if len(prompt_ids) + answer_tokens <= limit:
            counter.trimmed += 1
            return shorter, prompt_ids
    return None


def sft_sample(tokenizer, prompt, chosen, max_seq_len, counter):
    """Prompt + chosen answer + EOS; labels are -100 on the prompt. A sample longer than max_seq_len (None: no
    bound) loses its prompt's earlier turns (fit_prompt), else is skipped, never cut: an answer cut before its EOS
    would teach the model never to stop."""
    answer_ids = tokenize_answer(tokenizer, chosen)
    fitted = fit_prompt(tokenizer, prompt, len(answer_ids), "--max_seq_len", max_seq_len, counter)
    if fitted is None:
        counter.skip_too_long("longer than --max_seq_len with its EOS")
        return None
    prompt_ids = fitted[1]
    counter.kept += 1
    return {"input_ids": prompt_ids + answer_ids, "labels": [IGNORE_INDEX] * len(prompt_ids) + answer_ids}


def earlier_turns(prompt):
    """(prompt, answer) of each assistant turn a multi-turn prompt holds, the turns before it its prompt, in
    DeepSpeed-Chat's text form: what --train_every_turn trains on besides the row's own answer. [] for one turn."""
    turns, system = parse_dialogue(prompt), dialogue_system(prompt)
    return [(with_system(system, dialogue_text([*turns[:k], (user, None)])), " " + answer)
            for k, (user, answer) in enumerate(turns) if answer]


def sft_samples(tokenizer, prompt, chosen, max_seq_len, counter, every_turn=False):
    """sft_sample's sample of the row (none where it is skipped) and, with `every_turn`, one of each earlier
    assistant turn in its prompt (earlier_turns; counted as `turns`, those over the limit left out uncounted: the
    row is kept or skipped by its own answer)."""
    sample = sft_sample(tokenizer, prompt, chosen, max_seq_len, counter)
    samples = [] if sample is None else [sample]
    if every_turn:
        scratch = SampleCounter("earlier turns")
        turns = [sft_sample(tokenizer, turn_prompt, answer, max_seq_len, scratch)
                 for turn_prompt, answer in earlier_turns(prompt)]
        samples += [turn for turn in turns if turn is not None]
        counter.turns += scratch.kept
    return samples


def pair_sample(tokenizer, prompt, chosen, rejected, max_seq_len, counter):
    """Prompt + chosen + EOS and prompt + rejected + EOS, and the prompt's length (the answers start there). A
    pair that does not fit whole in max_seq_len loses its prompt's earlier turns (fit_prompt), else is skipped
    (truncating an answer could cut away the very difference being ranked), and so is a pair whose two answers
    are identical (it carries no preference)."""
    if chosen == rejected:
        counter.skip("identical chosen and rejected")
        return None
    chosen_ids, rejected_ids = tokenize_answer(tokenizer, chosen), tokenize_answer(tokenizer, rejected)
    fitted = fit_prompt(tokenizer, prompt, max(len(chosen_ids), len(rejected_ids)), "--max_seq_len", max_seq_len,
                        counter)
    if fitted is None:
        counter.skip_too_long("longer than --max_seq_len")
        return None
    prompt_ids = fitted[1]
    counter.kept += 1
    return {"chosen_ids": prompt_ids + chosen_ids, "rejected_ids": prompt_ids + rejected_ids,
            "prompt_len": len(prompt_ids)}


def feedback_samples(tokenizer, prompt, chosen, rejected, max_seq_len, counter):
    """KTO's unpaired feedback from one row: prompt + answer + EOS, the prompt's length and whether the answer is
    `desirable`, for its chosen answer (desirable) and its rejected one (undesirable), whichever it has: a pair
    gives one of each and counts as two rows. An answer that does not fit whole in max_seq_len (with the prompt's
    earlier turns dropped: fit_prompt) is skipped."""
    samples = []
    for answer, desirable in ((chosen, True), (rejected, False)):
        if answer is None:
            continue
        answer_ids = tokenize_answer(tokenizer, answer)
        fitted = fit_prompt(tokenizer, prompt, len(answer_ids), "--max_seq_len", max_seq_len, counter)
        if fitted is None:
            counter.skip_too_long("longer than --max_seq_len with its EOS")
            continue
        prompt_ids = fitted[1]
        counter.kept += 1
        samples.append({"input_ids": prompt_ids + answer_ids, "prompt_len": len(prompt_ids), "desirable": desirable})
    return samples


def prompt_sample(tokenizer, prompt, max_prompt_len, counter):
    """Prompt token ids for PPO rollouts, and the prompt's text as the data set writes it (for reward functions,
    which may look its row up); a prompt longer than max_prompt_len (None: no bound) loses its earlier turns
    (fit_prompt), else is skipped, not cut."""
    fitted = fit_prompt(tokenizer, prompt, 0, "--max_prompt_seq_len", max_prompt_len, counter)
    if fitted is None:
        counter.skip_too_long("longer than --max_prompt_seq_len")
        return None
    counter.kept += 1
    return {"prompt_ids": fitted[1], "prompt": prompt}


FULL_MARKS = 1.0
"""The score of a right answer on the reward-function scale (utils/rl/reward_fns.py: checkers score in [0, 1])."""
JUDGE_BATCH = 4096
"""Answers scored in one call of a judge."""


def judged_rows(raw, rows, judge, counter, with_rejected):
    """`rows` less those whose chosen answer `judge` scores below FULL_MARKS and, `with_rejected`, those whose
    rejected answer it scores as high as the chosen one; each left-out row counted in `counter` by reason. Rows
    without a prompt or an answer are kept for build_samples to count. A data set whose chosen answers are partly
    wrong (the built-in task's: right 70% of the time) then teaches only right ones."""
    judged = []  # (row index, prompt, chosen, rejected or None)
    for index, row in enumerate(rows):
        prompt, chosen = raw.get_prompt(row), raw.get_chosen(row)
        rejected = raw.get_rejected(row) if with_rejected else None
        if prompt is not None and chosen is not None:
            judged.append((index, prompt, chosen, rejected))
    prompts, answers = [], []
    for _, prompt, chosen, rejected in judged:
        prompts += [prompt] * (1 if rejected is None else 2)
        answers += [chosen] if rejected is None else [chosen, rejected]
    scores = [float(score) for start in range(0, len(answers), JUDGE_BATCH)
              for score in judge(prompts[start:start + JUDGE_BATCH], answers[start:start + JUDGE_BATCH])]
    dropped, position = set(), 0
    for index, _, _, rejected in judged:
        chosen_score = scores[position]
        rejected_score = None if rejected is None else scores[position + 1]
        position += 1 if rejected is None else 2
        if chosen_score < FULL_MARKS:
            counter.skip("chosen answer below full marks (--answer_filter_fn)")
            dropped.add(index)
        elif rejected_score is not None and rejected_score >= chosen_score:
            counter.skip("rejected answer scored as high as the chosen (--answer_filter_fn)")
            dropped.add(index)
    return rows.select([index for index in range(len(rows)) if index not in dropped]) if dropped else rows


def build_samples(raw, rows, train_phase, tokenizer, max_seq_len, counter, unpaired=False, every_turn=False):
    samples = []
    for row in rows:
        prompt = raw.get_prompt(row)
        if prompt is None:
            counter.skip(raw.skip_reason(row) or "no prompt")
            continue
        if unpaired:
            chosen, rejected = raw.get_chosen(row), raw.get_rejected(row)
            if chosen is None and rejected is None:
                counter.skip(raw.skip_reason(row) or "no answer")  # a tie's prompt has none to learn from
            else:
                samples += feedback_samples(tokenizer, prompt, chosen, rejected, max_seq_len, counter)
            continue
        if train_phase == 3:
            sample = prompt_sample(tokenizer, prompt, max_seq_len, counter)
        else:
            chosen = raw.get_chosen(row)
            rejected = raw.get_rejected(row) if train_phase == 2 else None
            if chosen is None:
                counter.skip(raw.skip_reason(row) or "no answer")
                continue
            if train_phase == 2 and rejected is None:  # SFT or KTO rows: an answer, but no pair
                counter.skip("no rejected answer (not a pair)")
                continue
            if train_phase == 1:
                samples += sft_samples(tokenizer, prompt, chosen, max_seq_len, counter, every_turn)
                continue
            sample = pair_sample(tokenizer, prompt, chosen, rejected, max_seq_len, counter)
        if sample is not None:
            samples.append(sample)
    return samples


ANSWER_ROOM = 2
"""An `auto` answer budget is this many times the reference answers' length: room for an answer somewhat longer
than the references (a longer one is cut, and step 3 penalises an answer without EOS)."""
UNMEASURED_ANSWER_TOKENS = 64
"""The `auto` answer budget of data without reference answers (reasoning-gym tasks that any valid solution
answers, such as graph_color): nothing to measure, so a fixed budget, printed, that a number given to the flag
replaces (TRL's GRPO has a fixed default completion length for the same reason)."""
AUTO_PERCENTILE = 95.0
"""`auto` is the 95th percentile of the data's lengths: real data has a long tail, and its longest sample would
set every batch's padding and memory for the sake of a few rows (those rows are dropped and counted)."""
AUTO_LENGTH_CAP = 2048
"""The most tokens an `auto` length takes when the tokenizer does not state the model's context."""


def auto_percentile(length):
    """The percentile a length flag's value asks for: `auto` AUTO_PERCENTILE, `auto:max` 100 (the longest
    sample, nothing dropped), `auto:P` P in (0, 100]; None for a number of tokens (or None)."""
    if not is_auto(length):
        return None
    if length == AUTO:
        return AUTO_PERCENTILE
    spec = length[len(AUTO) + 1:]
    if spec == "max":
        return 100.0
    try:
        percentile = float(spec)
    except ValueError:
        percentile = float("nan")
    if not 0 < percentile <= 100:
        raise ConfigError(f"length {length!r}: write auto (the {AUTO_PERCENTILE:g}th percentile of the data's "
                          "lengths), auto:max (the longest) or auto:P with P in (0, 100]")
    return percentile


def percentile_length(lengths, percentile):
    """The nearest-rank percentile of `lengths`: the least length that at least `percentile`% of them fit,
    sorted(lengths)[ceil(percentile / 100 * n) - 1]; 0 for no lengths."""
    if not lengths:
        return 0
    return sorted(lengths)[max(1, math.ceil(percentile / 100 * len(lengths))) - 1]


def stated_context(tokenizer):
    """The model's context as its tokenizer states it; None where it does not (Hugging Face stores a huge
    placeholder when the context is unknown)."""
    context = getattr(tokenizer, "model_max_length", None)
    return context if isinstance(context, int) and 0 < context < 10 ** 6 else None


def auto_length_cap(tokenizer):
    """The most tokens an `auto` length may take: the model's stated context, else AUTO_LENGTH_CAP."""
    return stated_context(tokenizer) or AUTO_LENGTH_CAP


def data_bound(length):
    """A length flag as create_prompt_dataset's bound: None (no bound: the data's own lengths) for `auto`."""
    return None if auto_percentile(length) is not None else length


def sample_length(sample):
    """The most tokens of a sample's sequences: prompt + answer (phase 1), either side of a pair (phase 2), a
    prompt (phase 3)."""
    return max(len(sample[key]) for key in ("input_ids", "chosen_ids", "rejected_ids", "prompt_ids") if key in sample)


def reference_answer_lengths(data_paths, seed, tokenizer, columns=None):
    """The tokens of each distinct reference (chosen) answer, with its EOS, over the train and eval rows of the
    data sets (their columns renamed by `columns`: get_raw_dataset); [] when none has one."""
    answers = set()
    for data_path in data_paths:
        raw = get_raw_dataset(data_path, seed, columns)
        for rows in (raw.get_train_data(), raw.get_eval_data()):
            for row in rows if rows is not None else ():
                answers.add(reference_answers(raw, row)[0])
    answers.discard(None)
    return [len(tokenize_answer(tokenizer, answer)) for answer in answers]


def reference_answers(raw, row):
    """The row's (chosen, rejected) answers, each None where the row has none, both where the data set has none
    (reasoning-gym tasks that any valid solution answers: their get_chosen refuses)."""
    try:
        return raw.get_chosen(row), raw.get_rejected(row)
    except DataError:
        return None, None


LENGTH_FLAGS = ("max_seq_len", "max_prompt_seq_len", "max_answer_seq_len", "max_new_tokens")


def fit_auto_lengths(args, data_paths, tokenizer, *datasets, rebuild=None):
    """Set each length flag of `args` given as `auto` (`auto:max`, `auto:P`: auto_percentile) to the data's own
    length, at most auto_length_cap(tokenizer) and --max_auto_len:

        --max_seq_len, --max_prompt_seq_len      the percentile of the sample lengths of `datasets` (built with no
                                                 bound: data_bound); then `rebuild(length)` builds them again
                                                 within it (a dialogue's earlier turns dropped to fit: fit_prompt),
                                                 its samples and counts replacing theirs; without `rebuild`, the
                                                 longer samples are dropped, and the drop is said
        --max_answer_seq_len, --max_new_tokens   ANSWER_ROOM x the percentile of the reference answers' lengths
                                                 of `data_paths` (--max_answer_seq_len: at most the context less
                                                 --max_prompt_seq_len; --max_new_tokens: at most half the context)

    Data without reference answers gets UNMEASURED_ANSWER_TOKENS for an answer length, and says so."""
    context = auto_length_cap(tokenizer)
    cap = min(context, getattr(args, "max_auto_len", None) or math.inf)
    fitted, bounds = [], []
    for name in LENGTH_FLAGS:
        percentile = auto_percentile(getattr(args, name, None))
        if percentile is None:
            continue
        if name in ("max_seq_len", "max_prompt_seq_len"):
            lengths = [sample_length(sample) for dataset in datasets for sample in dataset]
            measured = f"{percentile:g}th percentile of {len(lengths)} samples"
            value = percentile_length(lengths, percentile)
        else:
            lengths = reference_answer_lengths(data_paths, args.seed, tokenizer, column_keys(args))
            measured = f"{ANSWER_ROOM} x the {percentile:g}th percentile of {len(lengths)} reference answers"
            value = ANSWER_ROOM * percentile_length(lengths, percentile)
            if value < 1:
                value, measured = UNMEASURED_ANSWER_TOKENS, "no reference answers"
                print_rank_0(f"--{name} auto: {', '.join(data_paths)} has no reference answers to measure; "
                             f"{value} tokens (give --{name} a number to change it)")
        bound, why = cap, ""
        prompt_len = getattr(args, "max_prompt_seq_len", None)  # fitted before the answer's, if auto
        if name == "max_answer_seq_len" and isinstance(prompt_len, int) and 1 <= context - prompt_len < bound:
            bound = context - prompt_len  # a prompt and its answer within the context
            why = f" (the context {context} less --max_prompt_seq_len {prompt_len})"
        elif name == "max_new_tokens" and context // 2 < bound:
            bound = context // 2  # the evaluation's prompts are not measured here: leave them the other half
            why = f" (half the context {context}: the other half for the prompt)"
        if value > bound:
            value, measured = bound, f"{measured}: {value}, capped at {bound}{why}"
        setattr(args, name, value)
        fitted.append(f"--{name} {value} ({measured})")
        if name in ("max_seq_len", "max_prompt_seq_len"):
            bounds.append((value, f"--{name} auto"))
    if fitted:
        print_rank_0("lengths from the data: " + ", ".join(fitted))
    for value, flag in bounds:
        if rebuild is None:
            drop_longer(datasets, value, flag)
            continue
        for dataset, rebuilt in zip(datasets, rebuild(value)):
            dataset.samples, dataset.counts = rebuilt.samples, rebuilt.counts


def drop_longer(datasets, limit, flag):
    """Drop the samples longer than `limit` tokens (sample_length) from each ListDataset, in place, counting them
    in its split's `counts` as skipped; one WARNING line when any is dropped. A data set left empty is a
    DataError."""
    dropped = []
    for dataset in datasets:
        kept = [sample for sample in dataset.samples if sample_length(sample) <= limit]
        if len(kept) == len(dataset.samples):
            continue
        what = dataset.split or "data"
        dropped.append(f"{len(dataset.samples) - len(kept)} of {len(dataset.samples)} {what} samples")
        if dataset.counts and dataset.split in dataset.counts:
            counts = dataset.counts[dataset.split]
            reason = f"longer than {flag}"
            counts["skipped"][reason] = counts["skipped"].get(reason, 0) + len(dataset.samples) - len(kept)
            counts["kept"] = len(kept)
        if not kept:
            raise DataError(f"no {what} samples left within {flag} ({limit} tokens)")
        dataset.samples = kept
    if dropped:
        print_rank_0(f"WARNING: {flag} ({limit} tokens) dropped {' and '.join(dropped)}, longer than it")


def data_metrics(counts):
    """A step's data counts (a ListDataset's `counts`) for its metrics.json: {"<split>_rows_read": n,
    "<split>_rows_kept": n, "<split>_rows_trimmed": n (kept with earlier turns dropped; only where some were),
    "<split>_earlier_turns": n (the samples of --train_every_turn's earlier turns; only where some were), ...,
    "rows_skipped": {"<split>": {reason: n}}}; {} for None."""
    if not counts:
        return {}
    metrics = {}
    for split, split_counts in counts.items():
        metrics.update({f"{split}_rows_read": split_counts["read"], f"{split}_rows_kept": split_counts["kept"]})
        for key, name in (("trimmed", "rows_trimmed"), ("turns", "earlier_turns")):
            if split_counts.get(key):
                metrics[f"{split}_{name}"] = split_counts[key]
    return {**metrics, "rows_skipped": {split: dict(split_counts["skipped"]) for split, split_counts in counts.items()}}


class ListDataset(torch.utils.data.Dataset):
    """Samples in a list. Those of create_prompt_dataset say which `split` they are and share `counts`, the rows
    of each split built with them: {split: {"read": rows, "kept": samples, "skipped": {reason: rows}}} (else
    None)."""

    def __init__(self, samples, counts=None, split=None):
        self.samples, self.counts, self.split = samples, counts, split

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        return self.samples[index]


def create_prompt_dataset(data_paths, data_split, output_path, train_phase, seed, tokenizer, max_seq_len,
                          unpaired=False, columns=None, judge=None, every_turn=False):
    """The train and eval datasets of `train_phase` (1, 2 or 3) over all `data_paths` (their columns renamed by
    `columns`: get_raw_dataset), shuffled together; with `unpaired`, KTO's labelled answers from the phase's rows
    instead (feedback_samples); with `judge` (scores(prompts, answers) -> numbers), only the rows it passes
    (judged_rows); with `every_turn` (phase 1), a sample of each earlier assistant turn too (sft_samples).

    `max_seq_len` bounds whole sequences in phases 1 and 2 and prompts in phase 3 (None: no bound). Each dataset
    carries the `counts` of both splits: rows read, samples kept, rows skipped by reason (data_metrics)."""
    if train_phase not in PHASES:
        raise ConfigError(f"train_phase must be 1, 2 or 3, not {train_phase}")
    parse_data_split(data_split)
    check_columns_apply(data_paths, columns)
    datasets, counts = {}, {}
    for split_name in ("train", "eval"):
        counter = SampleCounter(f"phase {train_phase} {split_name}", stated_context(tokenizer))
        samples, rows_in_part, rows_in_all = [], 0, 0
        for data_path in data_paths:
            raw = get_raw_dataset(data_path, seed, columns)
            rows = raw.get_train_data() if split_name == "train" else raw.get_eval_data()
            part = split_part_indices(output_path, raw.clean_name, seed, split_name, data_split, train_phase - 1,
                                      len(rows))
            rows_in_part, rows_in_all = rows_in_part + len(part), rows_in_all + len(rows)
            rows = rows.select(part.tolist())
            if judge is not None and train_phase != 3:
                rows = judged_rows(raw, rows, judge, counter, with_rejected=train_phase == 2 or unpaired)
            samples += build_samples(raw, rows, train_phase, tokenizer, max_seq_len, counter, unpaired, every_turn)
        print_rank_0(counter.report())
        if not samples:
            why = ("see the skipped counts above" if rows_in_part else
                   f"part {train_phase} of --data_split {data_split} holds none of the {rows_in_all} {split_name} rows")
            raise DataError(f"no {split_name} data left for phase {train_phase} from {', '.join(data_paths)} "
                            f"with --data_split {data_split} ({why})")
        order = shuffled_indices(seed, len(samples))
        counts[split_name] = counter.counts()
        datasets[split_name] = ListDataset([samples[i] for i in order], counts, split_name)
    return datasets["train"], datasets["eval"]


def pad_right(sequences, pad_value, length=None):
    length = length or max(len(seq) for seq in sequences)
    return torch.tensor([seq + [pad_value] * (length - len(seq)) for seq in sequences], dtype=torch.long)


def pad_left(sequences, pad_value, length=None):
    length = length or max(len(seq) for seq in sequences)
    return torch.tensor([[pad_value] * (length - len(seq)) + seq for seq in sequences], dtype=torch.long)


def attention_mask_right(sequences, length=None):
    return pad_right([[1] * len(seq) for seq in sequences], 0, length)


def attention_mask_left(sequences, length=None):
    return pad_left([[1] * len(seq) for seq in sequences], 0, length)


@dataclass
class DataCollatorSFT:
    """Right-pads a batch to its longest sequence; padding is masked out of attention and labels."""
    pad_token_id: int

    def __call__(self, samples):
        input_ids = [s["input_ids"] for s in samples]
        return {"input_ids": pad_right(input_ids, self.pad_token_id),
                "attention_mask": attention_mask_right(input_ids),
                "labels": pad_right([s["labels"] for s in samples], IGNORE_INDEX)}


@dataclass
class DataCollatorReward:
    """The chosen sequences of a batch, then its rejected ones (DeepSpeed-Chat's layout), right-padded to one
    length: rows i and i + batch_size are a pair."""
    pad_token_id: int

    def __call__(self, samples):
        sequences = [s["chosen_ids"] for s in samples] + [s["rejected_ids"] for s in samples]
        return {"input_ids": pad_right(sequences, self.pad_token_id),
                "attention_mask": attention_mask_right(sequences)}


def answer_label_mask(prompt_len, length, width):
    """1.0 at the next-token label positions t (predicting token t + 1) of the answer, EOS included:
    prompt_len - 1 <= t < length - 1, in a row of `width` tokens (so width - 1 label positions)."""
    return [0.0] * (prompt_len - 1) + [1.0] * (length - prompt_len) + [0.0] * (width - length)


@dataclass
class DataCollatorPreference(DataCollatorReward):
    """DataCollatorReward's batch (chosen rows, then rejected rows) and, for sequence log-probs of the answers,
    `answer_mask` (2B, T - 1) over next-token labels (`answer_label_mask`). Samples that carry precomputed
    reference log-probs (`ref_chosen_logps`, `ref_rejected_logps`) give `ref_logps` (2B,) in the same order."""

    def __call__(self, samples):
        batch = super().__call__(samples)
        width = batch["input_ids"].shape[1]
        rows = [(s["prompt_len"], len(s["chosen_ids"])) for s in samples]
        rows += [(s["prompt_len"], len(s["rejected_ids"])) for s in samples]
        batch["answer_mask"] = torch.tensor([answer_label_mask(p, n, width) for p, n in rows], dtype=torch.float32)
        if "ref_chosen_logps" in samples[0]:
            batch["ref_logps"] = torch.tensor([s["ref_chosen_logps"] for s in samples]
                                              + [s["ref_rejected_logps"] for s in samples], dtype=torch.float32)
        return batch


@dataclass
class DataCollatorFeedback:
    """KTO's batch of labelled answers (feedback_samples): `input_ids` and `attention_mask` right-padded,
    `answer_mask` over their next-token labels (answer_label_mask), `desirable` (B,) bool; and the mismatched pairs
    of KTO's KL estimate, each prompt with the answer of the row before it (the first prompt with the last row's
    answer), as `kl_input_ids`, `kl_attention_mask` and `kl_answer_mask`."""
    pad_token_id: int

    def __call__(self, samples):
        matched = [(s["input_ids"], s["prompt_len"]) for s in samples]
        mismatched = [(s["input_ids"][:s["prompt_len"]] + other["input_ids"][other["prompt_len"]:], s["prompt_len"])
                      for s, other in zip(samples, samples[-1:] + samples[:-1])]
        batch = {"desirable": torch.tensor([bool(s["desirable"]) for s in samples])}
        for prefix, rows in (("", matched), ("kl_", mismatched)):
            sequences = [sequence for sequence, _ in rows]
            input_ids = pad_right(sequences, self.pad_token_id)
            width = input_ids.shape[1]
            batch[f"{prefix}input_ids"] = input_ids
            batch[f"{prefix}attention_mask"] = attention_mask_right(sequences)
            batch[f"{prefix}answer_mask"] = torch.tensor([answer_label_mask(prompt_len, len(sequence), width)
                                                          for sequence, prompt_len in rows], dtype=torch.float32)
        return batch


@dataclass
class DataCollatorRLHF:
    """Left-pads prompts so every rollout starts generating at the same column; `prompt_text` lists the prompts'
    texts (None for a sample without one)."""
    pad_token_id: int

    def __call__(self, samples):
        prompts = [s["prompt_ids"] for s in samples]
        return {"prompt": pad_left(prompts, self.pad_token_id),
                "prompt_att_mask": attention_mask_left(prompts),
                "prompt_text": [s.get("prompt") for s in samples]}


def make_dataloader(dataset, collator, batch_size, shuffle, seed=0, full_batches=False):
    """A DataLoader over this rank's share of `dataset` (DistributedSampler when distributed); with `full_batches`
    every batch has `batch_size` samples (FullBatchSampler)."""
    from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, SequentialSampler

    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        sampler = DistributedSampler(dataset, shuffle=shuffle, seed=seed)
    elif shuffle:
        sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(seed))
    else:
        sampler = SequentialSampler(dataset)
    if full_batches:
        sampler = FullBatchSampler(sampler, batch_size)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=collator)


class FullBatchSampler(torch.utils.data.Sampler):
    """The indices of `sampler`, then its first ones again up to a whole number of batches, so that no batch is
    short (as DistributedSampler pads ranks to equal shares): step 3 splits each round's rollouts into training
    minibatches of a fixed size, and a short last batch would not split. An epoch of n samples repeats
    -n mod batch_size of them; a data set smaller than one batch is repeated to fill it."""

    def __init__(self, sampler, batch_size):
        self.sampler, self.batch_size = sampler, batch_size
        self.generator = getattr(sampler, "generator", None)  # the shuffle's generator: checkpoints keep its state

    def set_epoch(self, epoch):
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __len__(self):
        return len(self.sampler) + -len(self.sampler) % self.batch_size

    def __iter__(self):
        indices = list(self.sampler)
        while len(indices) % self.batch_size:
            indices += indices[:-len(indices) % self.batch_size]
        return iter(indices)


def create_unsupervised_dataset(name, config_name, tokenizer, block_size, seed):
    """Plain text for step 3's pretraining loss, tokenized (a special token's text in a document, `</s>` in HTML, is
    text), joined with EOS and cut into blocks of block_size tokens (DeepSpeed-Chat's `group_texts`). `name` is
    `builtin` (the built-in corpus), a local .txt file (one document per line), a local JSON array or JSON-lines
    file of objects with a `text` field, or a hub data set with a `text` column."""
    texts = _unsupervised_texts(name, config_name)
    ids = []
    for text in texts:
        ids += tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"] + [
            tokenizer.eos_token_id]
    blocks = [ids[start:start + block_size] for start in range(0, len(ids) - block_size + 1, block_size)]
    if not blocks:
        raise DataError(f"--unsupervised_dataset_name {name}: fewer than {block_size} tokens of text")
    order = shuffled_indices(seed, len(blocks))
    print_rank_0(f"unsupervised: {len(blocks)} blocks of {block_size} tokens from {name}")
    return ListDataset([{"input_ids": blocks[i], "labels": blocks[i]} for i in order])


def _unsupervised_texts(name, config_name):
    """The documents of --unsupervised_dataset_name: a file's (read as the data files are: UTF-8, a BOM dropped,
    each problem a DataError naming the file and line), else a hub data set's `text` column."""
    if name == "builtin":
        path = builtin_data_dir() / "unsup.txt"
    else:
        path = Path(name)
    if path.is_file():
        what = f"--unsupervised_dataset_name {path}"
        if data_suffix(path) in LOCAL_SUFFIXES:  # rows of a data file's formats, each with a `text` field
            texts = []
            for value, where in local_records(path, what):
                if not isinstance(value, dict) or not isinstance(value.get("text"), str):
                    raise DataError(f"{what}: {where}: expected a row with a string field 'text'")
                texts.append(check_text(value["text"], f"{what}: {where}: field 'text'"))
            return texts
        return [line for _, line in read_lines(path, what) if line.strip()]
    if name.startswith((".", "/", "~")):
        raise DataError(f"--unsupervised_dataset_name {name}: no such file")
    try:
        import datasets

        return datasets.load_dataset(name, config_name, split="train")["text"]
    except Exception as err:
        raise DataError(f"--unsupervised_dataset_name {name}: could not be loaded ({type(err).__name__}); "
                        "a local .txt file or 'builtin' works offline") from None
