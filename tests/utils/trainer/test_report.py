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
