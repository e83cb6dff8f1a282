"""Preference pairs from a model's own sampled answers (utils/data/sampled_pairs.py, inference/sample_pairs.py):
best vs worst by the judge, all-equal groups skipped, the folder steps 2 and DPO read, --resume."""
import json
import sys

import pytest

from utils.data.sampled_pairs import PAIRS_DATA_SPLIT, PairCounts, best_and_worst, judged_pairs

pytestmark = pytest.mark.usefixtures("one_thread")

# A judge the test can look into: it records what it scored. Imported by name (package.module:function), so the
# test reads its records from sys.modules.
RECORDING_JUDGE = """
calls = []


def by_length(prompts, answers):
    calls.append((list(prompts), list(answers)))
    return [float(len(answer)) for answer in answers]


def all_alike(prompts, answers):
    return [0.0] * len(answers)
"""


@pytest.mark.parametrize("scores, expected", [
    ([0.0, 1.0, 0.5, 0.25], (1, 0)),
    ([1.0, 0.5, 1.0, 0.5], (0, 1)),  # ties: the first best and the first worst
    ([-2.0, 3.5], (1, 0)),
    ([0.5, 0.5, 0.5], None),  # all equal: no preference
])
def test_best_and_worst_are_the_first_argmax_and_argmin(scores, expected):
    assert best_and_worst(scores) == expected


def test_pairs_are_the_best_against_the_worst_answer_of_each_prompt_and_all_equal_groups_are_skipped():
    prompts = ["p0", "p1", "p2", "p3"]
    # Three rounds over the prompts: answers[k * 4 + i] answers prompts[i].
    answers = ["a", "b", "c", "", "aa", "b2", "c2", "d",
               "aaa", "b3", "c3", "d2"]
    scores = [0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.5,
              0.5, 1.0, 1.0, 0.5]
    counts = PairCounts()
    rows = judged_pairs(prompts, answers, scores, counts)
    assert rows == [{"prompt": "p0", "chosen": "aa", "rejected": "a"}]
    # p1, p2: every answer scored 1.0; p3: its empty answer is left out and the other two score the same.
    assert (counts.prompts, counts.pairs, counts.all_equal, counts.too_few_answers) == (4, 1, 3, 0)
    assert counts.empty_answers == 1 and counts.answers == 12
    assert counts.mean_score == pytest.approx(sum(scores) / 12)


def test_a_prompt_with_fewer_than_two_non_empty_answers_gives_no_pair():
    counts = PairCounts()
    assert judged_pairs(["p"], ["", "x", ""], [0.0, 1.0, 0.0], counts) == []
    assert (counts.too_few_answers, counts.empty_answers, counts.pairs) == (1, 2, 0)


def run_sample_pairs(argv):
    from inference import sample_pairs

    return sample_pairs.main(argv)


@pytest.fixture
def data_file(tmp_path):
    """40 rows of the built-in task as a local data file (9:1 into 36 train and 4 eval rows): quicker to read than
    the built-in data's 60000."""
    from utils.data.raw_datasets import builtin_data_dir

    path = tmp_path / "data.jsonl"
    path.write_text("".join(builtin_data_dir().joinpath("train.json").read_text().splitlines(True)[:40]))
    return str(path)


@pytest.fixture
def judge_module(tmp_path, monkeypatch):
    (tmp_path / "recording_judge.py").write_text(RECORDING_JUDGE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "recording_judge", raising=False)
    yield "recording_judge"
    sys.modules.pop("recording_judge", None)


def test_the_cli_writes_best_against_worst_pairs_that_step_2_reads_whole(tmp_path, data_file, judge_module,
                                                                         tiny_tokenizer, capsys):
    from utils.data.data_utils import create_prompt_dataset

    out = tmp_path / "pairs"
    flags = ["--model_name_or_path", "tiny", "--reward_fn", f"{judge_module}:by_length", "--output_dir", str(out),
             "--data_path", data_file, "--data_split", "0,1", "--max_prompts", "6", "--samples_per_prompt", "3",
             "--max_new_tokens", "6",
             "--data_output_path", str(tmp_path / "cache"), "--dtype", "fp32"]
    assert run_sample_pairs(flags) == 0
    judge = sys.modules[judge_module]
    assert len(judge.calls) == 2  # one call per split, every answer of the split at once
    meta = json.loads((out / "meta.json").read_text())
    for split, (prompts, answers), n in zip(("train", "eval"), judge.calls, (6, 4)):
        assert len(prompts) == len(answers) == 3 * n and prompts[:n] == prompts[n:2 * n]
        rows = [json.loads(line) for line in (out / f"{split}.jsonl").read_text().splitlines()]
        expected = []
        for i, prompt in enumerate(prompts[:n]):
            group = [answer for answer in answers[i::n] if answer]
            lengths = [len(answer) for answer in group]
            if len(group) >= 2 and max(lengths) > min(lengths):
                expected.append({"prompt": prompt, "chosen": group[lengths.index(max(lengths))],
                                 "rejected": group[lengths.index(min(lengths))]})
        assert rows == expected and rows  # the random tiny model's answers differ in length
        assert meta["counts"][split]["pairs"] == len(rows) and meta["counts"][split]["prompts"] == n
    assert f"train: 6 prompts, {meta['counts']['train']['pairs']} pairs kept" in capsys.readouterr().out

    # Step 2 (and DPO) read the folder as a local data set and, under PAIRS_DATA_SPLIT, train on all of it.
    train, evaluation = create_prompt_dataset([str(out)], PAIRS_DATA_SPLIT, str(tmp_path / "cache"), 2, 1234,
                                              tiny_tokenizer, 64)
    assert len(train) == meta["counts"]["train"]["pairs"] and len(evaluation) == meta["counts"]["eval"]["pairs"]


