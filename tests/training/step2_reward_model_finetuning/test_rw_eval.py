"""Tests of training/step2_reward_model_finetuning/rw_eval.py: the agreement statistics on hand-worked values,
the candidate answers of the built-in task, batched scoring equal to step 2's own forward, and the CLI as a
subprocess on a reward model trained briefly by step 2."""
import json
import math
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModel

from training.step2_reward_model_finetuning.rw_eval import (EXAMPLES, accuracy_by_group, average_ranks,
                                                            pairwise_agreement, pearson, spearman)
from utils.data import builtin_task as task
from utils.data.data_utils import DataCollatorReward, SampleCounter, pair_sample
from utils.model.reward_model import RewardModel, score_answers

REPO = Path(__file__).resolve().parents[3]
STEP_DIR = REPO / "training" / "step2_reward_model_finetuning"


def run(*args, timeout=300):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, *map(str, args)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


# --------------------------------------------------------------------------- statistics


def test_pearson_hand_worked():
    # x = 1, 2, 3; y = 1, 3, 2: deviations (-1, 0, 1) and (-1, 1, 0): 1 / sqrt(2 * 2) = 0.5
    assert pearson([1, 2, 3], [1, 3, 2]) == pytest.approx(0.5)
    assert pearson([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(pearson([1, 2, 3], [5, 5, 5]))


def test_average_ranks_share_ties():
    assert average_ranks([10, 20, 20, 30]).tolist() == [1, 2.5, 2.5, 4]
    assert average_ranks([0.5, 0, 1, 0, 0]).tolist() == [4, 2, 5, 2, 2]


def test_spearman_uses_ranks_with_ties():
    assert spearman([1, 2, 3, 4], [1, 4, 9, 100]) == pytest.approx(1.0)  # monotone, not linear
    # ranks x = 1, 2, 3, 4 and y = 1.5, 1.5, 3, 4: pearson of the ranks = 4.5 / sqrt(5 * 4.5)
    assert spearman([1, 2, 3, 4], [0, 0, 1, 2]) == pytest.approx(4.5 / math.sqrt(5 * 4.5))


def test_pairwise_agreement_counts_pairs_with_different_checker_scores():
    checker = [1.0, 0.5, 0.5, 0.0]
    rm = [3.0, 1.0, 2.0, 2.0]
    # pairs with different checker scores: (0,1) (0,2) (0,3) (1,3) (2,3); agreeing: (0,1) (0,2) (0,3);
    # (1,3) is out of order and (2,3) a tie, which does not count as agreeing
    assert pairwise_agreement(checker, rm) == (3, 5)


def test_pairwise_agreement_between_two_levels_only():
    checker = [1.0, 0.5, 0.5, 0.0, 1.0]
    rm = [3.0, 1.0, 4.0, 2.0, 0.5]
    # exact (0, 4) against near miss (1, 2): (0,1) agrees, (0,2) does not, (4,1) does not, (4,2) does not;
    # pairs with the 0.0 answer or of two exact answers are left out
    assert pairwise_agreement(checker, rm, levels=(1.0, 0.5)) == (1, 4)
    assert pairwise_agreement(checker, rm, levels=(0.5, 0.0)) == (1, 2)


def test_accuracy_by_group_counts_a_tie_as_wrong():
    # add: 1 > 0 right, 3 < 4 wrong; reverse: 2 == 2 a tie, wrong; groups in the order first seen
    assert accuracy_by_group(["add", "reverse", "add"], [1, 2, 3], [0, 2, 4]) == {"add": 0.5, "reverse": 0.0}
    assert list(accuracy_by_group(["upper", "add"], [1, 1], [0, 0])) == ["upper", "add"]


# --------------------------------------------------------------------------- the built-in answers


def test_candidate_answers_cover_every_checker_level():
    rng = random.Random(0)
    prompts = [task.format_prompt(q) for q in ("What is 12 + 9?", 'Reverse the word "adzye".',
                                               "What is the capital of Germany?", 'Say "mphiv" in uppercase.')]
    levels = set()
    for prompt in prompts:
        answers = task.candidate_answers(prompt, rng)
        scores = [task.score_answer(prompt, answer) for answer in answers]
        assert len(answers) == 6 and scores[0] == 1.0 and task.NOT_KNOWN in answers
        assert all(answer.startswith(" ") for answer in answers)
        expected = answers[0].strip()
        assert expected.startswith(answers[-1].strip()) and answers[-1].strip() != expected  # the truncation
        levels.update(scores)
    assert levels == {1.0, 0.5, 0.25, 0.0}


def test_a_one_character_answer_has_no_truncation():
    answers = task.candidate_answers(task.format_prompt("What is 1 + 2?"), random.Random(0))
    assert len(answers) == 5 and answers[0] == " 3"


def test_builtin_examples_have_a_good_and_a_worse_answer():
    for question, good, bad in EXAMPLES:
        prompt = task.format_prompt(question)
        assert task.score_answer(prompt, good) == 1.0
        assert task.score_answer(prompt, bad) < 1.0


# --------------------------------------------------------------------------- scoring


def test_score_answers_equals_step2_forward_on_its_own_batches(small_config, tiny_tokenizer):
    torch.manual_seed(0)
    model = RewardModel(AutoModel.from_config(small_config("llama", vocab_size=len(tiny_tokenizer))))
    torch.nn.init.normal_(model.v_head.weight)
    prompt = " Human: What is 7 + 12? Assistant:"
    pairs = [(prompt, " 19", " 21"), (" Human: Say \"ab\" in uppercase. Assistant:", " AB", " I don't know."),
             (prompt, " 19", " 19 Human: What is")]
    counter = SampleCounter("pairs")
    batch = DataCollatorReward(tiny_tokenizer.pad_token_id)(
        [pair_sample(tiny_tokenizer, p, c, r, 64, counter) for p, c, r in pairs])
    model.train()  # dropout is 0 in the small config; score_answers must still leave the mode as it found it
    with torch.no_grad():
        out = model(**batch)
    prompts = [p for p, _, _ in pairs] * 2
    answers = [c for _, c, _ in pairs] + [r for _, _, r in pairs]
    for batch_size in (1, 4, 32):
        scores = score_answers(model, tiny_tokenizer, prompts, answers, batch_size=batch_size)
        assert scores[:3] == pytest.approx(out["chosen_end_scores"].tolist(), abs=1e-5)
        assert scores[3:] == pytest.approx(out["rejected_end_scores"].tolist(), abs=1e-5)
    assert model.training
    with pytest.raises(ValueError, match="2 prompts but 1 answers"):
        score_answers(model, tiny_tokenizer, prompts[:2], answers[:1])


# --------------------------------------------------------------------------- the CLI


@pytest.fixture(scope="module")
def reward_dir(tmp_path_factory):
    """A reward model trained by step 2 for 20 steps from the tiny model (eval accuracy ~0.4 -> ~0.75)."""
    root = tmp_path_factory.mktemp("rw_eval")
    result = run(STEP_DIR / "main.py", "--output_dir", root / "rm", "--data_output_path", root / "cache",
                 "--max_steps", "20", "--per_device_train_batch_size", "32", "--max_seq_len", "64",
                 "--eval_iters", "1", "--per_device_eval_batch_size", "32", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return root / "rm"


def test_default_mode_scores_good_and_bad_answers(reward_dir, tmp_path):
    result = run(STEP_DIR / "rw_eval.py", "--model_name_or_path", reward_dir, "--output_json", tmp_path / "r.json")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith("' Human:")]
    assert len(rows) == len(EXAMPLES)
    report = json.loads((tmp_path / "r.json").read_text())
    wins = sum(e["good_score"] > e["bad_score"] for e in report["examples"])
    assert f"good answer scored higher in {wins}/{len(EXAMPLES)} examples" in result.stdout
    for row, example in zip(rows, report["examples"]):
        assert f"{example['good_score']:7.3f}" in row and row.endswith("yes" if example["good_score"] >
                                                                       example["bad_score"] else "NO")


def test_pairs_mode_prints_accuracy(reward_dir, tmp_path):
    from utils.model.reward_model import load_reward_model

    rows = [{"prompt": task.format_prompt(f"What is {a} + {a}?"), "chosen": f" {2 * a}", "rejected": r}
            for a, r in ((3, " 7"), (5, " I don't know."), (8, " 16 Human:"), (9, " 18"), (11, " 22"))]
    rows[3]["rejected"] = rows[3]["chosen"]                          # identical: skipped
    rows[4]["rejected"] = " " + "and so on " * 40                    # longer than --max_seq_len: skipped
    no_answer = {"prompt": task.format_prompt("What is 1 + 1?")}      # a prompt alone: skipped
    pairs_file = tmp_path / "pairs.jsonl"
    pairs_file.write_text("".join(json.dumps(row) + "\n" for row in rows + [no_answer]))
    # No --max_seq_len: the reward model's own training length (64, saved with it) applies.
    result = run(STEP_DIR / "rw_eval.py", "--model_name_or_path", reward_dir, "--pairs_file", pairs_file,
                 "--num_examples", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "(--max_seq_len 64)" in result.stdout
    assert "(skipped: 1 identical chosen and rejected, 1 longer than --max_seq_len, 1 no answer)" in result.stdout
    assert len([line for line in result.stdout.splitlines() if line.startswith("' Human:")]) == 2

    model, tokenizer = load_reward_model(str(reward_dir))
    kept = rows[:3]
    chosen = score_answers(model, tokenizer, [r["prompt"] for r in kept], [r["chosen"] for r in kept])
    rejected = score_answers(model, tokenizer, [r["prompt"] for r in kept], [r["rejected"] for r in kept])
    accuracy = sum(c > r for c, r in zip(chosen, rejected)) / 3
    assert f"accuracy {accuracy:.4f} over 3 pairs; mean score chosen {sum(chosen) / 3:.3f}" in result.stdout
    assert f"accuracy by skill: add {accuracy:.4f}\n" in result.stdout  # every prompt is a sum


def test_heldout_mode_correlates_with_the_checker(reward_dir, tmp_path):
    result = run(STEP_DIR / "rw_eval.py", "--model_name_or_path", reward_dir, "--heldout", "--num_examples", "3",
                 "--output_json", tmp_path / "h.json")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "h.json").read_text())
    match = re.search(r"pearson (\S+)  spearman (\S+)  pairwise accuracy (\S+) over (\d+) pairs", result.stdout)
    assert match, result.stdout
    assert float(match[1]) == pytest.approx(report["pearson"], abs=1e-4)
    assert int(match[4]) == report["num_pairs"] and report["num_prompts"] == 400
    # a reward model trained 20 steps already orders the answers as the checker does, more often than not
    # (measured: pearson 0.45, pairwise accuracy 0.79); shuffled or misaligned scores would give ~0 and ~0.5
    assert report["pearson"] > 0.2 and report["spearman"] > 0.2 and report["pairwise_accuracy"] > 0.6
    exact = report["exact_over_near_miss_by_skill"]
    assert set(exact) == set(task.SKILLS) and all(0.0 <= value <= 1.0 for value in exact.values())
    assert "exact answer above a near miss: " + ", ".join(f"{k} {v:.3f}" for k, v in exact.items()) in result.stdout
    levels = report["mean_score_by_checker_level"]
    assert set(levels) == {"1.0", "0.5", "0.25", "0.0"} and levels["1.0"] > levels["0.0"]
    answers = report["answers"]
    assert all(a["checker_score"] == task.score_answer(a["prompt"], a["answer"]) for a in answers[:50])


def test_a_folder_that_is_not_a_reward_model_exits_2_with_one_line():
    result = run(STEP_DIR / "rw_eval.py", "--model_name_or_path", "tiny")
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert errors == [("error: tiny is not a reward model (its config.json has no 'chatrlhf_reward_model' entry); "
                       "pass a step-2 output folder")]
