"""Tests of utils/data/raw_datasets.py (and data_utils.get_raw_dataset, its registry): every schema on tiny in-memory fixtures, local files, errors."""
import json
import types
from pathlib import Path

import datasets
import pytest

from tests.files import write_jsonl
from utils.data import raw_datasets as rd
from utils.data.data_utils import KNOWN_NAMES, get_raw_dataset
from utils.data.raw_datasets import DataError

# --------------------------------------------------------------------------- fixtures


def dd(**splits):
    """A DatasetDict from {split: [row, ...]}."""
    return datasets.DatasetDict({k: datasets.Dataset.from_list(v) for k, v in splits.items()})


def triples(ds, raw):
    return [(raw.get_prompt(s), raw.get_chosen(s), raw.get_rejected(s)) for s in ds]


def local_rows(n, tag="r"):
    return [{"prompt": f" Human: q{tag}{i}? Assistant:", "chosen": f" good{i}", "rejected": f" bad{i}"}
            for i in range(n)]


@pytest.fixture(autouse=True)
def no_hub(monkeypatch):
    """No test may reach the hub: a stray load_dataset call fails loudly."""
    def refuse(*a, **k):
        raise AssertionError(f"unexpected load_dataset{a}")
    monkeypatch.setattr(datasets, "load_dataset", refuse)


# --------------------------------------------------------------------------- hub schemas


def test_rm_static_fields_verbatim_and_splits():
    raw = dd(train=[{"prompt": "\n\nHuman: Hi there?\n\nAssistant:", "response": " r",
                     "chosen": " Hello!", "rejected": " Go away."},
                    {"prompt": "\n\nHuman: 2+2?\n\nAssistant:", "response": " r",
                     "chosen": " 4", "rejected": " 5"}],
             test=[{"prompt": "\n\nHuman: Sky?\n\nAssistant:", "response": " r",
                    "chosen": " Blue.", "rejected": " Green."}])
    ds = rd.DahoasRmStatic(seed=1, raw=raw)
    assert (ds.name, ds.clean_name) == ("Dahoas/rm-static", "Dahoas_rm_static")
    assert triples(ds.get_train_data(), ds) == [
        ("\n\nHuman: Hi there?\n\nAssistant:", " Hello!", " Go away."),
        ("\n\nHuman: 2+2?\n\nAssistant:", " 4", " 5")]
    assert triples(ds.get_eval_data(), ds) == [("\n\nHuman: Sky?\n\nAssistant:", " Blue.", " Green.")]
    s = ds.get_train_data()[1]
    assert ds.get_prompt_and_chosen(s) == "\n\nHuman: 2+2?\n\nAssistant: 4"
    assert ds.get_prompt_and_rejected(s) == "\n\nHuman: 2+2?\n\nAssistant: 5"


def test_full_hh_rlhf_same_schema():
    row = {"prompt": "\n\nHuman: A\n\nAssistant: B\n\nHuman: C\n\nAssistant:", "response": " x",
           "chosen": " yes", "rejected": " no"}
    ds = rd.DahoasFullHHRLHF(raw=dd(train=[row, row], test=[row]))
    assert ds.clean_name == "Dahoas_full_hh_rlhf"
    assert triples(ds.get_eval_data(), ds) == [(row["prompt"], " yes", " no")]
    assert len(ds.get_train_data()) == 2


def test_synthetic_instruct_formatting_and_split():
    rows = [{"prompt": f"Say {i}", "chosen": f"{i}", "rejected": f"not {i}"} for i in range(20)]
    ds = rd.DahoasSyntheticInstructGPTJPairwise(seed=3, raw=dd(train=rows))
    train, evl = ds.get_train_data(), ds.get_eval_data()
    assert (len(train), len(evl)) == (18, 2)
    assert sorted(s["prompt"] for s in list(train) + list(evl)) == sorted(r["prompt"] for r in rows)
    s = {"prompt": "Name a color.", "chosen": "Red.", "rejected": "Seven."}
    assert (ds.get_prompt(s), ds.get_chosen(s), ds.get_rejected(s)) == (
        " Human: Name a color. Assistant:", " Red.", " Seven.")
    assert ds.get_prompt_and_chosen(s) == " Human: Name a color. Assistant: Red."


