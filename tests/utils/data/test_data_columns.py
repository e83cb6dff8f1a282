"""Data sets by their hub name, save_to_disk folders and the data-columns flags (--prompt_key ...): get_raw_dataset
reads them into the row shapes of utils/data/pair_formats.py, offline (a data set in a temporary Hugging Face cache,
never the network); a column a flag names that is not there, or a name that cannot be loaded, is one DataError
line; an HH dialogue whose final answer is empty is skipped and counted, not refused."""
import argparse

import datasets
import pytest

from tests.files import cache_hub_dataset, offline_hub, write_jsonl
from utils.data.data_utils import create_prompt_dataset, get_raw_dataset
from utils.runtime.args import add_column_args, column_keys
from utils.runtime.errors import ConfigError, DataError

PREFS = {"train": [{"question": f" Human: What is {i} + 1? Assistant:", "good": f" {i + 1}", "bad": f" {i + 2}"}
                   for i in range(20)],
         "validation": [{"question": f" Human: What is {i} + 2? Assistant:", "good": f" {i + 2}", "bad": f" {i}"}
                        for i in range(4)]}
RENAMED = {"prompt": "question", "chosen": "good", "rejected": "bad"}


def triples(rows, raw):
    return [(raw.get_prompt(row), raw.get_chosen(row), raw.get_rejected(row)) for row in rows]


@pytest.fixture
def hub_cache(tmp_path):
    """A Hugging Face cache holding the hub data set `tests/prefs` (PREFS), this process offline on it."""
    cache = cache_hub_dataset(tmp_path / "hf" / "datasets", "tests/prefs", PREFS)
    with offline_hub(cache):
        yield cache


def test_a_hub_name_loads_from_the_cache_offline_with_its_columns_renamed(hub_cache):
    assert list(datasets.load_dataset("tests/prefs")) == ["train", "validation"]  # load_dataset itself reads it
    raw = get_raw_dataset("tests/prefs", 1234, RENAMED)
    assert triples(raw.get_train_data(), raw) == [(row["question"], row["good"], row["bad"]) for row in PREFS["train"]]
    assert triples(raw.get_eval_data(), raw) == [(row["question"], row["good"], row["bad"])
                                                 for row in PREFS["validation"]]  # the validation split is eval
    assert raw.clean_name.startswith("loaded_tests_prefs_")
    swapped = get_raw_dataset("tests/prefs", 1234, {**RENAMED, "chosen": "bad", "rejected": "good"})
    assert triples(swapped.get_train_data(), swapped)[0] == (PREFS["train"][0]["question"], " 2", " 1")
    chosen = get_raw_dataset("tests/prefs?train=validation&eval=train", 1234, RENAMED)  # the splits chosen by name
    assert (len(chosen.get_train_data()), len(chosen.get_eval_data())) == (len(PREFS["validation"]), 20)


def test_a_hub_name_that_is_not_in_the_cache_offline_is_one_error_line(hub_cache):
    with pytest.raises(DataError) as err:
        get_raw_dataset("tests/absent", 1234)
    message = str(err.value)
    assert message.startswith("unknown data set 'tests/absent': it is not a known name") and "\n" not in message
    assert "could not be downloaded from the Hugging Face hub nor read from its cache" in message
    assert "OfflineModeIsEnabled" in message


