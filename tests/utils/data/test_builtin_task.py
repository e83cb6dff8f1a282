"""Tests of the built-in task: the checker on hand-worked answers, the pairs, the held-out split and the files."""
import json
import re
import zlib

import pytest

from utils.data import builtin_task as task

ADD = " Human: What is 7 + 12? Assistant:"
REVERSE = ' Human: Reverse the word "cat". Assistant:'
CAPITAL = " Human: What is the capital of France? Assistant:"
UPPER = ' Human: Say "apple" in uppercase. Assistant:'

SMALL = dict(seed=7, num_train=2000, num_eval=200, num_heldout=200, num_unsup=300)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return task.write_builtin_data(tmp_path_factory.mktemp("task") / "data", **SMALL)


def read_lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


# ---------------------------------------------------------------------------------------------------------
# The checker
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "prompt, answer, expected_score",
    [
        # add: 7 + 12 = 19
        (ADD, " 19", 1.0),
        (ADD, "19\n", 1.0),
        (ADD, " 20", 0.5),
        (ADD, " 17", 0.5),
        (ADD, " 22", 0.25),
        (ADD, " 019", 0.25),  # not the exact text
        (ADD, " 19 Human: What", 0.0),  # did not stop
        (ADD, " nineteen", 0.0),
        (ADD, " I don't know.", 0.0),
        (ADD, "", 0.0),
        # reverse: cat -> tac
        (REVERSE, " tac", 1.0),
        (REVERSE, " act", 0.5),  # anagram
        (REVERSE, " cat", 0.5),  # the word itself is an anagram
        (REVERSE, " tax", 0.5),  # one substitution
        (REVERSE, " ta", 0.5),  # one deletion
        (REVERSE, " tacs", 0.5),  # one insertion
        (REVERSE, " dog", 0.25),
        (REVERSE, " t", 0.25),
        (REVERSE, " TAC", 0.0),
        (REVERSE, " tac tac", 0.0),
        # capital: France -> Paris
        (CAPITAL, " Paris", 1.0),
        (CAPITAL, " Rome", 0.5),
        (CAPITAL, " France", 0.25),
        (CAPITAL, " Par", 0.25),
        (CAPITAL, " paris", 0.0),
        (CAPITAL, " Paris.", 0.0),
        (CAPITAL, " 12", 0.0),
        # upper: apple -> APPLE
        (UPPER, " APPLE", 1.0),
        (UPPER, " apple", 0.5),  # right letters, wrong case
        (UPPER, " ApPLE", 0.5),
        (UPPER, " APPLY", 0.5),  # one substitution
        (UPPER, " APPL", 0.5),  # one deletion
        (UPPER, " APP", 0.25),
        (UPPER, " BANANA", 0.25),
        (UPPER, " banana", 0.0),
        (UPPER, " APPLE APPLE", 0.0),
    ],
)
def test_score_answer_hand_worked(prompt, answer, expected_score):
    assert task.score_answer(prompt, answer) == expected_score


@pytest.mark.parametrize(
    "template_index, expected_question",
    [
        (0, "What is the capital of Japan?"),
        (1, "Name the capital city of Japan."),
        (2, "Which city is the capital of Japan?"),
    ],
)
def test_every_capital_phrasing_is_parsed(template_index, expected_question):
    prompt = task.format_prompt(task.capital_question(template_index, "Japan"))
    assert prompt == f" Human: {expected_question} Assistant:"
    assert task.parse_prompt(prompt) == ("capital", "Tokyo")
    assert task.score_answer(prompt, " Tokyo") == 1.0


def test_parse_prompt_gives_skill_and_bare_answer():
    assert task.parse_prompt(ADD) == ("add", "19")
    assert task.parse_prompt(REVERSE) == ("reverse", "tac")
    assert task.parse_prompt(CAPITAL) == ("capital", "Paris")
    assert task.parse_prompt(UPPER) == ("upper", "APPLE")
    assert task.parse_prompt("Human: What is 100 + 23?\nAssistant:") == ("add", "123")


@pytest.mark.parametrize(
    "prompt",
    [
        " Human: What is 7 - 12? Assistant:",
        " Human: What is the capital of Atlantis? Assistant:",
        " Human: Tell me a joke. Assistant:",
        "What is 7 + 12?",
        "",
    ],
)
def test_unknown_prompts_raise(prompt):
    with pytest.raises(ValueError):
        task.parse_prompt(prompt)
    with pytest.raises(ValueError, match="prompt"):
        task.score_answer(prompt, " 19")


def test_is_one_edit_away():
    assert task.is_one_edit_away("tac", "tax")
    assert task.is_one_edit_away("tac", "ta")
    assert task.is_one_edit_away("tac", "stac")
    assert not task.is_one_edit_away("tac", "tac")
    assert not task.is_one_edit_away("tac", "cat")
    assert not task.is_one_edit_away("tac", "t")


