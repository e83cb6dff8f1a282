"""scripts/seed_table.py: the docs' seed tables made from runs' own evaluation.json and report.md."""
import json

from scripts.seed_table import table


def write_run(folder, sampled, greedy, seed):
    folder.mkdir()
    skills = {"add": 0.9, "upper": 0.8}
    evaluation = {"baseline": {"sampled": {"all": 0.5, **skills}, "greedy": {"all": 0.9, **skills}},
                  "finetune": {"sampled": {"all": sampled, **skills},
                               "greedy": {"all": greedy, "add": 0.9 + greedy - 0.9, "upper": 0.8 - 0.02}}}
    (folder / "evaluation.json").write_text(json.dumps(evaluation))
    (folder / "report.md").write_text(f"Measured by `python train.py --seed {seed}`:\n\n| step | measure | value |\n")


def test_the_header_names_the_runs_cpu_and_commit_from_their_reports(tmp_path):
    from utils.runtime.provenance import code_commit

    for seed, commit in ((1, "abc1234"), (2, "abc1234"), (3, None)):
        write_run(tmp_path / f"s{seed}", 0.6, 0.9, seed)
        if commit:
            with open(tmp_path / f"s{seed}" / "report.md", "a") as report:
                report.write(f"| all | code commit | {commit} |\n| all | CPU | Some CPU, native bf16 |\n")
    named = table([tmp_path / "s1", tmp_path / "s2"], "Named")
    assert "CPU: Some CPU, native bf16; commit: abc1234." in named
    mixed = table([tmp_path / "s1", tmp_path / "s3"], "Mixed")
    assert f"commit: abc1234, {code_commit()} (where a run does not say: the table's)." in mixed


def test_rows_mean_spread_and_worst_skill_come_from_the_runs(tmp_path):
    write_run(tmp_path / "s1", 0.65, 0.95, 1)
    write_run(tmp_path / "s2", 0.75, 0.93, 2)
    text = table([tmp_path / "s1", tmp_path / "s2"], "Two seeds")
    assert text.startswith("### Two seeds")
    assert "`python train.py --seed 1`" in text and "commit:" in text and "CPU:" in text
    assert "| s1 | 0.500 -> 0.650 (+0.150) | 0.900 -> 0.950 (+0.050) | upper -0.020 |" in text
    assert "| s2 | 0.500 -> 0.750 (+0.250) |" in text
    # mean +0.200, sample sd of (0.15, 0.25) = 0.0707
    assert "| mean of 2 | +0.200 (sd 0.071) | +0.040 | lowest -0.020 |" in text


def test_report_rows_add_columns_and_a_run_without_skills_shows_none(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    scores = {"sampled": {"all": 0.1}, "greedy": {"all": 0.2}}
    (folder / "evaluation.json").write_text(json.dumps({"baseline": scores, "finetune": scores}))
    (folder / "report.md").write_text("Measured by `python train.py`:\n\n| step | measure | value |\n|---|---|---|\n"
                                      "| rl | wall time | 90 s |\n| all | wall time | 100 s |\n"
                                      "| 3 RL | steps (prompt batches), stopped early | 7 of 9: idle |\n")
    text = table([folder], "Mine", ["steps (prompt batches)", "all: wall time", "no such row"])
    assert ("| run | sampled | greedy | worst greedy skill | steps (prompt batches) | all: wall time | no such row |"
            in text)
    assert "| mine | 0.100 -> 0.100 (+0.000) | 0.200 -> 0.200 (+0.000) | - | 7 of 9: idle | 100 s | - |" in text
    assert "| mean of 1 | +0.000 | +0.000 | - | | | |" in text
