"""Tests of utils/data/data_utils.py: data_split parsing and tiling, cached split indices, DS-Chat's phase/part
semantics, answer-only labels, sample skipping and the three collators."""
import json
import random

import numpy as np
import pytest
import torch

from tests.files import write_jsonl
from utils.data.data_utils import (IGNORE_INDEX, DataCollatorFeedback, DataCollatorPreference, DataCollatorReward,
                                   DataCollatorRLHF, DataCollatorSFT, SampleCounter, create_prompt_dataset,
                                   earlier_turns, feedback_samples, pair_sample, parse_data_split, prompt_sample,
                                   sft_sample, sft_samples, split_bounds, split_part_indices)
from utils.runtime.errors import ConfigError, DataError


def rows(tag, n):
    """Rows with unique text, so a sample can be traced back to its row."""
    return [{"prompt": f" Human: {tag} question {i}? Assistant:", "chosen": f" {tag} good {i}",
             "rejected": f" {tag} bad {i}"} for i in range(n)]


@pytest.fixture
def data_dir(tmp_path):
    directory = tmp_path / "data"
    directory.mkdir()
    write_jsonl(directory / "train.json", rows("train", 20))
    write_jsonl(directory / "eval.json", rows("eval", 10))
    return directory


def ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def decode(tokenizer, token_ids):
    return tokenizer.decode(token_ids, skip_special_tokens=True)


# --------------------------------------------------------------------------- parse_data_split


@pytest.mark.parametrize("text, expected", [("2,4,4", [0.2, 0.4, 0.4]), ("10,0,0", [1.0, 0.0, 0.0]),
                                            ("0.5,0.25,0.25", [0.5, 0.25, 0.25]), ("1,1,2", [0.25, 0.25, 0.5]),
                                            (" 1, 2 ,1", [0.25, 0.5, 0.25]), ("2,8", [0.2, 0.8]), ("5", [1.0]),
                                            ("1,1,1,1", [0.25] * 4)])
def test_parse_data_split_valid(text, expected):
    fractions = parse_data_split(text)
    assert fractions == pytest.approx(expected)
    assert sum(fractions) == pytest.approx(1.0)


@pytest.mark.parametrize("text", ["", "-1,1,1", "1,-0.5,1", "0,0,0", "a,b,c", "1,,2", "nan,1,1", "inf,1,1",
                                  "2;4;4"])
def test_parse_data_split_invalid_names_the_flag(text):
    with pytest.raises(ConfigError, match="--data_split"):
        parse_data_split(text)


# --------------------------------------------------------------------------- split_bounds


def test_split_bounds_tile_the_range_in_proportion():
    rng = random.Random(0)
    fraction_sets = [parse_data_split(s) for s in ("2,4,4", "1,0,0", "0,1,0", "0,0,1", "1,1,1", "6,2,2", "1,2,7")]
    fraction_sets += [parse_data_split(",".join(str(rng.uniform(0, 5)) for _ in range(3))) for _ in range(20)]
    sizes = list(range(0, 64)) + [97, 100, 1000, 12345]
    for fractions in fraction_sets:
        for n in sizes:
            bounds = split_bounds(n, fractions)
            assert len(bounds) == 3
            assert bounds[0][0] == 0 and bounds[-1][1] == n
            for (_, end), (start, _) in zip(bounds, bounds[1:]):
                assert end == start
            for (start, end), fraction in zip(bounds, fractions):
                assert start <= end
                assert abs((end - start) - fraction * n) <= 1, (n, fractions, bounds)


# --------------------------------------------------------------------------- split_part_indices


def test_split_parts_are_disjoint_and_cover(tmp_path):
    for n in (1, 2, 7, 10, 101):
        parts = [split_part_indices(tmp_path, f"ds{n}", 1234, "train", "2,4,4", part, n) for part in range(3)]
        joined = np.concatenate(parts)
        assert sorted(joined.tolist()) == list(range(n))  # each index exactly once
        assert [len(p) for p in parts] == [end - start for start, end in split_bounds(n, [0.2, 0.4, 0.4])]


def test_split_indices_depend_on_the_seed_only(tmp_path):
    first = split_part_indices(tmp_path / "a", "ds", 7, "train", "2,4,4", 2, 200)
    again = split_part_indices(tmp_path / "b", "ds", 7, "train", "2,4,4", 2, 200)  # fresh cache folder
    other_seed = split_part_indices(tmp_path / "c", "ds", 8, "train", "2,4,4", 2, 200)
    assert np.array_equal(first, again)
    assert not np.array_equal(first, other_seed)
    assert sorted(first.tolist()) != list(range(first.min(), first.min() + len(first)))  # shuffled, not a slice


def test_split_cache_is_written_as_plain_npy_and_read_back(tmp_path):
    indices = split_part_indices(tmp_path, "ds", 1, "eval", "2,4,4", 1, 50)
    files = list(tmp_path.glob("*.npy"))
    assert len(files) == 1
    assert np.array_equal(np.load(files[0], allow_pickle=False), indices)
    assert not list(tmp_path.glob("*.tmp*"))
    # The cache is what is read next time: replace it with other valid indices and they come back.
    planted = indices[::-1].copy()
    np.save(files[0], planted, allow_pickle=False)
    assert np.array_equal(split_part_indices(tmp_path, "ds", 1, "eval", "2,4,4", 1, 50), planted)
    # A cache of the wrong size (the data set changed under the same name) is rebuilt, not trusted.
    np.save(files[0], np.array([3, 1, 4], dtype=indices.dtype), allow_pickle=False)
    assert np.array_equal(split_part_indices(tmp_path, "ds", 1, "eval", "2,4,4", 1, 50), indices)
    # Other splits, parts and data_splits have their own files.
    split_part_indices(tmp_path, "ds", 1, "train", "2,4,4", 1, 50)
    split_part_indices(tmp_path, "ds", 1, "eval", "2,4,4", 2, 50)
    split_part_indices(tmp_path, "ds", 1, "eval", "1,1,1", 1, 50)
    assert len(list(tmp_path.glob("*.npy"))) == 4