def test_yitingxie_prompt_gets_assistant_and_answer_is_after_it():
    raw = dd(train=[{"prompt": "\n\nHuman: Why is the sky blue?\n\n",
                     "chosen": "Assistant: Rayleigh scattering.",
                     "rejected": "Assistant: Because."}],
             test=[{"prompt": "\n\nHuman: Hi\n\nAssistant:", "chosen": "Assistant: Hello",
                    "rejected": " Nope"}])
    ds = rd.YitingxieRLHFRewardDatasets(raw=raw)
    s = ds.get_train_data()[0]
    assert ds.get_prompt(s) == "\n\nHuman: Why is the sky blue?\n\nAssistant:"
    assert ds.get_chosen(s) == " Rayleigh scattering."
    assert ds.get_rejected(s) == " Because."
    assert ds.get_prompt_and_chosen(s) == s["prompt"] + s["chosen"]
    # a prompt already ending in "Assistant:" does not get it twice; no "Assistant:" -> verbatim
    assert triples(ds.get_eval_data(), ds) == [("\n\nHuman: Hi\n\nAssistant:", " Hello", " Nope")]


def webgpt_row(q, a0, a1, s0, s1):
    return {"question": {"dataset": "eli5", "id": "x", "full_text": q},
            "quotes_0": {"title": [], "extract": []}, "answer_0": a0, "tokens_0": [], "score_0": s0,
            "quotes_1": {"title": [], "extract": []}, "answer_1": a1, "tokens_1": [], "score_1": s1}


def test_webgpt_higher_score_chosen_ties_skipped_citations_removed():
    rows = [webgpt_row("Why do cats purr?", "They are happy [1].", "Cats purr (2) to heal.", 1.0, -1.0),
            webgpt_row("Why is ice slippery?", "No idea.", "A thin water layer [1][2] forms.", -0.5, 0.5),
            webgpt_row("Tie?", "a", "b", 0.0, 0.0)]
    ds = rd.OpenAIWebGPTComparisons(seed=0, raw=dd(train=rows))
    assert ds.clean_name == "openai_webgpt_comparisons"
    got = sorted(triples(list(ds.get_train_data()) + list(ds.get_eval_data()), ds))
    assert got == sorted([
        (" Human: Why do cats purr? Assistant:", " They are happy.", " Cats purr to heal."),
        (" Human: Why is ice slippery? Assistant:", " A thin water layer forms.", " No idea."),
    ])
    tie = rows[2]
    assert ds.get_chosen(tie) is None and ds.get_rejected(tie) is None
    assert ds.get_prompt_and_chosen(tie) is None


def test_webgpt_all_ties_is_an_error():
    rows = [webgpt_row(f"q{i}", "a", "b", 0.0, 0.0) for i in range(3)]
    with pytest.raises(DataError, match=r"openai/webgpt_comparisons.*0 usable row"):
        rd.OpenAIWebGPTComparisons(raw=dd(train=rows)).get_train_data()


def test_shp_label_direction_and_validation_split():
    row = {"post_id": "p", "domain": "askscience_train", "upvote_ratio": 0.9,
           "history": "Why is water wet?", "c_root_id_A": "a", "c_root_id_B": "b",
           "created_at_utc_A": 1, "created_at_utc_B": 2, "score_A": 10, "score_B": 3,
           "human_ref_A": "Answer A.", "human_ref_B": "Answer B.", "labels": 1,
           "seconds_difference": 1.0, "score_ratio": 3.3}
    row0 = dict(row, labels=0, history="Is B better?")
    ds = rd.StanfordNLPSHP(raw=dd(train=[row, row0], validation=[row0], test=[row]))
    assert ds.clean_name == "stanfordnlp_SHP"
    assert triples(ds.get_train_data(), ds) == [
        (" Human: Why is water wet? Assistant:", " Answer A.", " Answer B."),
        (" Human: Is B better? Assistant:", " Answer B.", " Answer A.")]
    assert [s["history"] for s in ds.get_eval_data()] == ["Is B better?"]


