"""Tests of utils/trainer/report.py's score table: one column per group the checker scored."""
from utils.trainer.report import skill_table


def test_the_score_table_has_a_column_per_group_the_checker_scored():
    builtin = {"sampled": {"all": 0.5, "add": 0.1, "reverse": 0.2, "capital": 0.3, "upper": 0.4, "reward": 1.0}}
    gym = {"greedy": {"all": 0.25, "chain_sum": 0.5, "gcd": 0.0}}
    header = skill_table({"baseline": builtin}).splitlines()[0]
    assert header == "| actor | decoding | all | add | reverse | capital | upper |"
    lines = skill_table({"baseline": gym, "finetune": gym}).splitlines()
    assert lines[0] == "| actor | decoding | all | chain_sum | gcd |"
    assert lines[2:] == ["| before (baseline) | greedy | 0.250 | 0.500 | 0.000 |",
                         "| after (fine-tuned) | greedy | 0.250 | 0.500 | 0.000 |"]


def test_the_report_counts_the_sampled_pairs(tmp_path):
    import json

    from utils.trainer.report import pipeline_report

    (tmp_path / "meta.json").write_text(json.dumps({"counts": {"train": {"prompts": 40, "pairs": 31,
                                                                         "mean_score": 0.75}}}))
    report = pipeline_report({"pairs": tmp_path}, {"pairs": 12.0})
    assert "| 2 sampled pairs | train pairs kept / prompts (mean judge score of the answers) | 31 / 40 (0.750) |" \
        in report
    assert "sampled pairs" not in pipeline_report({"pairs": tmp_path / "none"}, {})


def test_the_report_has_a_row_per_round_of_iterative_dpo(tmp_path):
    import json

    from utils.trainer.report import pipeline_report

    stage_dirs = {}
    for round_, (prompts, pairs, before, after) in enumerate([(40, 31, 0.5, 0.75), (40, 22, 0.6, 0.9)], start=1):
        suffix = "" if round_ == 1 else f"@{round_}"
        stage_dirs[f"pairs{suffix}"], stage_dirs[f"dpo{suffix}"] = tmp_path / f"p{round_}", tmp_path / f"d{round_}"
        stage_dirs[f"pairs{suffix}"].mkdir(), stage_dirs[f"dpo{suffix}"].mkdir()
        (stage_dirs[f"pairs{suffix}"] / "meta.json").write_text(
            json.dumps({"counts": {"train": {"prompts": prompts, "pairs": pairs, "mean_score": 0.5}}}))
        (stage_dirs[f"dpo{suffix}"] / "metrics.json").write_text(
            json.dumps({"accuracy_before": before, "accuracy_after": after}))
    rows = [line for line in pipeline_report(stage_dirs, {}).splitlines() if line.startswith("| 2 ")]
    assert rows == ["| 2 sampled pairs (round 1) | train pairs kept / prompts (mean judge score of the answers) | "
                    "31 / 40 (0.500) |",
                    "| 2 DPO (round 1) | eval preference accuracy (chosen > rejected) | 0.500 -> 0.750 |",
                    "| 2 sampled pairs (round 2) | train pairs kept / prompts (mean judge score of the answers) | "
                    "22 / 40 (0.500) |",
                    "| 2 DPO (round 2) | eval preference accuracy (chosen > rejected) | 0.600 -> 0.900 |"]


def test_the_report_names_the_loss_and_estimator_each_stage_trained_with(tmp_path, monkeypatch):
    """From the saved flags (training_settings.json of the DPO folder, of step 3's actor/), described by their
    registries' rows, a row registered later included; a flag an older run did not record gets no row."""
    import json

    from utils.rl.estimators import ESTIMATORS, Estimator
    from utils.rl.preference_losses import PREFERENCE_LOSSES
    from utils.trainer.report import pipeline_report

    dpo, rl = tmp_path / "dpo", tmp_path / "rl"
    (rl / "actor").mkdir(parents=True), dpo.mkdir()
    (dpo / "metrics.json").write_text(json.dumps({"accuracy_before": 0.5, "accuracy_after": 0.75}))
    (dpo / "training_settings.json").write_text(json.dumps({"loss_type": "ipo"}))
    (rl / "metrics.json").write_text(json.dumps({"score_start": 0.25, "score_end": 0.5}))
    (rl / "actor" / "training_settings.json").write_text(json.dumps({"advantage_estimator": "toy"}))
    monkeypatch.setitem(ESTIMATORS, "toy", Estimator(None, "a toy estimator"))
    lines = pipeline_report({"dpo": dpo, "rl": rl}, {}).splitlines()
    assert f"| 2 DPO | --loss_type | ipo: {PREFERENCE_LOSSES['ipo'].help} |" in lines
    assert "| 3 RL | --advantage_estimator | toy: a toy estimator |" in lines
    assert not [line for line in lines if "--policy_loss" in line]