def test_split_cache_from_a_larger_dataset_is_rebuilt(tmp_path):
    big = split_part_indices(tmp_path, "ds", 3, "train", "1,1,1", 2, 300)
    assert big.max() >= 100
    small = split_part_indices(tmp_path, "ds", 3, "train", "1,1,1", 2, 100)
    assert small.max() < 100
    assert np.array_equal(small, split_part_indices(tmp_path / "fresh", "ds", 3, "train", "1,1,1", 2, 100))
    (cache_file,) = tmp_path.glob("*.npy")
    assert np.array_equal(np.load(cache_file, allow_pickle=False), small)


# --------------------------------------------------------------------------- phases and parts


def sample_texts(tokenizer, dataset, phase):
    """The row text each sample came from: prompt + chosen (phases 1, 2) or the prompt (phase 3)."""
    key = {1: "input_ids", 2: "chosen_ids", 3: "prompt_ids"}[phase]
    return [decode(tokenizer, sample[key]) for sample in dataset]


def test_phase_p_uses_part_p_minus_1_of_train_and_eval(tmp_path, data_dir, tiny_tokenizer):
    data_split, seed, out = "1,2,7", 42, tmp_path / "cache"
    by_split = {}
    for phase in (1, 2, 3):
        train, evaluation = create_prompt_dataset([str(data_dir)], data_split, str(out), phase, seed,
                                                  tiny_tokenizer, 128)
        by_split[phase] = {"train": train, "eval": evaluation}
    for split_name, source, n in (("train", rows("train", 20), 20), ("eval", rows("eval", 10), 10)):
        row_of = {}
        for index, row in enumerate(source):
            row_of[row["prompt"] + row["chosen"]] = index
            row_of[row["prompt"]] = index
        seen = []
        for phase in (1, 2, 3):
            found = [row_of[text] for text in sample_texts(tiny_tokenizer, by_split[phase][split_name], phase)]
            expected_size = [end - start for start, end in split_bounds(n, parse_data_split(data_split))][phase - 1]
            assert len(found) == len(set(found)) == expected_size  # part p-1's size: 1:2:7 tells the parts apart
            seen.append(set(found))
        assert set.union(*seen) == set(range(n))
        assert not (seen[0] & seen[1] or seen[0] & seen[2] or seen[1] & seen[2])
    # Every phase read its part from the cache files of this seed (3 phases x 2 splits).
    assert len(list(out.glob("*.npy"))) == 6


def test_create_prompt_dataset_is_reproducible(tmp_path, data_dir, tiny_tokenizer):
    first = create_prompt_dataset([str(data_dir)], "2,4,4", str(tmp_path / "a"), 2, 5, tiny_tokenizer, 128)
    second = create_prompt_dataset([str(data_dir)], "2,4,4", str(tmp_path / "b"), 2, 5, tiny_tokenizer, 128)
    for a, b in zip(first, second):
        assert [s["chosen_ids"] for s in a] == [s["chosen_ids"] for s in b]


def full_marks_for_even_rows(prompts, answers):
    """A judge: 1 for a good answer to an even-numbered question, 0.5 to an odd one; 0 for a bad answer, but 1 for
    the bad answer to question 4 (as high as its good one)."""
    def score(prompt, answer):
        number = int(prompt.split("question ")[1].split("?")[0])
        if "bad" in answer:
            return 1.0 if number == 4 else 0.0
        return 1.0 if number % 2 == 0 else 0.5
    return [score(prompt, answer) for prompt, answer in zip(prompts, answers)]


@pytest.mark.parametrize("phase, split", [(1, "10,0,0"), (2, "0,10,0")])
def test_a_judge_keeps_the_rows_whose_chosen_answer_has_full_marks(tmp_path, data_dir, tiny_tokenizer, phase, split):
    train, evaluation = create_prompt_dataset([str(data_dir)], split, str(tmp_path), phase, 1, tiny_tokenizer, 128,
                                              judge=full_marks_for_even_rows)
    key = "input_ids" if phase == 1 else "chosen_ids"
    kept = sorted(int(decode(tiny_tokenizer, sample[key]).split("good ")[1]) for sample in train)
    # phase 1 judges the chosen answer only; phase 2 also drops question 4, whose rejected answer scores as high
    assert kept == [i for i in range(0, 20, 2) if phase == 1 or i != 4]
    counts = train.counts["train"]
    below = counts["skipped"]["chosen answer below full marks (--answer_filter_fn)"]
    assert below == 10 and counts["read"] == 20 == counts["kept"] + sum(counts["skipped"].values())
    assert counts["skipped"].get("rejected answer scored as high as the chosen (--answer_filter_fn)", 0) == (phase == 2)
    assert len(evaluation) == 5 - (phase == 2)  # the eval rows are judged alike (questions 0-9)


def test_create_prompt_dataset_with_nothing_left_raises(tmp_path, data_dir, tiny_tokenizer):
    with pytest.raises(DataError, match="no train data left for phase 1"):
        create_prompt_dataset([str(data_dir)], "2,4,4", str(tmp_path), 1, 1, tiny_tokenizer, 3)  # prompts > 3
    with pytest.raises(DataError, match="no train data left for phase 2"):
        create_prompt_dataset([str(data_dir)], "10,0,0", str(tmp_path), 2, 1, tiny_tokenizer, 128)  # empty part


def test_create_prompt_dataset_refuses_bad_phase_and_split(tmp_path, data_dir, tiny_tokenizer):
    with pytest.raises(ConfigError):
        create_prompt_dataset([str(data_dir)], "2,4,4", str(tmp_path), 4, 1, tiny_tokenizer, 128)
    with pytest.raises(ConfigError, match="--data_split 2,4 has 2 part"):  # step 3 needs a third part
        create_prompt_dataset([str(data_dir)], "2,4", str(tmp_path), 3, 1, tiny_tokenizer, 128)
    train, _ = create_prompt_dataset([str(data_dir)], "2,4", str(tmp_path), 2, 1, tiny_tokenizer, 128)
    assert len(train) > 0  # steps 1 and 2 alone need two parts only


# --------------------------------------------------------------------------- the length-limit warning


def varied_pairs(n):
    """Pairs whose prompts grow from a few words to many, as real dialogue varies."""
    return [(" Human: " + " ".join(f"word{j}" for j in range(1 + 2 * i)) + "? Assistant:", f" yes {i}", f" no {i}")
            for i in range(n)]


def pair_lengths(tokenizer, pairs, limit):
    counter = SampleCounter("pairs")
    kept = [pair_sample(tokenizer, *pair, limit, counter) for pair in pairs]
    return counter, sum(sample is not None for sample in kept)