def test_hub_sample_missing_or_bad_field_names_dataset_and_field():
    ds = rd.DahoasRmStatic(raw=dd(train=[{"prompt": "p", "chosen": "c", "rejected": "r"}],
                                  test=[{"prompt": "p", "chosen": "c", "rejected": "r"}]))
    with pytest.raises(DataError, match=r"Dahoas/rm-static.*'chosen'"):
        ds.get_chosen({"prompt": "p"})
    with pytest.raises(DataError, match=r"Dahoas/rm-static.*'prompt'.*string.*int"):
        ds.get_prompt({"prompt": 3})
    shp = rd.StanfordNLPSHP(raw=dd(train=[{"x": 1}], validation=[{"x": 1}]))
    with pytest.raises(DataError, match=r"stanfordnlp/SHP.*'labels'"):
        shp.get_chosen({"history": "h", "human_ref_A": "a", "human_ref_B": "b"})


def test_hub_missing_or_empty_split():
    with pytest.raises(DataError, match=r"Dahoas/rm-static: no 'test' split \(it has: train\)"):
        rd.DahoasRmStatic(raw=dd(train=[{"prompt": "p", "chosen": "c", "rejected": "r"}]))
    empty = datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"prompt": [], "chosen": [], "rejected": []}),
        "test": datasets.Dataset.from_list([{"prompt": "p", "chosen": "c", "rejected": "r"}])})
    with pytest.raises(DataError, match=r"Dahoas/rm-static: the 'train' split is empty"):
        rd.DahoasRmStatic(raw=empty)


def test_offline_hub_load_is_one_line_data_error(monkeypatch):
    def offline(name, *a, **k):
        raise ConnectionError(f"Couldn't reach '{name}' on the Hub\n(offline mode is enabled)")
    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DataError) as err:
        get_raw_dataset("Dahoas/rm-static", seed=1)
    msg = str(err.value)
    assert "\n" not in msg
    assert "'Dahoas/rm-static' could not be downloaded" in msg
    assert "local path" in msg and "'builtin'" in msg and "ConnectionError" in msg


def test_registry_routes_hub_names_through_load_dataset(monkeypatch):
    calls = []
    rows = [{"history": "h", "human_ref_A": "a", "human_ref_B": "b", "labels": 0}]

    def fake_load(name, *a, **k):
        calls.append(name)
        return dd(train=rows, validation=rows)
    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    ds = get_raw_dataset("stanfordnlp/SHP", seed=5)
    assert isinstance(ds, rd.StanfordNLPSHP) and ds.seed == 5 and calls == ["stanfordnlp/SHP"]
    assert ds.get_chosen(ds.get_train_data()[0]) == " b"
    assert set(rd.HUB_DATASETS) == {
        "Dahoas/rm-static", "Dahoas/full-hh-rlhf", "Dahoas/synthetic-instruct-gptj-pairwise",
        "yitingxie/rlhf-reward-datasets", "openai/webgpt_comparisons", "stanfordnlp/SHP"}


# --------------------------------------------------------------------------- 9:1 split


def test_split_is_deterministic_disjoint_and_complete():
    a = rd.split_train_eval(50, seed=7, what="x")
    assert a == rd.split_train_eval(50, seed=7, what="x")
    b = rd.split_train_eval(50, seed=8, what="x")
    assert a != b
    train, evl = a
    assert (len(train), len(evl)) == (45, 5)
    assert not set(train) & set(evl)
    assert sorted(train + evl) == list(range(50))
    assert [len(x) for x in rd.split_train_eval(3, 0, "x")] == [2, 1]  # eval never empty
    with pytest.raises(DataError, match=r"tiny: has 1 usable row"):
        rd.split_train_eval(1, 0, "tiny")