def test_the_report_counts_each_stages_rows_and_steps(tmp_path):
    """Made-up metrics.json files (the counts of loop.run_counts and step 3's): the rows kept of those read, the
    eval size beside each eval figure, and the steps trained where the epochs gave fewer than --max_steps asked."""
    import json

    from utils.trainer.report import pipeline_report

    counts = {"train_rows_read": 100, "train_rows_kept": 97, "eval_rows_read": 10, "eval_rows_kept": 9,
              "steps_per_epoch": 4}
    metrics = {
        "sft": {**counts, "perplexity_before": 9.0, "perplexity_after": 3.0, "eval_rows_scored": 9,
                "steps_asked": 24, "total_steps": 8, "epochs_asked": 2},
        "dpo": {**counts, "accuracy_before": 0.5, "accuracy_after": 0.75, "eval_rows_scored": 8,
                "steps_asked": 0, "total_steps": 4, "epochs_asked": 1},
        "rl": {"train_rows_read": 40, "train_rows_kept": 40, "eval_rows_read": 5, "eval_rows_kept": 5,
               "score_start": 0.25, "score_end": 0.5, "steps_asked": 8, "total_steps": 8, "epochs_asked": 1,
               "best_step": 6, "best_validation_score": 0.625, "kl_end": None},
    }
    for stage, values in metrics.items():
        (tmp_path / stage).mkdir()
        (tmp_path / stage / "metrics.json").write_text(json.dumps(values))
    lines = pipeline_report({stage: tmp_path / stage for stage in metrics}, {}).splitlines()
    assert "| 1 SFT | eval perplexity | 9.00 -> 3.00 (9 rows) |" in lines
    assert "| 1 SFT | rows kept (train / eval) | 97 of 100 / 9 of 10 |" in lines
    assert "| 1 SFT | optimizer steps | 8 of 24 asked (2 epochs) |" in lines
    assert "| 2 DPO | eval preference accuracy (chosen > rejected) | 0.500 -> 0.750 (8 pairs) |" in lines
    assert "| 2 DPO | rows kept (train / eval) | 97 of 100 / 9 of 10 |" in lines
    assert "| 3 RL | rows kept (train / eval) | 40 of 40 / 5 of 5 |" in lines
    assert "| 3 RL | actor saved: its best validation evaluation (score) | step 6 (0.625) |" in lines
    assert "| 3 RL | KL to reference, nats per answer (last tenth) | - (no KL term: no reference model) |" in lines
    assert not [line for line in lines if "best validation" in line and not line.startswith("| 3 RL")]
    assert not [line for line in lines if "asked" in line and not line.startswith("| 1 SFT")]  # all steps trained


def test_kto_and_orpo_stages_report_their_eval_figure_and_rows_kept(tmp_path):
    """Before: report.md had no row for a KTO or ORPO stage, though each writes its counts."""
    import json

    from utils.trainer.report import pipeline_report

    counts = {"train_rows_read": 36, "train_rows_kept": 34, "eval_rows_read": 4, "eval_rows_kept": 4,
              "eval_rows_scored": 4}
    metrics = {"kto": {**counts, "loss_before": 0.5, "loss_after": 0.25},
               "orpo": {**counts, "accuracy_before": 0.25, "accuracy_after": 0.75}}
    for stage, values in metrics.items():
        (tmp_path / stage).mkdir()
        (tmp_path / stage / "metrics.json").write_text(json.dumps(values))
    lines = pipeline_report({stage: tmp_path / stage for stage in metrics}, {}).splitlines()
    assert "| 2 KTO | eval loss | 0.500 -> 0.250 (4 answers) |" in lines
    assert "| 2 ORPO | eval preference accuracy (chosen > rejected) | 0.250 -> 0.750 (4 pairs) |" in lines
    assert {"| 2 KTO | rows kept (train / eval) | 34 of 36 / 4 of 4 |",
            "| 2 ORPO | rows kept (train / eval) | 34 of 36 / 4 of 4 |"} <= set(lines)


def answer_stats(best, share, top, distinct, cut, groups=None):
    """An answer_stats entry of inference.evaluation.evaluate_models (made up): 100 answers, max_new_tokens 16."""
    return {"best_constant": {"all": best, **(groups or {})}, "best_constant_answer": {"all": top},
            "distinct_answers": {"all": distinct}, "top_answer": {"all": top}, "top_answer_share": {"all": share},
            "answers": 100, "hit_limit": cut, "max_new_tokens": 16}