def test_a_limit_that_drops_over_a_tenth_warns_with_counts_and_the_limit_that_keeps_95_percent(tiny_tokenizer):
    pairs = varied_pairs(40)
    counter, kept = pair_lengths(tiny_tokenizer, pairs, 48)
    dropped = len(pairs) - kept
    assert dropped * 10 > len(pairs)  # the case at hand: more than a tenth dropped
    warning = counter.length_warning()
    assert warning.startswith("WARNING: --max_seq_len 48 dropped ") and "\n" not in warning
    assert f"dropped {dropped} of {len(pairs)} rows of pairs" in warning
    suggested = int(warning.split("; --max_seq_len ")[1].split()[0])
    # The suggested limit keeps at least 95% of the rows, and is the smallest that does.
    assert pair_lengths(tiny_tokenizer, pairs, suggested)[1] >= 0.95 * len(pairs)
    assert pair_lengths(tiny_tokenizer, pairs, suggested - 1)[1] < 0.95 * len(pairs)
    assert counter.report() == f"{counter.summary()}\n{warning}"


def test_rows_past_the_models_context_are_said_to_be_so_not_given_a_limit_the_model_cannot_take(tiny_tokenizer):
    """rectangle_count's prompts need about 6,900 tokens of the tiny model's 512: the warning advised --max_seq_len
    6876, which the model cannot take."""
    pairs = varied_pairs(40)
    counter = SampleCounter("pairs", context=50)
    for pair in pairs:
        pair_sample(tiny_tokenizer, *pair, 48, counter)
    keep_95 = sorted(counter.needed)[37]
    assert keep_95 > 50
    assert counter.length_warning().endswith(f"; 95% of them need {keep_95} tokens, past the model's context of 50: "
                                             "a model with a longer context, or shorter rows, would keep them")


def test_a_limit_that_drops_a_tenth_or_less_says_nothing(tiny_tokenizer):
    pairs = varied_pairs(40)
    longest = max(len(tiny_tokenizer(p)["input_ids"]) + len(ids(tiny_tokenizer, c)) + 1 for p, c, _ in pairs)
    counter, kept = pair_lengths(tiny_tokenizer, pairs, longest)
    assert kept == len(pairs) and counter.length_warning() is None and counter.report() == counter.summary()
    lengths = sorted(counter.needed)
    counter, kept = pair_lengths(tiny_tokenizer, pairs, lengths[-5])  # drops the 4 longest: exactly a tenth
    assert kept == 36 and counter.length_warning() is None


def test_prompt_and_sft_limits_are_named_in_the_warning(tiny_tokenizer):
    prompts = [pair[0] for pair in varied_pairs(20)]
    counter = SampleCounter("prompts")
    for prompt in prompts:
        prompt_sample(tiny_tokenizer, prompt, 20, counter)
    assert counter.length_warning().startswith("WARNING: --max_prompt_seq_len 20 dropped ")
    counter = SampleCounter("sft")
    for prompt, chosen, _ in varied_pairs(20):
        sft_sample(tiny_tokenizer, prompt, chosen, 20, counter)
    assert counter.length_warning().startswith("WARNING: --max_seq_len 20 dropped ")


def test_create_prompt_dataset_prints_the_warning_once_per_split(tmp_path, tiny_tokenizer, capsys):
    data = tmp_path / "data"
    data.mkdir()
    pairs = varied_pairs(30)
    for name in ("train.json", "eval.json"):
        write_jsonl(data / name, [{"prompt": p, "chosen": c, "rejected": r} for p, c, r in pairs])
    create_prompt_dataset([str(data)], "0,1,0", str(tmp_path / "cache"), 2, 1, tiny_tokenizer, 40)
    warnings = [line for line in capsys.readouterr().out.splitlines() if line.startswith("WARNING:")]
    assert len(warnings) == 2
    assert "rows of phase 2 train" in warnings[0] and "rows of phase 2 eval" in warnings[1]


# --------------------------------------------------------------------------- SFT samples


def test_sft_labels_mask_exactly_the_prompt(tiny_tokenizer):
    tok, prompt, answer = tiny_tokenizer, " Human: What is 7 + 12? Assistant:", " 19"
    prompt_ids, answer_ids = tok(prompt)["input_ids"], ids(tok, answer)
    counter = SampleCounter("sft")
    sample = sft_sample(tok, prompt, answer, 64, counter)
    assert sample["input_ids"] == prompt_ids + answer_ids + [tok.eos_token_id]
    assert sample["labels"] == [IGNORE_INDEX] * len(prompt_ids) + answer_ids + [tok.eos_token_id]
    assert counter.kept == 1 and not counter.skipped


def test_an_sft_sample_that_would_lose_its_eos_is_dropped_not_cut(tiny_tokenizer):
    tok, prompt, answer = tiny_tokenizer, " Human: Say hello in uppercase. Assistant:", " HELLO THERE"
    whole = len(tok(prompt)["input_ids"]) + len(ids(tok, answer)) + 1  # prompt + answer + EOS
    counter = SampleCounter("sft")
    for limit in (whole - 1, whole - 3, len(tok(prompt)["input_ids"])):  # each would cut the EOS off (or more)
        assert sft_sample(tok, prompt, answer, limit, counter) is None
    kept = sft_sample(tok, prompt, answer, whole, counter)
    assert len(kept["input_ids"]) == whole and kept["input_ids"][-1] == kept["labels"][-1] == tok.eos_token_id
    assert counter.counts() == {"read": 4, "kept": 1, "skipped": {"longer than --max_seq_len with its EOS": 3}}
    assert "3 longer than --max_seq_len with its EOS" in counter.summary()


DIALOGUE = " Human: Hi there, can you help me plan a trip? Assistant: Sure, where to? Human: To the mountains " \
           "for a week. Assistant: Pack layers. Human: What shoes? Assistant:"


