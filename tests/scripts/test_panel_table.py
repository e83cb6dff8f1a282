"""scripts/panel_table.py: the docs' panel table made from runs' own evaluation.json, metrics.json and report.md."""
import json

from scripts.panel_table import table


def stats(best_constant, distinct, top_share):
    return {"best_constant": {"all": best_constant}, "distinct_answers": {"all": distinct},
            "top_answer_share": {"all": top_share}}


def write_run(folder, after, after_stats, step1_stop=None, rl_stop=None, step1_best=None):
    folder.mkdir()
    before = {"sampled": {"all": 0.1}, "greedy": {"all": 0.2, "solved": 0.1},
              "answer_stats": {"sampled": stats(0.3, 50, 0.1), "greedy": stats(0.3, 40, 0.2)}}
    evaluation = {"baseline": before, "finetune": {**after, "answer_stats": after_stats}}
    (folder / "evaluation.json").write_text(json.dumps(evaluation))
    (folder / "report.md").write_text("Measured by `python train.py --algorithm grpo`:\n\n| all | wall time | 900 s |\n")
    steps = step1_stop["step"] if step1_stop else 70
    for stage, metrics in (("actor-models/m", {"optimizer_steps": steps, "stopped": step1_stop,
                                               "saved_best": step1_best}),
                           ("step3-models/m", {"total_steps": 40, "stopped": rl_stop})):
        (folder / stage).mkdir(parents=True)
        (folder / stage / "metrics.json").write_text(json.dumps(metrics))


def test_rows_goal_and_constant_answers_come_from_the_runs(tmp_path):
    write_run(tmp_path / "gcd-1", {"sampled": {"all": 0.35}, "greedy": {"all": 0.40, "solved": 0.25}},
              {"sampled": stats(0.3, 60, 0.1), "greedy": stats(0.3, 45, 0.15)},
              step1_stop={"step": 70, "reason": "--max_train_minutes 6 is spent"})
    # The RL actor answers one thing to 90% of the questions and scores no more than that answer would.
    write_run(tmp_path / "count-1", {"sampled": {"all": 0.30}, "greedy": {"all": 0.33}},
              {"sampled": stats(0.33, 3, 0.9), "greedy": stats(0.33, 2, 0.95)},
              step1_stop={"step": 50, "reason": "the eval loss has not improved for 3 evaluations"},
              rl_stop={"step": 31, "reason": "--max_train_minutes 10 is spent"})
    write_run(tmp_path / "lcm-1", {"sampled": {"all": 0.15}, "greedy": {"all": 0.45}},
              {"sampled": stats(0.3, 60, 0.1), "greedy": stats(0.3, 45, 0.15)},
              step1_stop={"step": 90, "reason": "the eval score has not improved for 3 evaluations"},
              step1_best={"step": 60, "last_step": 90, "metric": "score", "value": 0.5})
    write_run(tmp_path / "letters-1", {"sampled": {"all": 0.15}, "greedy": {"all": 0.45}},
              {"sampled": stats(0.3, 60, 0.1), "greedy": stats(0.3, 45, 0.15)},
              rl_stop={"step": 20, "reason": "5 rounds in a row found no group whose answers' scores differ: every "
                                             "prompt is answered alike (--stop_after_idle_rounds 5)"})
    assert "| 20 (idle) |" in table([tmp_path / "letters-1"], "Idle")
    write_run(tmp_path / "sums-1", {"sampled": {"all": 0.15}, "greedy": {"all": 0.45}},
              {"sampled": stats(0.3, 60, 0.1), "greedy": stats(0.3, 45, 0.15)},
              rl_stop={"step": 90, "reason": "--deadline is 80 s away, and saving and evaluating after training "
                                             "need about 80 s"})
    assert "| 90 (deadline) |" in table([tmp_path / "sums-1"], "Deadline")
    text = table([tmp_path / "gcd-1", tmp_path / "count-1", tmp_path / "lcm-1"], "Panel")
    assert text.startswith("### Panel") and "`python train.py --algorithm grpo`" in text and "commit:" in text
    (tmp_path / "gcd-1" / "base-evaluation.json").write_text(json.dumps(
        {"baseline": {"sampled": {"all": 0.01}, "greedy": {"all": 0.02}}}))
    text = table([tmp_path / "gcd-1", tmp_path / "count-1", tmp_path / "lcm-1"], "Panel")
    assert ("| gcd-1 | 0.010 / 0.020 | 70 (time) | 0.100 -> 0.350 (+0.250) | 0.200 -> 0.400 (+0.200) | 0.100 -> 0.250 | - "
            "| 0.300 | 45 (15%) "
            "| 40 (budget) | 15.0 | met |") in text
    assert "| count-1 | - | 50 (eval loss) |" in text and "| 31 (time) | 15.0 | constant answer |" in text
    assert "| lcm-1 | - | 90 (eval score; saved 60) | 0.100 -> 0.150 (+0.050) |" in text and text.count("| met |") == 1
    assert "met in 1 of 3 runs (33%)" in text