def test_summarize_scores_hand_worked():
    prompts = [ADD, ADD, REVERSE, UPPER]
    answers = [" 19", " 20", " ta", " nope"]
    summary = task.summarize_scores(prompts, answers)
    assert summary == {"all": (1.0 + 0.5 + 0.5 + 0.0) / 4, "add": 0.75, "reverse": 0.5, "upper": 0.0}
    assert list(summary) == ["all", "add", "reverse", "upper"]
    with pytest.raises(ValueError):
        task.summarize_scores([ADD], [])


def test_country_table():
    assert len(task.COUNTRIES) == 30
    assert len(set(task.COUNTRIES.values())) == 30
    for country, capital in task.COUNTRIES.items():
        assert country.isascii() and capital.isascii()
        assert re.fullmatch(r"[A-Z][a-z]+", capital), capital  # a right answer has the capital format
        assert country not in task.COUNTRIES.values()


# ---------------------------------------------------------------------------------------------------------
# The held-out split
# ---------------------------------------------------------------------------------------------------------


def test_heldout_split_is_fixed():
    assert len(task.HELDOUT_ADD_PAIRS) == 80 and len(task.TRAIN_ADD_PAIRS) == 320
    assert not set(task.HELDOUT_ADD_PAIRS) & set(task.TRAIN_ADD_PAIRS)
    assert len(task.HELDOUT_CAPITAL_COMBOS) == 20 and len(task.TRAIN_CAPITAL_COMBOS) == 70
    # Pinned, so that a change of the split (which would invalidate every comparison of runs) is noticed.
    assert zlib.crc32(repr(task.HELDOUT_ADD_PAIRS).encode()) == 4013784636
    assert zlib.crc32(repr(task.HELDOUT_CAPITAL_COMBOS).encode()) == 575529661
    assert task.is_heldout_word("dog") and not task.is_heldout_word("cat")


def test_every_country_is_trained_under_some_phrasing():
    assert {country for _, country in task.TRAIN_CAPITAL_COMBOS} == set(task.COUNTRIES)


def test_a_word_and_its_reversal_share_the_split():
    words = ["dog", "cat", "abcde", "zyxw", "hello", "qqa"]
    for word in words:
        assert task.is_heldout_word(word) == task.is_heldout_word(word[::-1])


def test_heldout_set_does_not_depend_on_the_data_seed():
    sums = set()
    for seed in (1, 2):
        for record in task.make_heldout(400, seed):
            if record["skill"] == "add":
                a, b = map(int, re.findall(r"\d+", record["prompt"]))
                sums.add((a, b))
    assert sums <= set(task.HELDOUT_ADD_PAIRS)


# ---------------------------------------------------------------------------------------------------------
# The pairs
# ---------------------------------------------------------------------------------------------------------


def test_chosen_beats_rejected_in_every_pair(data_dir):
    pairs = read_lines(data_dir / "train.json") + read_lines(data_dir / "eval.json")
    assert len(pairs) == SMALL["num_train"] + SMALL["num_eval"]
    for pair in pairs:
        assert set(pair) == {"prompt", "chosen", "rejected"}
        chosen_score = task.score_answer(pair["prompt"], pair["chosen"])
        assert chosen_score > task.score_answer(pair["prompt"], pair["rejected"]), pair


def test_score_levels_of_the_pairs(data_dir):
    pairs = read_lines(data_dir / "train.json")
    chosen = [task.score_answer(p["prompt"], p["chosen"]) for p in pairs]
    rejected = [task.score_answer(p["prompt"], p["rejected"]) for p in pairs]
    assert 0.75 < sum(chosen) / len(chosen) < 0.95
    assert sum(rejected) / len(rejected) < 0.4
    hard_negatives = sum(c == 1.0 and r == 0.5 for c, r in zip(chosen, rejected))
    assert hard_negatives / len(pairs) > 0.2
    assert any(p["rejected"] == task.NOT_KNOWN for p in pairs)


def test_pairs_mix_the_four_skills_uniformly(data_dir):
    pairs = read_lines(data_dir / "train.json")
    skills = [task.parse_prompt(p["prompt"])[0] for p in pairs]
    for skill in task.SKILLS:
        assert 0.2 < skills.count(skill) / len(skills) < 0.3


def test_prompt_and_answer_format(data_dir):
    for pair in read_lines(data_dir / "train.json"):
        assert re.fullmatch(r" Human: \S.*\S Assistant:", pair["prompt"])
        for answer in (pair["chosen"], pair["rejected"]):
            assert answer.startswith(" ") and not answer.startswith("  ")


# ---------------------------------------------------------------------------------------------------------
# The files
# ---------------------------------------------------------------------------------------------------------


def test_files_written(data_dir):
    assert sorted(p.name for p in data_dir.iterdir()) == sorted(task.FILE_NAMES)
    meta = json.loads((data_dir / "meta.json").read_text())
    assert meta["version"] == task.TASK_VERSION and meta["seed"] == SMALL["seed"]
    assert meta["num_train"] == SMALL["num_train"]
    assert len((data_dir / "unsup.txt").read_text().splitlines()) == SMALL["num_unsup"]