def test_a_task_without_reference_answers_has_the_actors_answers_judged(tmp_path, judge_module):
    """reasoning-gym's propositional_logic accepts any valid solution, so its rows have no chosen answer: the
    actor's own answers are judged all the same (before, reading the rows' references ended the step in an
    error, and with it `train.py --algorithm ppo`'s default on such a task)."""
    pytest.importorskip("reasoning_gym")
    out = tmp_path / "pairs"
    flags = ["--model_name_or_path", "tiny", "--reward_fn", f"{judge_module}:by_length", "--output_dir", str(out),
             "--data_path", "reasoning_gym:propositional_logic?size=40", "--data_split", "0,1", "--max_prompts", "4",
             "--samples_per_prompt", "3", "--max_new_tokens", "6", "--data_output_path", str(tmp_path / "cache"),
             "--dtype", "fp32"]
    assert run_sample_pairs(flags) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["counts"]["train"]["prompts"] == 4 and meta["counts"]["train"]["pairs"] > 0


def test_resume_keeps_pairs_made_with_the_same_settings_and_remakes_others(tmp_path, data_file, judge_module,
                                                                         capsys):
    out = tmp_path / "pairs"
    flags = ["--model_name_or_path", "tiny", "--reward_fn", f"{judge_module}:by_length", "--output_dir", str(out),
             "--data_path", data_file, "--data_split", "0,1", "--max_prompts", "4", "--max_new_tokens", "4", "--data_output_path", str(tmp_path / "cache"),
             "--dtype", "fp32"]
    assert run_sample_pairs(flags) == 0
    judge = sys.modules[judge_module]
    before = (out / "train.jsonl").stat().st_mtime_ns
    assert run_sample_pairs([*flags, "--resume"]) == 0
    assert len(judge.calls) == 2 and (out / "train.jsonl").stat().st_mtime_ns == before
    assert "already holds these pairs" in capsys.readouterr().out
    assert run_sample_pairs([*flags, "--resume", "--seed", "7"]) == 0  # other settings: sampled again
    assert len(judge.calls) == 4 and json.loads((out / "meta.json").read_text())["settings"]["seed"] == 7


def test_resume_samples_again_from_a_model_saved_anew_in_the_same_folder(tmp_path, data_file, judge_module,
                                                                         tiny_model_dir):
    """train.py --pair-rounds retrains an earlier round into the same folder: its pairs must not be kept."""
    import os
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    out = tmp_path / "pairs"
    flags = ["--model_name_or_path", str(model), "--reward_fn", f"{judge_module}:by_length", "--output_dir",
             str(out), "--data_path", data_file, "--data_split", "0,1", "--max_prompts", "4", "--max_new_tokens", "4",
             "--data_output_path", str(tmp_path / "cache"), "--dtype", "fp32", "--resume"]
    assert run_sample_pairs(flags) == 0
    judge = sys.modules[judge_module]
    assert run_sample_pairs(flags) == 0 and len(judge.calls) == 2  # the same weights: kept
    weights = next(model.glob("*.safetensors"))
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))  # saved again
    assert run_sample_pairs(flags) == 0 and len(judge.calls) == 4  # sampled again


def test_a_split_whose_answers_all_score_alike_takes_the_data_sets_own_pairs(tmp_path, data_file, judge_module,
                                                                            capsys):
    """An actor that fails every question alike (the judge scores every answer 0) gives no pair; rather than end
    the run, each split takes the data set's own pairs of its prompts, counted and said."""
    from utils.data.raw_datasets import read_local_split

    out = tmp_path / "pairs"
    flags = ["--model_name_or_path", "tiny", "--reward_fn", f"{judge_module}:all_alike", "--output_dir", str(out),
             "--data_path", data_file, "--data_split", "0,1", "--max_prompts", "6", "--samples_per_prompt", "3",
             "--max_new_tokens", "4", "--data_output_path", str(tmp_path / "cache"), "--dtype", "fp32"]
    assert run_sample_pairs(flags) == 0
    data = {row["prompt"]: row for row in read_local_split(data_file)}
    meta = json.loads((out / "meta.json").read_text())
    for split, n in (("train", 6), ("eval", 4)):
        rows = [json.loads(line) for line in (out / f"{split}.jsonl").read_text().splitlines()]
        assert len(rows) == n and all(data[row["prompt"]]["chosen"] == row["chosen"] and
                                      data[row["prompt"]]["rejected"] == row["rejected"] for row in rows)
        assert meta["counts"][split]["pairs"] == meta["counts"][split]["pairs_from_data"] == n
        assert meta["counts"][split]["skipped_all_equal"] == n
    out_text = capsys.readouterr().out
    assert "WARNING: no train prompt's answers scored apart; its 6 pairs are the data set's own" in out_text
    assert "6 pairs are the data set's own (no prompt's answers scored apart)" in out_text
