"""Tests of the step-1 prompt evaluation: inference/evaluation.py in-process, prompt_eval.py as a subprocess."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from inference.evaluation import (builtin_prompts, evaluate_models, format_score_table, format_side_by_side,
                                  read_prompts_file)
from utils.data import builtin_task as task
from utils.model.model_utils import resolve_model_path
from utils.runtime.errors import DataError

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "training" / "step1_supervised_finetuning" / "prompt_eval.py"


def run_prompt_eval(*args):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # a tiny model: threads only add start-up and contention
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=REPO, env=env,
                          timeout=180)


pytestmark = pytest.mark.usefixtures("one_thread")


def test_checker_scores_are_task_scores_of_the_returned_answers(tiny):
    prompts = builtin_prompts()[:8]
    assert {task.parse_prompt(p)[0] for p in prompts} == set(task.SKILLS)

    def reward_fn(prompts, answers):  # a stand-in reward model: the answer's length
        return [len(answer) for answer in answers]

    results = evaluate_models({"a": tiny}, prompts, max_new_tokens=6, seed=5, reward_fn=reward_fn)
    result = results["a"]
    assert set(result) == {"sampled", "greedy", "answers", "answer_stats", "seconds"}
    assert set(result["seconds"]) == {"sampled", "greedy"} and all(s > 0 for s in result["seconds"].values())
    for decoding in ("sampled", "greedy"):
        answers = result["answers"][decoding]
        assert len(answers) == len(prompts)
        for skill in task.SKILLS:
            scores = [task.score_answer(p, a) for p, a in zip(prompts, answers) if task.parse_prompt(p)[0] == skill]
            assert result[decoding][skill] == pytest.approx(sum(scores) / len(scores))
        all_scores = [task.score_answer(p, a) for p, a in zip(prompts, answers)]
        assert result[decoding]["all"] == pytest.approx(sum(all_scores) / len(all_scores))
        assert result[decoding]["reward"] == pytest.approx(sum(map(len, answers)) / len(answers))
    assert result["answers"]["sampled"] != result["answers"]["greedy"]


def test_several_samples_per_prompt_are_rounds_over_the_prompts_and_scored_together(tiny):
    prompts = builtin_prompts()[:6]
    result = evaluate_models({"a": tiny}, prompts, max_new_tokens=6, seed=5, samples_per_prompt=3,
                             reward_fn=lambda prompts, answers: [len(p) for p in prompts])["a"]
    sampled, greedy = result["answers"]["sampled"], result["answers"]["greedy"]
    assert len(sampled) == 3 * len(prompts) and len(greedy) == len(prompts)
    answered = prompts * 3  # answer i answers prompt i % 6
    scores = [task.score_answer(p, a) for p, a in zip(answered, sampled)]
    assert result["sampled"]["all"] == pytest.approx(sum(scores) / len(scores))
    assert result["sampled"]["reward"] == pytest.approx(sum(map(len, answered)) / len(answered))
    assert len(set(sampled)) > len(prompts)  # the rounds are new draws, not one answer repeated
    one_sample = evaluate_models({"a": tiny}, prompts, max_new_tokens=6, seed=5)["a"]
    assert one_sample["answers"]["greedy"] == greedy


def test_greedy_only_and_prompts_outside_the_task(tiny):
    prompts = [" Human: Tell me a joke. Assistant:", task.format_prompt("What is 1 + 2?")]
    results = evaluate_models({"a": tiny}, prompts, max_new_tokens=4, greedy_only=True)
    stats = results["a"].pop("answer_stats")
    assert set(results["a"].pop("seconds")) == {"greedy"}
    assert results == {"a": {"greedy": {}, "answers": {"greedy": results["a"]["answers"]["greedy"]}}}
    assert set(stats) == {"greedy"} and "best_constant" not in stats["greedy"]  # no checker: no constant scored
    assert stats["greedy"]["answers"] == 2 and stats["greedy"]["max_new_tokens"] == 4
    assert format_score_table(results) == ""


def test_score_table_and_side_by_side_layout():
    results = {
        "baseline": {"sampled": {"all": 0.25, "add": 0.5}, "greedy": {"all": 0.0, "add": 0.0},
                     "answers": {"sampled": [" 7\nx"], "greedy": [" 1"]}},
        "finetune": {"sampled": {"all": 1.0, "add": 1.0}, "greedy": {"all": 0.75, "add": 0.75},
                     "answers": {"sampled": [" 3"], "greedy": [" 3"]}},
    }
    assert format_score_table(results).splitlines() == [
        "model     decoding      all      add",
        "baseline  sampled     0.250    0.500",
        "baseline  greedy      0.000    0.000",
        "finetune  sampled     1.000    1.000",
        "finetune  greedy      0.750    0.750",
    ]
    side = format_side_by_side([task.format_prompt("What is 1 + 2?")], results, num_show=8, width=6)
    assert side.splitlines()[2:] == [
        "prompt 0: Human: What is 1 + 2? Assistant:",
        "sampled  |  7\\nx  |  3    ",
        "greedy   |  1     |  3    ",
    ]


def test_read_prompts_file_json_lines_and_plain_text(tmp_path):
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": " Human: a Assistant:", "x": 1}\n\n{"prompt": " Human: b Assistant:"}\n')
    assert read_prompts_file(jsonl) == [" Human: a Assistant:", " Human: b Assistant:"]
    text = tmp_path / "p.txt"
    text.write_text(" Human: a Assistant:\n\nplain prompt\n")
    assert read_prompts_file(text) == [" Human: a Assistant:", "plain prompt"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{"text": "b"}\n')
    with pytest.raises(DataError, match="line 2"):
        read_prompts_file(bad)
    with pytest.raises(DataError, match="does not exist"):
        read_prompts_file(tmp_path / "missing.jsonl")


def test_read_prompts_file_json_array_and_text_starting_with_a_bracket(tmp_path):
    """A JSON array of {prompt} rows, as the data files may be, pretty-printed or not (before: each of its lines
    read as a plain-text prompt, "[" and "{" among them); a text prompt starting with "[" stays text."""
    rows = [{"prompt": " Human: a Assistant:"}, {"prompt": " Human: b Assistant:", "x": 1}]
    for name, indent in (("pretty.json", 2), ("one_line.json", None)):
        (tmp_path / name).write_text(json.dumps(rows, indent=indent))
        assert read_prompts_file(tmp_path / name) == [" Human: a Assistant:", " Human: b Assistant:"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([rows[0], {"text": "b"}]))
    with pytest.raises(DataError, match="bad.json row 1: no non-empty string field 'prompt'"):
        read_prompts_file(bad)
    (tmp_path / "empty.json").write_text("[]")
    with pytest.raises(DataError, match="has no prompts"):
        read_prompts_file(tmp_path / "empty.json")
    text = tmp_path / "inst.txt"
    text.write_text("[INST] a [/INST]\n[INST] b [/INST]\n")
    assert read_prompts_file(text) == ["[INST] a [/INST]", "[INST] b [/INST]"]


def test_read_prompts_file_with_a_byte_order_mark_or_line_separators_in_a_prompt(tmp_path):
    jsonl = tmp_path / "bom.jsonl"
    jsonl.write_text('{"prompt": " Human: a\u2028b Assistant:"}\n', encoding="utf-8-sig")  # a BOM, then JSON
    assert read_prompts_file(jsonl) == [" Human: a\u2028b Assistant:"]
    text = tmp_path / "bom.txt"
    text.write_text("first\u0085still first\nsecond\n", encoding="utf-8-sig")
    assert read_prompts_file(text) == ["first\u0085still first", "second"]


def test_prompt_eval_cli_prints_the_table_and_writes_json(tmp_path):
    output = tmp_path / "eval.json"
    result = run_prompt_eval("--model_name_or_path_baseline", "tiny", "--model_name_or_path_finetune", "tiny",
                             "--num_prompts", "8", "--max_new_tokens", "6", "--num_show", "2",
                             "--output_json", str(output))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines.count("model     decoding      all      add  reverse  capital    upper") == 1
    header = lines.index("model     decoding      all      add  reverse  capital    upper")
    rows = ("baseline  sampled", "baseline  greedy", "finetune  sampled", "finetune  greedy")
    assert [line[:len(row)] for line, row in zip(lines[header + 1:], rows)] == list(rows)
    assert sum(line.startswith("prompt ") for line in lines) == 2
    # the answers' table: each model, decoding and group (all and the 4 skills) once
    answers_header = next(i for i, line in enumerate(lines) if line.startswith("model     decoding  group"))
    assert [line.split()[:3] for line in lines[answers_header + 1:answers_header + 21]] == \
        [[*row.split(), group] for row in rows for group in ("all", *task.SKILLS)]
    results = json.loads(output.read_text())
    assert set(results) == {"baseline", "finetune"}
    for model in results.values():
        for decoding in ("sampled", "greedy"):
            assert set(model[decoding]) == {"all", *task.SKILLS}
            assert all(0.0 <= score <= 1.0 for score in model[decoding].values())
            assert len(model["answers"][decoding]) == 8
            stats = model["answer_stats"][decoding]
            assert set(stats["best_constant"]) == {"all", *task.SKILLS} and stats["max_new_tokens"] == 6
            assert 0 <= stats["hit_limit"] <= stats["answers"] == 8
    # the same model and the same sampling seed: the same answers
    assert results["baseline"]["answers"] == results["finetune"]["answers"]


def test_prompt_eval_cli_refuses_a_missing_model_before_generating():
    baseline = resolve_model_path("tiny")  # a real folder: it would be loaded and run first
    result = run_prompt_eval("--model_name_or_path_baseline", baseline, "--model_name_or_path_finetune",
                             "/nonexistent/actor")
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["error: model path /nonexistent/actor does not exist"]
    assert result.stdout == ""


def test_score_table_columns_follow_the_scores_with_wide_task_names():
    results = {"m": {"greedy": {"all": 0.5, "family_relationships": 1.0, "gcd": 0.0, "reward": -1.5},
                     "answers": {"greedy": ["a", "b"]}}}
    assert format_score_table(results).splitlines() == [
        "model  decoding      all  family_relationships      gcd   reward",
        "m      greedy      0.500                 1.000    0.000   -1.500",
    ]


def test_prompt_eval_on_reasoning_gym_heldout_questions_scores_per_task(tmp_path, capsys):
    """--data_path with a reasoning-gym spec: its held-out questions, tasks in turn, scored by each task's
    verifier; evaluation.json has the usual schema with per-task keys."""
    pytest.importorskip("reasoning_gym")
    from training.step1_supervised_finetuning import prompt_eval
    from utils.data.reasoning_gym_data import gym_data

    spec = "reasoning_gym:chain_sum?max_terms=2&size=40,syllogism?size=40"
    output = tmp_path / "evaluation.json"
    prompt_eval.main(["--model_name_or_path_baseline", "tiny", "--model_name_or_path_finetune", "tiny",
                      "--data_path", spec, "--num_prompts", "6", "--max_new_tokens", "4", "--num_show", "1",
                      "--output_json", str(output)])
    assert "mean reasoning-gym score" in capsys.readouterr().out
    results = json.loads(output.read_text())
    data = gym_data(spec)
    prompts = [item.prompt for item in data.parts["heldout"][:6]]
    assert [data.verifier.item(p).task for p in prompts] == ["chain_sum", "syllogism"] * 3
    for name in ("baseline", "finetune"):
        for decoding in ("sampled", "greedy"):
            scores = results[name][decoding]
            assert list(scores) == ["all", "chain_sum", "syllogism", "solved"]
            assert scores == pytest.approx(data.verifier.summarize(prompts, results[name]["answers"][decoding]))



def test_heldout_set_of_a_local_data_file_is_its_eval_prompts_without_a_checker(tmp_path):
    """A data source without a checker (a user's preference data): the evaluation's prompts are its eval split's,
    which no stage trains on, and no checker is claimed for them (a reward model scores them instead)."""
    from inference.evaluation import heldout_set

    folder = tmp_path / "data"
    folder.mkdir()
    rows = {"train": [("Is the sky blue?", "Yes.", "No.")] * 3,
            "eval": [("Name a fruit.", "Apple.", "Chair."), ("Say hi.", "Hi!", "...")]}
    for split, items in rows.items():
        (folder / f"{split}.json").write_text("".join(
            json.dumps({"prompt": f" Human: {p} Assistant:", "chosen": f" {c}", "rejected": f" {r}"}) + "\n"
            for p, c, r in items))
    prompts, checker = heldout_set([str(folder)])
    assert prompts == [" Human: Name a fruit. Assistant:", " Human: Say hi. Assistant:"]
    assert checker is None
    both, checker = heldout_set([str(folder), "builtin"])
    assert both[:2] == prompts and len(both) == 2 + 400 and checker is None


def test_the_answer_length_defaults_to_the_one_the_finetuned_model_was_trained_to(tmp_path, tiny_tokenizer,
                                                                                    capsys):
    import shutil

    from inference.generation import DEFAULT_MAX_NEW_TOKENS, trained_max_new_tokens as answer_length
    from utils.data.data_utils import tokenize_prompt
    from utils.model.save import TRAINING_SETTINGS

    prompts = builtin_prompts()[:8]
    assert answer_length(resolve_model_path("tiny"), prompts) == DEFAULT_MAX_NEW_TOKENS  # no saved settings
    actor = tmp_path / "actor"
    shutil.copytree(resolve_model_path("tiny"), actor)
    (actor / TRAINING_SETTINGS).write_text('{"step": 1, "max_seq_len": 40}')
    longest = max(len(tokenize_prompt(tiny_tokenizer, prompt)) for prompt in prompts)
    assert 0 < longest < 40
    assert answer_length(actor, prompts) == 40 - longest  # step 1 fits prompt + answer in --max_seq_len
    assert f"--max_new_tokens {40 - longest}: " in capsys.readouterr().out
    (actor / TRAINING_SETTINGS).write_text('{"step": 3, "max_prompt_seq_len": 32, "max_answer_seq_len": 12}')
    assert answer_length(actor, prompts) == 12


def test_prompt_eval_scores_prompt_only_data_with_a_users_reward_function(tmp_path, capsys, monkeypatch):
    """A user's RL set-up: questions without answers and a program that checks answers. --reward_fn is the
    evaluation's checker: 'all' is the mean of its scores of the recorded answers."""
    from training.step1_supervised_finetuning import prompt_eval

    folder = tmp_path / "questions"
    folder.mkdir()
    for split in ("train", "eval"):
        (folder / f"{split}.jsonl").write_text("".join(
            json.dumps({"prompt": [{"role": "user", "content": f"Say {word}."}]}) + "\n"
            for word in ("cat", "dog", "sun", "sky", "sea")))
    (tmp_path / "checks.py").write_text(
        "def length_score(prompts, answers):\n"
        "    assert all(p.startswith(' Human: Say ') for p in prompts)\n"
        "    return [min(len(a.split()), 4) / 4 for a in answers]\n")
    monkeypatch.chdir(tmp_path)
    output = tmp_path / "evaluation.json"
    prompt_eval.main(["--model_name_or_path_baseline", "tiny", "--model_name_or_path_finetune", "tiny",
                      "--data_path", str(folder), "--reward_fn", "checks.py:length_score", "--max_new_tokens", "6",
                      "--num_show", "0", "--output_json", str(output)])
    assert "mean score of the reward function --reward_fn checks.py:length_score" in capsys.readouterr().out
    results = json.loads(output.read_text())
    for name in ("baseline", "finetune"):
        for decoding in ("sampled", "greedy"):
            answers = results[name]["answers"][decoding]
            assert len(answers) == 5  # the eval split of a folder: its eval.jsonl
            expected = sum(min(len(a.split()), 4) / 4 for a in answers) / len(answers)
            assert results[name][decoding] == {"all": pytest.approx(expected)}


def test_held_out_prompts_are_fitted_to_the_context_as_training_fits_them(tiny_tokenizer, capsys):
    """Before: one held-out dialogue longer than the context less --max_new_tokens ended the closing evaluation of
    a run on HH-like data with an error. A dialogue loses its earliest turns first; one whose last turn alone does
    not fit is left out; both counts are said."""
    from argparse import Namespace

    from training.step1_supervised_finetuning.prompt_eval import fit_to_context

    turn = " Human: " + "tell me more " * 12 + "Assistant: " + "more words here " * 12
    prompts = [" Human: hi Assistant:", turn * 6 + " Human: and? Assistant:", " Human: " + "long " * 200 + "Assistant:"]
    args = Namespace(model_name_or_path_finetune="tiny", trust_remote_code=False, max_new_tokens=400)
    fitted = fit_to_context(args, prompts)  # the tiny model's 512 positions leave 112 for a prompt
    assert fitted[0] == prompts[0] and fitted[1].endswith(" Human: and? Assistant:") and len(fitted) == 2
    assert len(tiny_tokenizer(fitted[1])["input_ids"]) + 400 <= 512 < len(tiny_tokenizer(prompts[1])["input_ids"])
    said = capsys.readouterr().out
    assert "held-out prompts: 2 samples, 1 of them with earlier turns dropped to fit (skipped: 1 longer than the " \
           "context (512) less --max_new_tokens)" in said