def test_a_missing_path_is_never_tried_as_a_hub_name(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("load_dataset called")

    monkeypatch.setattr(datasets, "load_dataset", refuse)
    for name in (str(tmp_path / "nowhere"), "./nowhere", "~/nowhere", "a/b/c", "nowhere.jsonl"):
        with pytest.raises(DataError, match="no such local path exists$"):
            get_raw_dataset(name, 1234)


@pytest.mark.parametrize("kind", ["DatasetDict", "Dataset"])
def test_a_save_to_disk_folder_is_read_with_its_columns_renamed(kind, tmp_path):
    folder = tmp_path / "saved"
    if kind == "DatasetDict":
        datasets.DatasetDict({split: datasets.Dataset.from_list(rows) for split, rows in
                              {"train": PREFS["train"], "test": PREFS["validation"]}.items()}).save_to_disk(folder)
    else:
        datasets.Dataset.from_list(PREFS["train"]).save_to_disk(folder)
    raw = get_raw_dataset(str(folder), 7, RENAMED)
    train, evaluation = triples(raw.get_train_data(), raw), triples(raw.get_eval_data(), raw)
    if kind == "DatasetDict":  # its test split is the eval split
        assert len(train) == 20 and evaluation == [(r["question"], r["good"], r["bad"]) for r in PREFS["validation"]]
    else:  # a train split alone is split 9:1, as a single local file
        assert (len(train), len(evaluation)) == (18, 2)
        assert sorted(train + evaluation) == sorted((r["question"], r["good"], r["bad"]) for r in PREFS["train"])


def test_a_lone_split_of_any_name_is_the_train_split_and_several_without_train_are_refused(tmp_path):
    rows = datasets.Dataset.from_list(PREFS["train"])
    datasets.DatasetDict({"test": rows}).save_to_disk(tmp_path / "lone")
    raw = get_raw_dataset(str(tmp_path / "lone"), 7, RENAMED)
    assert (len(raw.get_train_data()), len(raw.get_eval_data())) == (18, 2)  # split 9:1, not test as both
    datasets.DatasetDict({"train_prefs": rows, "test_prefs": rows}).save_to_disk(tmp_path / "several")
    with pytest.raises(DataError, match=r"several: no 'train' split \(it has: train_prefs, test_prefs\); choose the "
                                         r"splits as '.*several\?train=train_prefs&eval=test_prefs'"):
        get_raw_dataset(str(tmp_path / "several"), 7, RENAMED)


def test_a_data_path_chooses_its_splits(tmp_path):
    """HuggingFaceH4/ultrafeedback_binarized's splits are train_prefs, test_prefs...: `?train=...&eval=...`."""
    datasets.DatasetDict({"train_prefs": datasets.Dataset.from_list(PREFS["train"]),
                          "test_prefs": datasets.Dataset.from_list(PREFS["validation"])}).save_to_disk(tmp_path / "h4")
    raw = get_raw_dataset(f"{tmp_path / 'h4'}?train=train_prefs&eval=test_prefs", 7, RENAMED)
    assert triples(raw.get_eval_data(), raw) == [(r["question"], r["good"], r["bad"]) for r in PREFS["validation"]]
    assert len(raw.get_train_data()) == 20
    raw = get_raw_dataset(f"{tmp_path / 'h4'}?train=train_prefs", 7, RENAMED)  # no eval split among the defaults
    assert (len(raw.get_train_data()), len(raw.get_eval_data())) == (18, 2)
    with pytest.raises(DataError, match=r"no split 'test' \(chosen by \?eval=; it has: train_prefs, test_prefs\)"):
        get_raw_dataset(f"{tmp_path / 'h4'}?train=train_prefs&eval=test", 7, RENAMED)
    with pytest.raises(ConfigError, match=r"must choose splits as \?train=SPLIT&eval=SPLIT"):
        get_raw_dataset(f"{tmp_path / 'h4'}?split=train_prefs", 7, RENAMED)


@pytest.mark.parametrize("hashes", [("", "", ""), ("-a3ecf92756993583", "-0f4bd5d1b0c6c1a2", "-3d4cd8309148a71f")])
def test_a_folder_of_hub_shards_reads_its_splits_by_name(tmp_path, hashes):
    """A hub data set's snapshot: data/<split>-00000-of-00002.parquet ..., read shard by shard; also where each
    shard's name ends in a content hash (tatsu-lab/alpaca, HuggingFaceH4/ultrachat_200k), which was not found."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "snap" / "data").mkdir(parents=True)
    rows = PREFS["train"]
    for index, part in enumerate((rows[:12], rows[12:])):
        pq.write_table(pa.Table.from_pylist(part),
                       tmp_path / "snap" / "data" / f"train_prefs-0000{index}-of-00002{hashes[index]}.parquet")
    test_file = tmp_path / "snap" / "data" / f"test_prefs-00000-of-00001{hashes[2]}.parquet"
    pq.write_table(pa.Table.from_pylist(PREFS["validation"]), test_file)
    raw = get_raw_dataset(f"{tmp_path / 'snap'}?train=train_prefs&eval=test_prefs", 7, RENAMED)
    assert triples(raw.get_train_data(), raw) == [(r["question"], r["good"], r["bad"]) for r in rows]
    assert len(raw.get_eval_data()) == len(PREFS["validation"])
    with pytest.raises(ConfigError, match="a single file has no splits to choose"):
        get_raw_dataset(f"{test_file}?train=x", 7, RENAMED)


def test_the_hubs_parquet_conversion_reads_a_folder_per_split(tmp_path):
    """The hub's parquet conversion (refs/convert/parquet) writes <config>/<split>/0000.parquet ...; before, such a
    folder was "no train.json in it"."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for split, parts in (("train", (PREFS["train"][:12], PREFS["train"][12:])), ("test", (PREFS["validation"],))):
        (tmp_path / "default" / split).mkdir(parents=True)
        for index, part in enumerate(parts):
            pq.write_table(pa.Table.from_pylist(part), tmp_path / "default" / split / f"000{index}.parquet")
    raw = get_raw_dataset(str(tmp_path / "default"), 7, RENAMED)
    assert triples(raw.get_train_data(), raw) == [(r["question"], r["good"], r["bad"]) for r in PREFS["train"]]
    assert triples(raw.get_eval_data(), raw) == [(r["question"], r["good"], r["bad"]) for r in PREFS["validation"]]
    with pytest.raises(DataError, match=r"its folders default have one: give them as --data_path"):
        get_raw_dataset(str(tmp_path), 7, RENAMED)


def test_renamed_columns_reach_every_row_shape(tmp_path):
    """KTO's labelled answers, a prompt with one completion (SFT), a whole chat: each from columns of other names."""
    kto = write_jsonl(tmp_path / "kto.jsonl", [{"q": " Human: 1 + 1? Assistant:", "answer": " 2", "ok": True},
                                               {"q": " Human: 1 + 2? Assistant:", "answer": " 5", "ok": False}] * 5)
    raw = get_raw_dataset(str(kto), 1, {"prompt": "q", "completion": "answer", "label": "ok"})
    rows = triples(raw.get_train_data(), raw) + triples(raw.get_eval_data(), raw)
    assert sorted(rows, key=str) == sorted([(" Human: 1 + 1? Assistant:", " 2", None),
                                            (" Human: 1 + 2? Assistant:", None, " 5")] * 5, key=str)
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    chats = write_jsonl(tmp_path / "chats.jsonl", [{"conversation": chat}] * 4)
    raw = get_raw_dataset(str(chats), 1, {"messages": "conversation"})
    assert triples(raw.get_train_data(), raw)[0] == (" Human: Hi Assistant:", " Hello.", None)


def test_a_column_a_flag_names_that_is_not_there_is_one_error_line_naming_the_flag(tmp_path):
    path = write_jsonl(tmp_path / "prefs.jsonl", PREFS["train"])
    with pytest.raises(DataError) as err:
        get_raw_dataset(str(path), 1, {"prompt": "query", "chosen": "good", "rejected": "bad"})
    assert str(err.value) == f"{path}: no column 'query' (named by --prompt_key); its columns: bad, good, question"
    folder = tmp_path / "saved"
    datasets.Dataset.from_list(PREFS["train"]).save_to_disk(folder)
    with pytest.raises(DataError, match=r"saved: train split: no column 'best' \(named by --chosen_key\)"):
        get_raw_dataset(str(folder), 1, {"prompt": "question", "chosen": "best"})


def test_a_bad_value_in_a_renamed_column_names_the_column_and_its_flag(tmp_path):
    rows = [{"q": " Human: a Assistant:", "answer": " b", "verdict": True}, {"q": " Human: a Assistant:",
                                                                           "answer": " b", "verdict": "yes"}]
    path = write_jsonl(tmp_path / "kto.jsonl", rows * 3)
    with pytest.raises(DataError) as err:
        get_raw_dataset(str(path), 1, {"prompt": "q", "completion": "answer", "label": "verdict"})
    assert str(err.value).startswith(f"{path}: row 1 (line 2): field 'verdict' (--label_key) must be true")


def test_the_flags_give_the_columns_and_refuse_two_fields_in_one_column():
    parser = argparse.ArgumentParser()
    add_column_args(parser)
    args = parser.parse_args(["--prompt_key", "q", "--completion_key", "a", "--label_key", "ok"])
    assert column_keys(args) == {"prompt": "q", "completion": "a", "label": "ok"}
    assert column_keys(parser.parse_args([])) == {}
    fields = ("prompt", "chosen", "rejected", "completion", "label", "messages")  # the fields of pair_formats.py
    every = parser.parse_args([item for field in fields for item in (f"--{field}_key", f"my_{field}")])
    assert column_keys(every) == {field: f"my_{field}" for field in fields}
    with pytest.raises(ConfigError, match="^--chosen_key and --completion_key both name column 'a'; a column holds "
                                          "one field$"):
        column_keys(parser.parse_args(["--chosen_key", "a", "--completion_key", "a"]))


def hh_rows(n, empty_at=()):
    """HH-RLHF dialogues; the rows of `empty_at` end with an empty chosen answer."""
    return [{"chosen": f"\n\nHuman: What is {i} + 1?\n\nAssistant:" + ("" if i in empty_at else f" {i + 1}"),
             "rejected": f"\n\nHuman: What is {i} + 1?\n\nAssistant: {i + 2}"} for i in range(n)]


def test_an_hh_row_with_an_empty_final_answer_is_skipped_and_counted(tmp_path, tiny_tokenizer):
    for split in ("train", "eval"):
        write_jsonl(tmp_path / "hh" / f"{split}.jsonl", hh_rows(10, empty_at=(3, 7) if split == "train" else ()))
    data = [str(tmp_path / "hh")]
    pairs, _ = create_prompt_dataset(data, "0,1,0", str(tmp_path / "cache"), 2, 1, tiny_tokenizer, 64)
    assert pairs.counts["train"] == {"read": 10, "kept": 8, "skipped": {"no answer": 2}}
    assert pairs.counts["eval"] == {"read": 10, "kept": 10, "skipped": {}}
    feedback, _ = create_prompt_dataset(data, "0,1,0", str(tmp_path / "cache"), 2, 1, tiny_tokenizer, 64,
                                        unpaired=True)
    assert feedback.counts["train"]["kept"] == 18  # KTO keeps the rejected answers of those two rows
    prompts, _ = create_prompt_dataset(data, "0,0,1", str(tmp_path / "cache"), 3, 1, tiny_tokenizer, 64)
    assert prompts.counts["train"] == {"read": 10, "kept": 10, "skipped": {}}  # their prompts serve step 3


def test_a_file_whose_every_hh_row_lacks_its_answer_leaves_no_pairs(tmp_path, tiny_tokenizer):
    path = write_jsonl(tmp_path / "hh.jsonl", hh_rows(10, empty_at=range(10)))
    with pytest.raises(DataError, match=r"^no train data left for phase 2 .* \(see the skipped counts above\)$"):
        create_prompt_dataset([str(path)], "0,1,0", str(tmp_path / "cache"), 2, 1, tiny_tokenizer, 64)