def test_heldout_prompts_never_in_train_or_eval(data_dir):
    heldout = task.heldout_prompts(data_dir)
    assert len(heldout) == SMALL["num_heldout"]
    seen = {p["prompt"] for p in read_lines(data_dir / "train.json") + read_lines(data_dir / "eval.json")}
    assert not {record["prompt"] for record in heldout} & seen


def test_heldout_records_are_balanced_and_answered_right(data_dir):
    heldout = task.heldout_prompts(data_dir)
    skills = [record["skill"] for record in heldout]
    assert all(skills.count(skill) == SMALL["num_heldout"] // 4 for skill in task.SKILLS)
    for record in heldout:
        assert task.parse_prompt(record["prompt"]) == (record["skill"], record["answer"])
        assert task.score_answer(record["prompt"], " " + record["answer"]) == 1.0


def test_unsup_keeps_heldout_facts_out(data_dir):
    text = (data_dir / "unsup.txt").read_text()
    assert "plus" in text and "reversed is" in text and "capital of" in text and "in uppercase" in text
    sums = set(re.findall(r"(\d+) (?:plus|\+) (\d+)", text))
    assert sums and not {(int(a), int(b)) for a, b in sums} & set(task.HELDOUT_ADD_PAIRS)
    words = re.findall(r"The word ([a-z]+) reversed", text) + re.findall(r"[A-Z]+ is ([a-z]+) in uppercase", text)
    assert words and not any(task.is_heldout_word(word) for word in words)
    unsup_words = set(re.findall(r"[A-Za-z]+", text))
    for record in task.heldout_prompts(data_dir):
        if record["skill"] in ("reverse", "upper"):
            assert record["answer"] not in unsup_words


def test_same_seed_gives_identical_files(data_dir, tmp_path):
    again = task.write_builtin_data(tmp_path / "again", **SMALL)
    for name in task.FILE_NAMES:
        assert (again / name).read_bytes() == (data_dir / name).read_bytes(), name


def test_different_seed_gives_different_data(data_dir, tmp_path):
    other = task.write_builtin_data(tmp_path / "other", **{**SMALL, "seed": 8})
    for name in ("train.json", "eval.json", "heldout.json", "unsup.txt"):
        assert (other / name).read_bytes() != (data_dir / name).read_bytes(), name


def test_load_dataset_reads_the_files(data_dir, tmp_path):
    datasets = pytest.importorskip("datasets")
    loaded = datasets.load_dataset(
        "json",
        data_files={"train": str(data_dir / "train.json"), "eval": str(data_dir / "eval.json")},
        cache_dir=str(tmp_path / "hf-cache"),
    )
    assert loaded["train"].num_rows == SMALL["num_train"]
    assert loaded["eval"].num_rows == SMALL["num_eval"]
    assert set(loaded["train"].column_names) == {"prompt", "chosen", "rejected"}
    assert loaded["train"][0] == read_lines(data_dir / "train.json")[0]


def test_corpus_texts(data_dir):
    texts = list(task.corpus_texts(data_dir))
    assert len(texts) == 2 * SMALL["num_train"] + SMALL["num_unsup"]
    first = read_lines(data_dir / "train.json")[0]
    assert texts[0] == first["prompt"] + first["chosen"]
    assert texts[-1] == (data_dir / "unsup.txt").read_text().splitlines()[-1]


def test_failed_write_leaves_nothing(tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        raise OSError("disk full (injected)")

    monkeypatch.setattr(task, "_write_unsup", fail)  # after train/eval/heldout are written
    out_dir = tmp_path / "data"
    with pytest.raises(OSError, match="injected"):
        task.write_builtin_data(out_dir, **SMALL)
    assert not out_dir.exists()
    assert list(tmp_path.iterdir()) == []  # the temporary directory is gone too


def test_complete_dir_is_reused_without_rewriting(data_dir, monkeypatch):
    before = {name: (data_dir / name).stat().st_mtime_ns for name in task.FILE_NAMES}

    def fail(*args, **kwargs):
        raise AssertionError("regenerated a complete directory")

    monkeypatch.setattr(task, "make_pairs", fail)
    assert task.write_builtin_data(data_dir, **SMALL) == data_dir
    assert {name: (data_dir / name).stat().st_mtime_ns for name in task.FILE_NAMES} == before


def test_dir_of_other_data_is_refused(data_dir):
    with pytest.raises(FileExistsError):
        task.write_builtin_data(data_dir, **{**SMALL, "seed": 99})


def test_losing_a_race_returns_the_winners_dir(tmp_path, monkeypatch):
    small = {**SMALL, "num_train": 20, "num_eval": 4, "num_heldout": 8, "num_unsup": 5}
    out_dir = task.write_builtin_data(tmp_path / "data", **small)
    winner = (out_dir / "train.json").read_bytes()
    monkeypatch.setattr(task, "_can_reuse", lambda *args: False)  # as if the winner renamed after our check
    assert task.write_builtin_data(out_dir, **small) == out_dir
    assert (out_dir / "train.json").read_bytes() == winner
    assert [p.name for p in tmp_path.iterdir()] == ["data"]