def test_the_closing_evaluation_reports_the_best_constant_answer_and_what_the_answers_were():
    """before -> after per decoding: the best constant answer's score, distinct answers and the top answer's
    share, answers cut at max_new_tokens; a "best constant" row of the score table (the best over the models and
    decodings, per group), and a line under it for a model that mostly answers one thing and scores no more."""
    from utils.trainer.report import pipeline_report, skill_table

    evaluation = {
        "baseline": {"sampled": {"all": 0.3, "add": 0.2}, "greedy": {"all": 0.4, "add": 0.3},
                     "answer_stats": {"sampled": answer_stats(0.25, 0.1, " 7", 60, 5, {"add": 0.25}),
                                      "greedy": answer_stats(0.25, 0.2, " 7", 40, 3, {"add": 0.3})}},
        "finetune": {"sampled": {"all": 0.5, "add": 0.5}, "greedy": {"all": 0.5, "add": 0.5},
                     "answer_stats": {"sampled": answer_stats(0.5, 0.9, " 12", 3, 0, {"add": 0.5}),
                                      "greedy": answer_stats(0.5, 0.4, " 12", 20, 1, {"add": 0.5})}},
    }
    evaluation["baseline"]["answer_stats"]["sampled"].update(pass_at_k={"all": 0.55}, k=4)
    evaluation["finetune"]["answer_stats"]["sampled"].update(pass_at_k={"all": 0.6}, k=4)
    lines = pipeline_report({}, {}, evaluation).splitlines()
    models = "base model -> final actor"
    assert f"| eval | held-out score of the best constant answer, sampled ({models}) | 0.250 -> 0.500 |" in lines
    assert (f"| eval | held-out questions solved by one of 4 answers (pass@4), sampled ({models}) | 0.550 -> 0.600 |"
            in lines)
    assert not [line for line in lines if "pass@" in line and "greedy" in line]  # one answer: no pass@k row
    assert f"| eval | distinct answers / top answer's share, sampled ({models}) | 60 / 10% -> 3 / 90% |" in lines
    assert f"| eval | answers cut at max_new_tokens (16), greedy ({models}) | 3 -> 1 of 100 |" in lines
    table = skill_table(evaluation).splitlines()
    assert table[0] == "| actor | decoding | all | add |"
    assert table[2:7] == ["| before (baseline) | sampled | 0.300 | 0.200 |",
                          "| before (baseline) | greedy | 0.400 | 0.300 |",
                          "| after (fine-tuned) | sampled | 0.500 | 0.500 |",
                          "| after (fine-tuned) | greedy | 0.500 | 0.500 |",
                          "| best constant | - | 0.500 | 0.500 |"]
    # greedy gives 20 different answers (top share 40%): a score at the constant's is not flagged there
    assert table[7:] == ["", "after (fine-tuned), sampled: 90% of the answers are ' 12' and the score 0.500 is not "
                             "above the best constant answer's, 0.500 (' 12' to every question): the gain is a "
                             "constant answer, not the skill."]
    # an evaluation written without answer_stats (an older run) has the scores alone
    plain = {name: {d: result[d] for d in ("sampled", "greedy")} for name, result in evaluation.items()}
    assert not [line for line in pipeline_report({}, {}, plain).splitlines() if "constant" in line or "cut" in line]


def test_an_evaluation_with_tools_reports_the_score_without_and_the_tool_use(tmp_path):
    """The closing evaluation with --tools: rows for the score without the tool and for the calls, before -> after;
    the skill table keeps to the groups (no tool columns)."""
    from utils.trainer.report import pipeline_report

    def scores(all_, without, rate):
        return {"all": all_, "basic_arithmetic": all_, "all_without_tools": without, "tool_calls": rate,
                "tool_call_rate": rate, "tool_success_rate": 1.0}

    evaluation = {"baseline": {"sampled": scores(0.2, 0.05, 0.5), "greedy": scores(0.3, 0.1, 0.6)},
                  "finetune": {"sampled": scores(0.4, 0.06, 0.9), "greedy": scores(0.5, 0.1, 1.0)}}
    report = pipeline_report({"sft": tmp_path / "a", "rl": tmp_path / "b"}, {}, evaluation)
    assert "| eval | held-out checker score without the tool, sampled (step-1 -> final actor) | 0.050 -> 0.060 |" \
        in report
    assert "| eval | answers calling the tool, greedy (step-1 -> final actor) | 0.600 -> 1.000 |" in report
    assert "| actor | decoding | all | basic_arithmetic |" in report


def test_without_a_checker_the_report_has_the_reward_rows_and_no_empty_score_table():
    from utils.trainer.report import pipeline_report, skill_table

    scored = {"sampled": {"reward": 1.2}, "greedy": {"reward": 1.3}}
    evaluation = {"baseline": scored, "finetune": {"sampled": {"reward": 1.4}, "greedy": {"reward": 1.5}}}
    assert skill_table(evaluation) == ""
    lines = pipeline_report({}, {}, evaluation).splitlines()
    assert "| eval | held-out reward-model score, greedy (base model -> final actor) | 1.300 -> 1.500 |" in lines
    assert not [line for line in lines if line.startswith("| actor |")]