def test_a_dialogue_too_long_loses_its_earliest_turns_not_its_answer(tiny_tokenizer):
    tok, answer = tiny_tokenizer, " Good walking shoes."
    last_turn = " Human: What shoes? Assistant:"
    whole = len(tok(DIALOGUE)["input_ids"]) + len(ids(tok, answer)) + 1
    fits_last = len(tok(last_turn)["input_ids"]) + len(ids(tok, answer)) + 1
    counter = SampleCounter("sft")
    assert len(sft_sample(tok, DIALOGUE, answer, whole, counter)["input_ids"]) == whole  # fits: unchanged
    trimmed = sft_sample(tok, DIALOGUE, answer, whole - 1, counter)
    text = decode(tok, trimmed["input_ids"])
    assert len(trimmed["input_ids"]) < whole and text.endswith("Human: What shoes? Assistant: Good walking shoes.")
    assert "Hi there" not in text and trimmed["labels"][-1] == tok.eos_token_id
    only_last = sft_sample(tok, DIALOGUE, answer, fits_last, counter)
    assert decode(tok, only_last["input_ids"]).startswith(last_turn)
    assert sft_sample(tok, DIALOGUE, answer, fits_last - 1, counter) is None  # not even the last turn fits
    assert counter.counts() == {"read": 4, "kept": 3, "trimmed": 2,
                                "skipped": {"longer than --max_seq_len with its EOS": 1}}
    assert "2 of them with earlier turns dropped to fit" in counter.summary()


def test_every_turn_trains_each_assistant_turn_with_the_turns_before_it(tiny_tokenizer, tmp_path):
    """--train_every_turn: a conversation of three exchanges gives three samples, each answer's labels its own and
    its prompt the turns before it; without the flag, the last answer alone (the earlier ones context)."""
    tok, answer = tiny_tokenizer, " Good walking shoes."
    assert earlier_turns(DIALOGUE) == [
        (" Human: Hi there, can you help me plan a trip? Assistant:", " Sure, where to?"),
        (" Human: Hi there, can you help me plan a trip? Assistant: Sure, where to? Human: To the mountains for a "
         "week. Assistant:", " Pack layers.")]
    assert earlier_turns(" Human: only one Assistant:") == earlier_turns("no marks at all") == []
    counter = SampleCounter("sft")
    samples = sft_samples(tok, DIALOGUE, answer, None, counter, every_turn=True)
    trained = [decode(tok, [t for t in sample["labels"] if t != IGNORE_INDEX]) for sample in samples]
    assert [text.replace(tok.eos_token, "") for text in trained] == [answer, " Sure, where to?", " Pack layers."]
    assert all(decode(tok, sample["input_ids"]).startswith(" Human: Hi there") for sample in samples)
    assert counter.counts() == {"read": 1, "kept": 1, "skipped": {}, "turns": 2}
    assert "1 samples, and 2 of their earlier turns (--train_every_turn)" in counter.summary()
    assert len(sft_samples(tok, DIALOGUE, answer, None, SampleCounter("sft"))) == 1
    rows = [{"prompt": DIALOGUE, "chosen": answer}] * 10
    for split in ("train", "eval"):
        write_jsonl(tmp_path / f"{split}.jsonl", rows)
    for every_turn, size in ((False, 10), (True, 30)):
        train, _ = create_prompt_dataset([str(tmp_path)], "1", str(tmp_path / f"cache{every_turn}"), 1, 1, tok,
                                         None, every_turn=every_turn)
        assert len(train) == size and train.counts["train"]["kept"] == 10


def test_a_pair_and_a_prompt_keep_their_last_turns_within_the_limit(tiny_tokenizer):
    tok = tiny_tokenizer
    counter = SampleCounter("pairs")
    whole = len(tok(DIALOGUE)["input_ids"]) + len(ids(tok, " Boots, surely.")) + 1
    pair = pair_sample(tok, DIALOGUE, " Boots, surely.", " No.", whole - 1, counter)
    assert len(pair["chosen_ids"]) <= whole - 1 and pair["chosen_ids"][:pair["prompt_len"]] == \
        pair["rejected_ids"][:pair["prompt_len"]]
    assert decode(tok, pair["chosen_ids"][pair["prompt_len"]:]).startswith(" Boots, surely.")
    prompt = prompt_sample(tok, DIALOGUE, len(tok(DIALOGUE)["input_ids"]) - 1, counter)
    text = decode(tok, prompt["prompt_ids"])
    assert text.endswith("Human: What shoes? Assistant:") and "Hi there" not in text
    assert prompt["prompt"] == DIALOGUE  # the data set's text, which a reward function may look its row up by
    assert counter.trimmed == 2


def test_sft_samples_of_a_dataset_label_answers_only(tmp_path, data_dir, tiny_tokenizer):
    train, _ = create_prompt_dataset([str(data_dir)], "1,0,0", str(tmp_path), 1, 1, tiny_tokenizer, 128)
    assert len(train) == 20
    by_prompt = {row["prompt"]: row for row in rows("train", 20)}
    for sample in train:
        n_prompt = sum(label == IGNORE_INDEX for label in sample["labels"])
        row = by_prompt[decode(tiny_tokenizer, sample["input_ids"][:n_prompt])]
        assert n_prompt == len(tiny_tokenizer(row["prompt"])["input_ids"])
        assert sample["labels"][n_prompt:] == ids(tiny_tokenizer, row["chosen"]) + [tiny_tokenizer.eos_token_id]


def test_sft_collator_right_pads_and_masks(tiny_tokenizer):
    tok = tiny_tokenizer
    counter = SampleCounter("sft")
    short = sft_sample(tok, " Human: Hi? Assistant:", " Yo", 64, counter)
    long = sft_sample(tok, " Human: What is the capital of France? Assistant:", " The capital is Paris", 64, counter)
    batch = DataCollatorSFT(tok.pad_token_id)([short, long])
    width = len(long["input_ids"])
    n = len(short["input_ids"])
    assert batch["input_ids"].shape == batch["labels"].shape == batch["attention_mask"].shape == (2, width)
    assert batch["input_ids"][0].tolist() == short["input_ids"] + [tok.pad_token_id] * (width - n)
    assert batch["labels"][0].tolist() == short["labels"] + [IGNORE_INDEX] * (width - n)
    assert batch["attention_mask"][0].tolist() == [1] * n + [0] * (width - n)
    assert batch["input_ids"][1].tolist() == long["input_ids"] and batch["attention_mask"][1].all()
    assert batch["input_ids"].dtype == batch["labels"].dtype == torch.long


# --------------------------------------------------------------------------- pairs and prompts