def test_train_only_hub_split_depends_on_seed():
    rows = [{"prompt": f"p{i}", "chosen": "c", "rejected": "r"} for i in range(30)]
    ev = {s: [x["prompt"] for x in rd.DahoasSyntheticInstructGPTJPairwise(seed=s, raw=dd(train=rows)).get_eval_data()]
          for s in (1, 1, 2)}
    again = [x["prompt"] for x in rd.DahoasSyntheticInstructGPTJPairwise(seed=1, raw=dd(train=rows)).get_eval_data()]
    assert ev[1] == again and ev[1] != ev[2] and len(ev[1]) == 3


# --------------------------------------------------------------------------- local files


def test_local_directory_json_verbatim(tmp_path):
    train = local_rows(3, "t")
    train[0]["extra"] = {"ignored": 1}
    write_jsonl(tmp_path / "train.json", train)
    (tmp_path / "eval.json").write_text(json.dumps(local_rows(2, "e"), indent=2))  # a JSON array
    ds = get_raw_dataset(str(tmp_path), seed=1)
    assert isinstance(ds, rd.LocalJsonFile) and ds.name == str(tmp_path)
    assert triples(ds.get_train_data(), ds) == [(r["prompt"], r["chosen"], r["rejected"]) for r in local_rows(3, "t")]
    # the other columns kept as written, for reward functions that read them (utils/rl/reward_columns.py)
    assert ds.get_train_data().column_names == ["prompt", "chosen", "rejected", rd.ROW_COLUMNS]
    assert rd.row_columns(ds.get_train_data()[0]) == {**local_rows(3, "t")[0], "extra": {"ignored": 1}}
    assert rd.row_columns(ds.get_train_data()[1]) == local_rows(3, "t")[1]
    assert ds.get_eval_data().column_names == ["prompt", "chosen", "rejected"]  # no other column: none kept
    assert [s["chosen"] for s in ds.get_eval_data()] == [" good0", " good1"]
    assert ds.get_prompt_and_chosen(ds.get_train_data()[0]) == " Human: qt0? Assistant: good0"


def test_local_directory_jsonl_and_clean_name(tmp_path):
    d = tmp_path / "my data"
    d.mkdir()
    write_jsonl(d / "train.jsonl", local_rows(2))
    write_jsonl(d / "eval.jsonl", local_rows(1))
    ds = rd.LocalJsonFile(d)
    assert len(ds.get_train_data()) == 2 and len(ds.get_eval_data()) == 1
    assert ds.clean_name.startswith("local_my_data_")
    assert all(c.isalnum() or c == "_" for c in ds.clean_name)
    write_jsonl(d / "eval.jsonl", local_rows(1, "changed"))
    assert rd.LocalJsonFile(d).clean_name != ds.clean_name  # edited data -> new cache key


def test_local_single_file_split(tmp_path):
    f = write_jsonl(tmp_path / "all.jsonl", local_rows(20))
    a, b, c = rd.LocalJsonFile(f, seed=1), rd.LocalJsonFile(f, seed=1), rd.LocalJsonFile(f, seed=2)
    ev = lambda ds: [s["prompt"] for s in ds.get_eval_data()]
    tr = lambda ds: [s["prompt"] for s in ds.get_train_data()]
    assert (len(tr(a)), len(ev(a))) == (18, 2)
    assert ev(a) == ev(b) and tr(a) == tr(b) and ev(a) != ev(c)
    assert not set(ev(a)) & set(tr(a))
    assert sorted(ev(a) + tr(a)) == sorted(r["prompt"] for r in local_rows(20))
    g = tmp_path / "arr.json"
    g.write_text(json.dumps(local_rows(4)))
    assert len(get_raw_dataset(str(g), seed=0).get_eval_data()) == 1