def test_pass_at_k_is_the_runs_or_recomputed_from_its_answers_with_the_specs_verifier(tmp_path):
    from inference.evaluation import heldout_set

    spec = "reasoning_gym:chain_sum?min_terms=2&max_terms=2&max_digits=1&size=40"
    prompts, checker = heldout_set([spec])
    right = [checker.key(prompt)[1] for prompt in prompts[:4]]  # the reference answers
    wrong = ["-1"] * 4
    after_stats = {"sampled": {**stats(0.1, 4, 0.3), "pass_at_k": {"all": 0.75}, "k": 2},
                   "greedy": stats(0.1, 4, 0.3)}
    write_run(tmp_path / "sum-1", {"sampled": {"all": 0.5}, "greedy": {"all": 0.5}}, after_stats)
    evaluation = json.loads((tmp_path / "sum-1" / "evaluation.json").read_text())
    # the step-1 actor's answers, two rounds over 4 questions: the first two questions solved in round 2 only
    evaluation["baseline"]["answers"] = {"sampled": wrong + right[:2] + wrong[:2], "greedy": wrong}
    (tmp_path / "sum-1" / "evaluation.json").write_text(json.dumps(evaluation))
    (tmp_path / "sum-1" / "report.md").write_text(
        f"Measured by `python train.py --data-path '{spec}' --algorithm grpo`:\n\n| all | wall time | 60 s |\n")
    assert "| 0.500 -> 0.750 |" in table([tmp_path / "sum-1"], "Panel")


def test_a_gain_of_exactly_the_goal_meets_it(tmp_path):
    """0.77 - 0.67 is 0.09999999999999998 in floating point: a gain of +0.10 in hundredths still meets +0.10."""
    write_run(tmp_path / "syllogism-2", {"sampled": {"all": 0.30}, "greedy": {"all": 0.30}},
              {"sampled": stats(0.1, 2, 0.8), "greedy": stats(0.1, 2, 0.8)})
    evaluation = json.loads((tmp_path / "syllogism-2" / "evaluation.json").read_text())
    evaluation["baseline"]["greedy"]["all"], evaluation["finetune"]["greedy"]["all"] = 0.67, 0.77
    (tmp_path / "syllogism-2" / "evaluation.json").write_text(json.dumps(evaluation))
    text = table([tmp_path / "syllogism-2"], "Panel")
    assert "0.670 -> 0.770 (+0.100)" in text and "met in 1 of 1 runs (100%)" in text


def test_a_gain_in_partial_credit_alone_is_labelled_and_not_counted(tmp_path):
    """The mean verifier score rises by the goal but the share of answers with full marks does not: the actor
    earns more partial credit (more right letters), not more right answers."""
    write_run(tmp_path / "spell-1", {"sampled": {"all": 0.25}, "greedy": {"all": 0.35, "solved": 0.12}},
              {"sampled": stats(0.1, 90, 0.02), "greedy": stats(0.1, 95, 0.02)})
    text = table([tmp_path / "spell-1"], "Panel")
    assert "| 0.100 -> 0.120 |" in text and text.rstrip().endswith("met in 0 of 1 runs (0%).")
    assert "| partial credit |" in text