def test_pair_samples_keep_whole_pairs_only(tiny_tokenizer):
    tok, prompt = tiny_tokenizer, " Human: What is 7 + 12? Assistant:"
    counter = SampleCounter("pairs")
    assert pair_sample(tok, prompt, " 19", " 19", 64, counter) is None
    chosen, rejected = " 19", " I don't know."
    longest = len(tok(prompt)["input_ids"]) + len(ids(tok, rejected)) + 1
    assert pair_sample(tok, prompt, chosen, rejected, longest - 1, counter) is None
    pair = pair_sample(tok, prompt, chosen, rejected, longest, counter)
    prompt_ids = tok(prompt)["input_ids"]
    assert pair["chosen_ids"] == prompt_ids + ids(tok, chosen) + [tok.eos_token_id]
    assert pair["rejected_ids"] == prompt_ids + ids(tok, rejected) + [tok.eos_token_id]
    assert len(pair["rejected_ids"]) == longest
    assert counter.kept == 1
    assert "1 identical chosen and rejected" in counter.summary()
    assert "1 longer than --max_seq_len" in counter.summary()


def test_reward_collator_puts_chosen_rows_first(tiny_tokenizer):
    tok = tiny_tokenizer
    counter = SampleCounter("pairs")
    pairs = [pair_sample(tok, " Human: What is 1 + 1? Assistant:", " 2", " 3 or maybe 4", 64, counter),
             pair_sample(tok, " Human: Reverse the word \"abc\". Assistant:", " cba", " abc", 64, counter)]
    batch = DataCollatorReward(tok.pad_token_id)(pairs)
    sequences = [p["chosen_ids"] for p in pairs] + [p["rejected_ids"] for p in pairs]
    width = max(len(s) for s in sequences)
    assert batch["input_ids"].shape == batch["attention_mask"].shape == (4, width)
    for row, sequence in enumerate(sequences):
        pad = width - len(sequence)
        assert batch["input_ids"][row].tolist() == sequence + [tok.pad_token_id] * pad
        assert batch["attention_mask"][row].tolist() == [1] * len(sequence) + [0] * pad


def test_prompt_samples_and_left_padding_collator(tiny_tokenizer):
    tok = tiny_tokenizer
    counter = SampleCounter("prompts")
    short_prompt, long_prompt = " Human: Hi? Assistant:", " Human: What is the capital of Peru? Assistant:"
    long_len = len(tok(long_prompt)["input_ids"])
    assert prompt_sample(tok, long_prompt, long_len - 1, counter) is None
    samples = [prompt_sample(tok, short_prompt, long_len, counter), prompt_sample(tok, long_prompt, long_len, counter)]
    assert counter.kept == 2 and sum(counter.skipped.values()) == 1
    batch = DataCollatorRLHF(tok.pad_token_id)(samples)
    short_ids = tok(short_prompt)["input_ids"]
    pad = long_len - len(short_ids)
    assert pad > 0
    assert batch["prompt"][0].tolist() == [tok.pad_token_id] * pad + short_ids
    assert batch["prompt_att_mask"][0].tolist() == [0] * pad + [1] * len(short_ids)
    assert batch["prompt"][1].tolist() == tok(long_prompt)["input_ids"]
    assert batch["prompt_att_mask"][1].all()


def test_preference_collator_masks_answer_labels_eos_included(tiny_tokenizer):
    """answer_mask[b, t] = 1 exactly where the label input_ids[b, t + 1] is an answer token or its EOS, for
    prompts of different lengths in one batch; precomputed reference log-probs come in the same row order."""
    tok = tiny_tokenizer
    triples = [(" Human: What is 1 + 1? Assistant:", " 2", " 3 or maybe 4"),
               (" Human: Reverse the word \"abcd\". Assistant:", " dcba", " abcd")]
    counter = SampleCounter("pairs")
    pairs = [dict(pair_sample(tok, *triple, 64, counter), ref_chosen_logps=-1.0 - i, ref_rejected_logps=-3.0 - i)
             for i, triple in enumerate(triples)]
    batch = DataCollatorPreference(tok.pad_token_id)(pairs)
    assert batch["answer_mask"].shape == (4, batch["input_ids"].shape[1] - 1)
    answers = [chosen for _, chosen, _ in triples] + [rejected for _, _, rejected in triples]
    for row, answer in enumerate(answers):
        labels = batch["input_ids"][row, 1:][batch["answer_mask"][row] == 1].tolist()
        assert labels == ids(tok, answer) + [tok.eos_token_id]
    for pair, (prompt, _, _) in zip(pairs, triples):
        assert pair["prompt_len"] == len(tok(prompt)["input_ids"])
    assert batch["ref_logps"].tolist() == [-1.0, -2.0, -3.0, -4.0]
    assert "ref_logps" not in DataCollatorPreference(tok.pad_token_id)(
        [pair_sample(tok, *triples[0], 64, counter)])


def test_feedback_samples_label_each_answer_and_the_collator_pairs_each_prompt_with_another_answer(tiny_tokenizer):
    """KTO's samples: a pair gives a desirable and an undesirable answer (a too long one is skipped and counted);
    the collator's mismatched rows put each prompt before the previous row's answer, with answer masks over the
    answer labels, EOS included."""
    tok = tiny_tokenizer
    add, rev = " Human: What is 1 + 1? Assistant:", " Human: Reverse the word \"abcd\". Assistant:"
    counter = SampleCounter("feedback")
    samples = feedback_samples(tok, add, " 2", " 3 or maybe 4", 64, counter)
    samples += feedback_samples(tok, rev, None, " abcd", 64, counter)
    assert [s["desirable"] for s in samples] == [True, False, False]
    assert feedback_samples(tok, rev, " dcba" * 40, None, 64, counter) == []
    assert counter.counts() == {"read": 4, "kept": 3, "skipped": {"longer than --max_seq_len with its EOS": 1}}
    batch = DataCollatorFeedback(tok.pad_token_id)(samples)
    assert batch["desirable"].tolist() == [True, False, False]
    # Row b of the mismatched pairs: prompt b, then row b - 1's answer (row 0: the last row's).
    prompts, answers = [add, add, rev], [" 2", " 3 or maybe 4", " abcd"]
    for prefix, answer_of in (("", [0, 1, 2]), ("kl_", [2, 0, 1])):
        ids_ = batch[f"{prefix}input_ids"]
        assert batch[f"{prefix}answer_mask"].shape == (3, ids_.shape[1] - 1)
        for row in range(3):
            length = int(batch[f"{prefix}attention_mask"][row].sum())
            expected = ids(tok, answers[answer_of[row]]) + [tok.eos_token_id]
            assert ids_[row, :length].tolist() == tok(prompts[row])["input_ids"] + expected
            assert ids_[row, 1:][batch[f"{prefix}answer_mask"][row] == 1].tolist() == expected