def test_local_jsonfile_is_cwd_data(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match=r"local/jsonfile: .*data: no such directory"):
        get_raw_dataset("local/jsonfile", seed=1)
    (tmp_path / "data").mkdir()
    write_jsonl(tmp_path / "data" / "train.json", local_rows(2, "cwd"))
    write_jsonl(tmp_path / "data" / "eval.json", local_rows(1, "cwd"))
    ds = get_raw_dataset("local/jsonfile", seed=1)
    assert ds.name == "local/jsonfile"
    assert ds.get_prompt(ds.get_eval_data()[0]) == " Human: qcwd0? Assistant:"


# --------------------------------------------------------------------------- local errors


def test_a_folder_without_an_eval_file_takes_test_or_splits_its_train_file(tmp_path):
    write_jsonl(tmp_path / "train.json", local_rows(20))
    raw = rd.LocalJsonFile(tmp_path)  # no eval file: the train file split 9:1, as a single file
    assert (len(raw.get_train_data()), len(raw.get_eval_data())) == (18, 2) and raw.eval_file is None
    write_jsonl(tmp_path / "test.jsonl", local_rows(3))  # Hugging Face's name for the held-out split
    raw = rd.LocalJsonFile(tmp_path)
    assert (len(raw.get_train_data()), len(raw.get_eval_data())) == (20, 3) and raw.eval_file.name == "test.jsonl"


def test_a_folder_without_a_train_file_names_its_files_and_the_choice(tmp_path):
    write_jsonl(tmp_path / "train_prefs.jsonl", local_rows(2))
    with pytest.raises(DataError, match=r"no train.json \(nor .jsonl, .parquet, .csv, .tsv\) in it or its data/ folder; it has "
                                        r"train_prefs.jsonl: choose the splits as '.*\?train=NAME&eval=NAME'"):
        rd.LocalJsonFile(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="a data folder needs train.json and eval.json"):
        rd.LocalJsonFile(empty)


def test_both_json_and_jsonl_is_ambiguous(tmp_path):
    write_jsonl(tmp_path / "train.json", local_rows(2))
    write_jsonl(tmp_path / "train.jsonl", local_rows(2))
    write_jsonl(tmp_path / "eval.json", local_rows(1))
    with pytest.raises(DataError, match=r"both train\.json and train\.jsonl exist"):
        rd.LocalJsonFile(tmp_path)


def test_missing_file_direct(tmp_path):
    with pytest.raises(DataError, match=r"nope\.json: file not found"):
        rd.read_local_split(tmp_path / "nope.json")


def test_unicode_line_separators_inside_strings_are_text_not_line_ends(tmp_path):
    """JSON strings may hold U+2028, U+2029 and U+0085 unescaped; only "\\n" ends a JSON line."""
    rows = [{"prompt": f" Human: one{separator}two Assistant:", "chosen": f" a{separator}b", "rejected": " c"}
            for separator in ("\u2028", "\u2029", "\u0085")]
    f = tmp_path / "train.jsonl"
    f.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    assert "\u2028" in f.read_text(encoding="utf-8")  # written raw, not escaped
    assert rd.read_local_split(f).to_list() == rows


def test_malformed_json_line_names_file_and_line(tmp_path):
    f = tmp_path / "train.jsonl"
    f.write_text(json.dumps(local_rows(1)[0]) + "\n\n" + '{"prompt": "x", "chosen": \n')
    with pytest.raises(DataError) as err:
        rd.read_local_split(f)
    msg = str(err.value)
    assert str(f) in msg and "malformed JSON on line 3" in msg and "\n" not in msg


