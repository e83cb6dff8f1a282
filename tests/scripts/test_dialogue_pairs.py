"""Tests of scripts/dialogue_pairs.py: HH-RLHF-shaped dialogue pairs with long-tailed lengths, read by the data
pipeline as any HH-RLHF file, and the rows each step keeps at a fixed and at an `auto` length."""
import json

from scripts.dialogue_pairs import make_pairs, rows_kept, write_pairs
from utils.data.pair_formats import read_pair


def test_pairs_are_hh_rlhf_dialogues_differing_in_the_last_answer_only():
    pairs = make_pairs(200, seed=3)
    assert pairs == make_pairs(200, seed=3) and pairs != make_pairs(200, seed=4)
    for index, row in enumerate(pairs):
        pair = read_pair(row, f"row {index}")
        assert pair["prompt"].startswith("\n\nHuman: ") and pair["prompt"].endswith("\n\nAssistant:")
        assert pair["chosen"].strip() and pair["chosen"] != pair["rejected"]
        assert "Human:" not in pair["chosen"] + pair["rejected"]
    turns = [row["chosen"].count("Human:") for row in pairs]
    assert min(turns) == 1 and max(turns) >= 4 and sum(t == 1 for t in turns) > len(turns) / 3  # a long tail


def test_rows_kept_at_a_fixed_length_and_at_auto(tmp_path, tiny_tokenizer):
    data = write_pairs(tmp_path / "dialogue", 300, 60, seed=1)
    assert len((data / "train.jsonl").read_text().splitlines()) == 300
    assert json.loads((data / "eval.jsonl").read_text().splitlines()[0]).keys() == {"chosen", "rejected"}
    cache = tmp_path / "cache"
    fixed, used = rows_kept(data, 1, 64, tiny_tokenizer, cache)
    # 2,4,4: part 1 is a fifth; not even a last turn and its answer fit 64 of the tiny model's tokens
    assert used == 64 and fixed == {"train": (60, 0, 0), "eval": (12, 0, 0)}
    read, kept, trimmed = rows_kept(data, 1, 256, tiny_tokenizer, cache)[0]["train"]
    assert read == 60 and 0 < trimmed <= kept < 60  # dialogues kept by their last turns, the longest still too long
    auto, used = rows_kept(data, 1, "auto", tiny_tokenizer, cache)
    assert 64 < used <= 512 and auto["train"][0] == 60 and 0.95 * 60 <= auto["train"][1]
    assert 0 < auto["train"][2] <= 0.05 * 60 + 1  # the rows over the 95th percentile keep their last turns
    pairs, used = rows_kept(data, 2, "auto:max", tiny_tokenizer, cache)
    assert pairs["train"][0] == 120 and pairs["train"][2] <= pairs["train"][1] <= 120 and used <= 512  # the
    # tiny model's context caps the longest