# --------------------------------------------------------------------------- lengths from the data (auto)


def test_auto_max_lengths_fit_the_longest_sample_and_twice_the_longest_answer(tmp_path, data_dir, tiny_tokenizer):
    from argparse import Namespace

    from utils.data.data_utils import ANSWER_ROOM, data_bound, fit_auto_lengths, tokenize_answer, tokenize_prompt

    source = rows("train", 20) + rows("eval", 10)
    longest_answer = max(len(tokenize_answer(tiny_tokenizer, row["chosen"])) for row in source)
    # Phase 1 built without a bound keeps every answer whole; --max_seq_len auto is then its longest sample.
    train, evaluation = create_prompt_dataset([str(data_dir)], "10,0,0", str(tmp_path), 1, 1, tiny_tokenizer,
                                              data_bound("auto"))
    whole = [len(tokenize_prompt(tiny_tokenizer, r["prompt"]) + tokenize_answer(tiny_tokenizer, r["chosen"]))
             for r in source]
    assert sorted(len(s["input_ids"]) for s in [*train, *evaluation]) == sorted(whole)
    args = Namespace(seed=1, max_seq_len="auto:max", max_answer_seq_len="auto:max", max_new_tokens=7)
    fit_auto_lengths(args, [str(data_dir)], tiny_tokenizer, train, evaluation)
    assert args.max_seq_len == max(whole) and args.max_new_tokens == 7  # a number is left as given
    assert args.max_answer_seq_len == ANSWER_ROOM * longest_answer
    assert len(train) + len(evaluation) == len(source)  # auto:max drops nothing
    # Phase 3: --max_prompt_seq_len auto:100 is the longest prompt, and no prompt is skipped.
    prompts, _ = create_prompt_dataset([str(data_dir)], "0,0,10", str(tmp_path), 3, 1, tiny_tokenizer, None)
    args = Namespace(seed=1, max_prompt_seq_len="auto:100")
    fit_auto_lengths(args, [str(data_dir)], tiny_tokenizer, prompts)
    assert len(prompts) == 20
    assert args.max_prompt_seq_len == max(len(tokenize_prompt(tiny_tokenizer, r["prompt"])) for r in rows("train", 20))


def test_an_auto_answer_length_leaves_the_prompt_its_room_in_the_context(tmp_path, tiny_tokenizer, monkeypatch):
    """Before: HH-like data with the tiny model (a context of 512) took --max_prompt_seq_len 309 and
    --max_answer_seq_len 512, which step 3 trained with and the closing evaluation then refused ("max_new_tokens
    512 leaves no room for a prompt")."""
    from argparse import Namespace

    from utils.data.data_utils import auto_length_cap, fit_auto_lengths

    context = auto_length_cap(tiny_tokenizer)
    long_answer = " word" * context
    write_jsonl(tmp_path / "data" / "train.jsonl", [{"prompt": f" Human: q{i} Assistant:", "chosen": long_answer}
                                                   for i in range(10)])
    args = Namespace(seed=1, max_prompt_seq_len=40, max_answer_seq_len="auto")
    fit_auto_lengths(args, [str(tmp_path / "data")], tiny_tokenizer)
    assert args.max_answer_seq_len == context - 40


def test_an_auto_answer_length_of_data_without_reference_answers_is_a_fixed_budget_said_aloud(tiny_tokenizer,
                                                                                             capsys):
    from argparse import Namespace

    from utils.data.data_utils import UNMEASURED_ANSWER_TOKENS, fit_auto_lengths

    args = Namespace(seed=1, max_answer_seq_len="auto", max_new_tokens=7)
    fit_auto_lengths(args, ["reasoning_gym:graph_color?size=12"], tiny_tokenizer)
    assert args.max_answer_seq_len == UNMEASURED_ANSWER_TOKENS and args.max_new_tokens == 7
    assert "--max_answer_seq_len auto: reasoning_gym:graph_color?size=12 has no reference answers to measure; " \
           f"{UNMEASURED_ANSWER_TOKENS} tokens" in capsys.readouterr().out


def long_tailed_data(folder, n_train=80, n_eval=20):
    """A local data set whose answers are mostly short, a few long (the long tail of real dialogue)."""
    def row(split, i):
        words = 40 + i if i % 20 == 19 else 1 + i % 4  # one row in twenty is long
        return {"prompt": f" Human: {split} question {i}? Assistant:", "chosen": " " + " ".join(["ok"] * words),
                "rejected": f" no {i}"}

    folder.mkdir()
    write_jsonl(folder / "train.json", [row("train", i) for i in range(n_train)])
    write_jsonl(folder / "eval.json", [row("eval", i) for i in range(n_eval)])
    return folder


def test_auto_is_the_95th_percentile_and_drops_and_counts_the_longer_rows(tmp_path, tiny_tokenizer, capsys):
    from argparse import Namespace

    from utils.data.data_utils import data_bound, data_metrics, fit_auto_lengths, percentile_length, sample_length

    data = long_tailed_data(tmp_path / "data")
    train, evaluation = create_prompt_dataset([str(data)], "1,0,0", str(tmp_path / "cache"), 1, 1, tiny_tokenizer,
                                              data_bound("auto"))
    lengths = sorted(sample_length(s) for s in [*train, *evaluation])
    assert len(lengths) == 100
    args = Namespace(seed=1, max_seq_len="auto")
    fit_auto_lengths(args, [str(data)], tiny_tokenizer, train, evaluation)
    # the nearest-rank 95th percentile: the 95th of the 100 lengths, sorted
    assert args.max_seq_len == lengths[94] == percentile_length(lengths, 95) < lengths[-1]
    kept = [length for length in lengths if length <= args.max_seq_len]
    assert len(train) + len(evaluation) == len(kept) < 100
    assert all(sample_length(s) <= args.max_seq_len for s in [*train, *evaluation])
    out = capsys.readouterr().out
    assert f"lengths from the data: --max_seq_len {args.max_seq_len} (95th percentile of 100 samples)" in out
    assert f"WARNING: --max_seq_len auto ({args.max_seq_len} tokens) dropped " in out
    metrics = data_metrics(train.counts)
    assert metrics["train_rows_read"] == 80 and metrics["eval_rows_read"] == 20
    assert (metrics["train_rows_kept"], metrics["eval_rows_kept"]) == (len(train), len(evaluation))
    assert metrics["rows_skipped"] == {"train": {"longer than --max_seq_len auto": 4},
                                       "eval": {"longer than --max_seq_len auto": 1}}