def test_malformed_json_array_names_line(tmp_path):
    f = tmp_path / "eval.json"
    f.write_text('[\n{"prompt": "a", "chosen": "b", "rejected": "c"},\n{"prompt": }\n]')
    with pytest.raises(DataError, match=r"eval\.json: malformed JSON at line 3"):
        rd.read_local_split(f)


@pytest.mark.parametrize("bad, expected", [
    ({"prompt": "p", "rejected": "r"}, r"row 1 \(line 3\): missing field 'chosen'"),
    ({"prompt": "p", "chosen": 7, "rejected": "r"}, r"row 1 \(line 3\): field 'chosen' must be a string or a list of messages, got int"),
    ({"prompt": None, "chosen": "c", "rejected": "r"}, r"row 1 \(line 3\): field 'prompt' must be a string, got NoneType"),
    ({"prompt": "", "chosen": "c", "rejected": "r"}, r"row 1 \(line 3\): field 'prompt' is empty"),
    (["p", "c", "r"], r"row 1 \(line 3\): expected a JSON object, got list"),
])
def test_bad_row_names_file_row_and_field(tmp_path, bad, expected):
    f = tmp_path / "train.json"
    f.write_text(json.dumps(local_rows(1)[0]) + "\n\n" + json.dumps(bad) + "\n")
    with pytest.raises(DataError, match=expected) as err:
        rd.read_local_split(f)
    assert str(err.value).startswith(str(f) + ": ")


def test_bad_row_in_json_array_names_row(tmp_path):
    f = tmp_path / "data.json"
    f.write_text(json.dumps(local_rows(2) + [{"prompt": "p", "rejected": "r"}]))
    with pytest.raises(DataError, match=r"data\.json: row 2: missing field 'chosen'"):
        rd.LocalJsonFile(f)


def test_bad_row_found_through_directory(tmp_path):
    write_jsonl(tmp_path / "train.json", local_rows(2))
    write_jsonl(tmp_path / "eval.json", [{"prompt": "p", "chosen": "c", "rejected": 1.5}])
    with pytest.raises(DataError) as err:
        get_raw_dataset(str(tmp_path), seed=0)
    assert str(tmp_path / "eval.json") in str(err.value) and "row 0" in str(err.value) and "'rejected'" in str(err.value)


@pytest.mark.parametrize("content", ["", "\n  \n", "[]"])
def test_empty_split_is_an_error(tmp_path, content):
    write_jsonl(tmp_path / "train.json", local_rows(2))
    (tmp_path / "eval.json").write_text(content)
    with pytest.raises(DataError, match=r"eval\.json: no rows \(the split is empty\)"):
        rd.LocalJsonFile(tmp_path)


def test_single_file_needs_two_rows_and_known_suffix(tmp_path):
    f = write_jsonl(tmp_path / "one.jsonl", local_rows(1))
    with pytest.raises(DataError, match=r"one\.jsonl: has 1 usable row"):
        rd.LocalJsonFile(f)
    g = tmp_path / "data.xml"
    g.write_text("prompt,chosen,rejected\n")
    with pytest.raises(DataError, match=r"data\.xml: unsupported file type '\.xml'"):
        get_raw_dataset(str(g), seed=0)


def test_non_utf8_file(tmp_path):
    f = tmp_path / "train.json"
    f.write_bytes(b'{"prompt": "\xff"}\n')
    with pytest.raises(DataError, match=r"train\.json: not UTF-8"):
        rd.read_local_split(f)


def test_unknown_name_lists_known_names(tmp_path):
    missing = str(tmp_path / "nowhere")
    with pytest.raises(DataError) as err:
        get_raw_dataset(missing, seed=0)
    msg = str(err.value)
    assert f"unknown data set '{missing}'" in msg and "no such local path exists" in msg
    for name in KNOWN_NAMES:
        assert name in msg
    assert "builtin" in KNOWN_NAMES and "local/jsonfile" in KNOWN_NAMES


# --------------------------------------------------------------------------- builtin