def test_auto_with_a_rebuild_keeps_long_dialogues_by_their_last_turns(tmp_path, tiny_tokenizer):
    from argparse import Namespace

    from utils.data.data_utils import data_bound, data_metrics, fit_auto_lengths, sample_length

    data = tmp_path / "data"
    data.mkdir()
    short = [{"prompt": f" Human: Say {i}. Assistant:", "chosen": f" {i}"} for i in range(18)]
    long = [{"prompt": " Human: Tell me a long story about mountains and rivers. Assistant: Once upon a time "
             f"there was a river. Human: Say {i}. Assistant:", "chosen": f" {i}"} for i in range(2)]
    write_jsonl(data / "train.json", short + long)
    write_jsonl(data / "eval.json", short[:5])

    def build(limit):
        return create_prompt_dataset([str(data)], "1,0,0", str(tmp_path / "cache"), 1, 1, tiny_tokenizer, limit)

    train, evaluation = build(data_bound("auto:80"))
    args = Namespace(seed=1, max_seq_len="auto:80")
    fit_auto_lengths(args, [str(data)], tiny_tokenizer, train, evaluation, rebuild=build)
    assert len(train) == 20 and all(sample_length(sample) <= args.max_seq_len for sample in train)
    assert data_metrics(train.counts)["train_rows_trimmed"] == 2  # the two dialogues, by their last turn
    texts = [decode(tiny_tokenizer, sample["input_ids"]) for sample in train]
    assert sum(text.startswith(" Human: Say") for text in texts) == 20 and not any("river" in text for text in texts)


def test_auto_percentiles_and_the_cap(tmp_path, tiny_tokenizer, capsys, monkeypatch):
    from argparse import Namespace

    from utils.data.data_utils import (AUTO_LENGTH_CAP, auto_length_cap, auto_percentile, data_bound,
                                       fit_auto_lengths, percentile_length, sample_length)

    assert [auto_percentile(v) for v in ("auto", "auto:max", "auto:100", "auto:50", 64, None)] == \
        [95.0, 100.0, 100.0, 50.0, None, None]
    for bad in ("auto:", "auto:0", "auto:101", "auto:most", "auto:nan"):
        with pytest.raises(ConfigError, match="auto:max"):
            auto_percentile(bad)
    assert percentile_length([5, 1, 3, 2, 4], 50) == 3 and percentile_length([5, 1, 3, 2, 4], 100) == 5
    assert percentile_length([7], 1) == 7 and percentile_length([], 95) == 0
    data = long_tailed_data(tmp_path / "data")

    def fitted(spec, max_auto_len=None):
        train, evaluation = create_prompt_dataset([str(data)], "1,0,0", str(tmp_path / "cache"), 1, 1,
                                                  tiny_tokenizer, data_bound(spec))
        lengths = [sample_length(s) for s in [*train, *evaluation]]
        args = Namespace(seed=1, max_seq_len=spec, max_auto_len=max_auto_len)
        fit_auto_lengths(args, [str(data)], tiny_tokenizer, train, evaluation)
        return args.max_seq_len, lengths, len(train) + len(evaluation)

    value, lengths, kept = fitted("auto:50")
    assert value == percentile_length(lengths, 50) and kept == sum(length <= value for length in lengths) >= 50
    assert fitted("auto:max")[::2] == (max(lengths), 100)
    # --max_auto_len: a bound of memory and time below the model's context
    value, lengths, kept = fitted("auto:max", max_auto_len=max(lengths) - 1)
    assert value == max(lengths) - 1 and kept == sum(length < max(lengths) for length in lengths) < 100
    # the cap: the context the tokenizer states (the tiny model's 512), else AUTO_LENGTH_CAP
    assert auto_length_cap(tiny_tokenizer) == 512
    monkeypatch.setattr(tiny_tokenizer, "model_max_length", int(1e30))  # Hugging Face's "unknown"
    assert auto_length_cap(tiny_tokenizer) == AUTO_LENGTH_CAP
    monkeypatch.setattr(tiny_tokenizer, "model_max_length", 23)
    capsys.readouterr()
    value, lengths, kept = fitted("auto:max")
    assert value == 23 and 0 < kept == sum(length <= 23 for length in lengths) < 100
    assert f"--max_seq_len 23 (100th percentile of 100 samples: {max(lengths)}, capped at 23)" in \
        capsys.readouterr().out
    monkeypatch.setattr(tiny_tokenizer, "model_max_length", 10)  # shorter than any sample: nothing is left
    with pytest.raises(DataError, match=r"no train samples left within --max_seq_len auto \(10 tokens\)"):
        fitted("auto")


def test_an_auto_answer_length_of_the_evaluation_leaves_half_the_context_to_the_prompt(tmp_path, tiny_tokenizer,
                                                                                       monkeypatch, capsys):
    """prompt_eval.py's --max_new_tokens auto on answers longer than the context (arc_agi's: 3,250 tokens against
    the tiny model's 512) was the whole context, which its own check then refused: no room for a prompt."""
    from argparse import Namespace

    from utils.data.data_utils import fit_auto_lengths

    data = long_tailed_data(tmp_path / "data")
    monkeypatch.setattr(tiny_tokenizer, "model_max_length", 16)
    args = Namespace(seed=1, max_new_tokens="auto:max")
    fit_auto_lengths(args, [str(data)], tiny_tokenizer)
    assert args.max_new_tokens == 8
    assert "capped at 8 (half the context 16: the other half for the prompt)" in capsys.readouterr().out


@pytest.mark.parametrize("text, expected", [("auto", "auto"), ("auto:max", "auto:max"), ("auto:50", "auto:50"),
                                            ("auto:100", "auto:100"), ("1", 1), ("64", 64)])
def test_length_flags_take_a_positive_number_or_auto(text, expected):
    from argparse import Namespace

    from utils.runtime.args import check_flag_ranges, is_auto, length_or_auto

    assert length_or_auto(text) == expected
    assert is_auto(expected) == isinstance(expected, str)
    check_flag_ranges(Namespace(max_seq_len=expected, max_new_tokens=expected))  # an auto form is no number to range