@pytest.fixture
def fake_task(tmp_path, monkeypatch):
    """A stand-in utils.data.builtin_task whose writer counts its calls; the cache goes to tmp_path."""
    monkeypatch.setenv("CHATRLHF_CACHE", str(tmp_path / "cache"))
    mod = types.ModuleType("utils.data.builtin_task")
    mod.calls = []
    mod.TASK_VERSION = 3

    def write_builtin_data(out_dir, seed=1234):
        out = Path(out_dir)
        mod.calls.append((out, seed))
        out.mkdir(parents=True, exist_ok=True)
        q = [{"prompt": f" Human: What is {i} + 1? Assistant:", "chosen": f" {i + 1}", "rejected": f" {i + 2}"}
             for i in range(5)]
        write_jsonl(out / "train.json", q[:3])
        write_jsonl(out / "eval.json", q[3:])
        write_jsonl(out / "heldout.json", q[:1])
        (out / "unsup.txt").write_text("some text\n")
        return out

    mod.write_builtin_data = write_builtin_data
    monkeypatch.setattr(rd, "task", mod)
    return mod


def test_builtin_generates_once_and_reads_like_local(fake_task, tmp_path):
    ds = get_raw_dataset("builtin", seed=9)
    expected_dir = tmp_path / "cache" / "builtin-data" / "v3-seed1234"
    assert isinstance(ds, rd.Builtin) and ds.name == "builtin"
    assert ds.data_dir == expected_dir == rd.builtin_data_dir()
    assert ds.heldout_path == expected_dir / "heldout.json" and ds.heldout_path.is_file()
    assert ds.unsup_path.read_text() == "some text\n"
    assert ds.clean_name == "builtin_v3_seed1234"
    assert triples(ds.get_train_data(), ds)[0] == (" Human: What is 0 + 1? Assistant:", " 1", " 2")
    assert len(ds.get_eval_data()) == 2
    rd.Builtin()
    assert len(fake_task.calls) == 1 and fake_task.calls[0][1] == 1234
    assert fake_task.calls[0][0] == expected_dir


def test_builtin_version_from_task(fake_task, tmp_path):
    fake_task.TASK_VERSION = 7
    assert rd.builtin_data_dir().name == "v7-seed1234"


def test_builtin_incomplete_cache_is_reported(fake_task, tmp_path):
    d = rd.builtin_data_dir()
    (d / "unsup.txt").unlink()
    with pytest.raises(DataError, match=r"built-in data is incomplete \(no unsup\.txt\); delete the directory"):
        rd.Builtin()


def test_builtin_with_real_task(tmp_path, monkeypatch):
    task = pytest.importorskip("utils.data.builtin_task")
    if not hasattr(task, "write_builtin_data"):
        pytest.skip("utils.data.builtin_task.write_builtin_data not written yet")
    monkeypatch.setenv("CHATRLHF_CACHE", str(tmp_path))
    ds = rd.Builtin()
    assert ds.data_dir == tmp_path / "builtin-data" / f"v{task.TASK_VERSION}-seed1234"
    s = ds.get_train_data()[0]
    assert ds.get_prompt(s).startswith(" Human: ") and ds.get_prompt(s).endswith(" Assistant:")
    assert ds.get_chosen(s).startswith(" ")
    assert len(ds.get_eval_data()) > 0 and ds.heldout_path.is_file() and ds.unsup_path.is_file()