@pytest.mark.parametrize("text", ["auto:", "auto:0", "auto:101", "auto:most", "auto:nan", "automatic", "8.5",
                                  "longest"])
def test_a_length_flag_refuses_other_values_naming_the_forms_it_takes(text):
    from argparse import ArgumentTypeError

    from utils.runtime.args import length_or_auto

    with pytest.raises(ArgumentTypeError, match=rf"^must be a positive number of tokens or auto, not '{text}' "
                                                r"\(auto's forms: auto, auto:max or auto:P with P in \(0, 100\]\)$"):
        length_or_auto(text)
    with pytest.raises(ArgumentTypeError, match=r"^must be at least 1 \(or auto\), not 0$"):
        length_or_auto("0")


@pytest.mark.parametrize("size, batch_size", [(10, 4), (8, 4), (3, 8), (1, 3)])
def test_full_batch_sampler_repeats_the_first_indices_up_to_whole_batches(size, batch_size):
    from utils.data.data_utils import make_dataloader

    loader = make_dataloader(list(range(size)), lambda samples: samples, batch_size, shuffle=True, seed=3,
                             full_batches=True)
    loader.sampler.set_epoch(0)
    batches = list(loader)
    assert len(batches) == len(loader) == -(-size // batch_size)
    assert all(len(batch) == batch_size for batch in batches)
    order = [index for batch in batches for index in batch]
    assert sorted(order[:size]) == list(range(size))  # every sample once, in the shuffled order
    assert all(order[i] == order[i % size] for i in range(len(order)))  # then the first ones again
    generator = loader.sampler.generator  # the shuffle's own generator: checkpoints save and restore its state
    assert generator is loader.sampler.sampler.generator
    state = generator.get_state()
    first = list(loader)
    generator.set_state(state)
    assert list(loader) == first


@pytest.mark.parametrize("name, content, message", [
    ("unsup.txt", b"ok\n\xa6\xff\n", "not UTF-8 text (line 2, byte 3)"),
    ("unsup.jsonl", b'{"text": 5}\n', "row 0 (line 1): expected a row with a string field 'text'"),
    ("unsup.jsonl", b'{"text": "abc"}\n\n{"text": "ab\\ud800cd"}\n',
     "row 1 (line 3): field 'text' is not valid Unicode text: a lone surrogate"),
    ("unsup.jsonl", b'{"text": "abc"\n', "malformed JSON on line 1"),
    ("unsup.parquet", b"PAR1 cut short", "not a readable Parquet file"),
    ("unsup.csv", b'text\n"abc\n', "malformed CSV on line 2"),
    ("unsup.json", b'[{"text": "abc"}, ["abc"]]', "row 1: expected a row with a string field 'text'"),
])
def test_a_bad_unsupervised_file_is_one_error_naming_the_file_and_line(tmp_path, tiny_tokenizer, name, content,
                                                                       message):
    from utils.data.data_utils import create_unsupervised_dataset

    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(DataError) as err:
        create_unsupervised_dataset(str(path), None, tiny_tokenizer, 4, 1234)
    assert str(err.value).startswith(f"--unsupervised_dataset_name {path}: {message}")


def test_an_unsupervised_json_array_reads_as_its_json_lines_do(tmp_path, tiny_tokenizer):
    from utils.data.data_utils import create_unsupervised_dataset

    texts = [f"document {i} " + "word " * 12 for i in range(3)]
    array, lines = tmp_path / "unsup.json", tmp_path / "unsup.jsonl"
    array.write_text(json.dumps([{"text": text} for text in texts], indent=2), encoding="utf-8")
    lines.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts), encoding="utf-8")
    blocks = [create_unsupervised_dataset(str(path), None, tiny_tokenizer, 8, 1234) for path in (array, lines)]
    assert len(blocks[0]) > 0 and list(blocks[0]) == list(blocks[1])


def test_an_unsupervised_parquet_or_csv_file_reads_as_its_json_lines_do(tmp_path, tiny_tokenizer):
    """Their `text` column (before: their bytes read as text lines, a Parquet file refused as not UTF-8 and a CSV
    file's header line and quotes taken as text)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from utils.data.data_utils import create_unsupervised_dataset

    texts = [f"document {i}, " + "word " * 12 for i in range(3)]
    lines, table, csv = tmp_path / "unsup.jsonl", tmp_path / "unsup.parquet", tmp_path / "unsup.csv"
    lines.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts), encoding="utf-8")
    pq.write_table(pa.table({"id": list(range(3)), "text": texts}), table)
    csv.write_text("id,text\n" + "".join(f'{i},"{text}"\n' for i, text in enumerate(texts)), encoding="utf-8")
    blocks = [create_unsupervised_dataset(str(path), None, tiny_tokenizer, 8, 1234) for path in (lines, table, csv)]
    assert len(blocks[0]) > 0 and list(blocks[0]) == list(blocks[1]) == list(blocks[2])


def test_an_unsupervised_file_with_a_bom_reads_and_its_special_token_text_is_text(tmp_path, tiny_tokenizer):
    from utils.data.data_utils import create_unsupervised_dataset

    path = tmp_path / "unsup.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"text": "old</s>new ' + b"word " * 20 + b'"}\n')
    blocks = create_unsupervised_dataset(str(path), None, tiny_tokenizer, 8, 1234)
    ids = [token for block in blocks for token in block["input_ids"]]
    assert ids and tiny_tokenizer.eos_token_id not in ids[:-1]  # the document's one EOS ends it, if kept


def test_rows_with_one_answer_are_skipped_by_a_pair_step_as_no_pair_not_as_no_answer(tmp_path, tiny_tokenizer):
    """Alpaca's or KTO's rows in step 2 or DPO: each has its answer; what it lacks is a rejected one (the count said
    "no answer")."""
    from utils.data.data_utils import SampleCounter, build_samples
    from utils.data.raw_datasets import LocalJsonFile

    rows = [{"prompt": f"What is {i} + 1?", "completion": f" {i + 1}"} for i in range(10)]
    (tmp_path / "sft.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    raw, counter = LocalJsonFile(tmp_path / "sft.jsonl"), SampleCounter("pairs")
    assert build_samples(raw, raw.get_train_data(), 2, tiny_tokenizer, 64, counter) == []
    assert counter.skipped == {"no rejected answer (not a pair)": 9}