def test_csv_and_tsv_files_read_their_header_columns(tmp_path):
    """A spreadsheet's export: the text form in columns, or two responses and the better one's index as text."""
    rows = '" Human: 1, 2 or 3? Assistant:"," 2"," 3"\n" Human: a ""quote""? Assistant:"," yes"," no"\n'
    (tmp_path / "pairs.csv").write_text("prompt,chosen,rejected\n" + rows * 5)
    raw = rd.LocalJsonFile(tmp_path / "pairs.csv")
    rows = raw.get_train_data().to_list() + raw.get_eval_data().to_list()
    assert {(r["prompt"], r["chosen"], r["rejected"]) for r in rows} == {
        (" Human: 1, 2 or 3? Assistant:", " 2", " 3"), (' Human: a "quote"? Assistant:', " yes", " no")}
    (tmp_path / "pku.tsv").write_text("prompt\tresponse_0\tresponse_1\tbetter_response_id\n" + "q\tbad\tgood\t1\n" * 4)
    rows = rd.read_local_split(tmp_path / "pku.tsv").to_list()
    assert rd.row_columns(rows[0]) == {"prompt": " Human: q Assistant:", "chosen": " good", "rejected": " bad",
                                       "response_0": "bad", "response_1": "good", "better_response_id": "1"}
    (tmp_path / "ragged.csv").write_text("prompt,chosen,rejected\na,b,c,d\n")
    with pytest.raises(DataError, match=r"ragged.csv: line 2: more fields than the header line names \(3\)"):
        rd.read_local_split(tmp_path / "ragged.csv")


def test_a_csv_field_longer_than_csvs_own_limit_reads_as_a_json_line_would(tmp_path):
    """A 200 KB prompt (a long document to summarise): csv stops at 128 KiB a field unless told otherwise."""
    import csv

    long_prompt = " Human: " + "word " * 40000 + "Assistant:"
    (tmp_path / "long.csv").write_text(f'prompt,chosen,rejected\n"{long_prompt}", yes, no\n')
    limit = csv.field_size_limit()
    assert rd.read_local_split(tmp_path / "long.csv").to_list()[0]["prompt"] == long_prompt
    assert csv.field_size_limit() == limit  # the process's limit as it was


def test_columns_named_as_common_words_reach_the_rows_columns(tmp_path):
    """A user's columns called row_columns or unusable are columns like any other: read_rows' own are named apart."""
    row = {"prompt": " Human: q Assistant:", "chosen": " a", "rejected": " b", "row_columns": "x", "unusable": "y"}
    (tmp_path / "rows.jsonl").write_text(json.dumps(row) + "\n")
    assert rd.row_columns(rd.read_local_split(tmp_path / "rows.jsonl")[0]) == row


def test_gzipped_json_lines_read_as_hh_rlhf_ships_them(tmp_path):
    """Anthropic/hh-rlhf's files: harmless-base/train.jsonl.gz and test.jsonl.gz, whole dialogues."""
    import gzip

    rows = [{"chosen": f"\n\nHuman: What is {i} + 1?\n\nAssistant: {i + 1}",
             "rejected": f"\n\nHuman: What is {i} + 1?\n\nAssistant: no"} for i in range(12)]
    folder = tmp_path / "harmless-base"
    folder.mkdir()
    for split, part in (("train", rows[:10]), ("test", rows[10:])):
        with gzip.open(folder / f"{split}.jsonl.gz", "wt") as f:
            f.write("".join(json.dumps(row) + "\n" for row in part))
    raw = get_raw_dataset(str(folder), seed=0)
    assert (len(raw.get_train_data()), len(raw.get_eval_data())) == (10, 2)
    assert raw.get_eval_data()[0] == {"prompt": "\n\nHuman: What is 10 + 1?\n\nAssistant:", "chosen": " 11",
                                      "rejected": " no"}
    single = get_raw_dataset(str(folder / "train.jsonl.gz"), seed=0)  # one file: split 9:1
    assert (len(single.get_train_data()), len(single.get_eval_data())) == (9, 1)
    with pytest.raises(DataError, match=r"its folders harmless-base have one: give them as --data_path"):
        get_raw_dataset(str(tmp_path), seed=0)  # the repository's root, whose folders hold the data
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes((folder / "train.jsonl.gz").read_bytes()[:30])
    with pytest.raises(DataError, match=r"cut\.jsonl\.gz: cannot be read \(Compressed file ended"):
        get_raw_dataset(str(cut), seed=0)
