"""The report's pictures: the history each stage's monitor writes (utils/trainer/monitor.py), the curves and the
skill scores drawn from it (utils/trainer/plots.py) as PNG files linked from the report, and the report without
matplotlib."""
import json
import sys
from argparse import Namespace

from utils.trainer.monitor import HISTORY, PARTIAL_HISTORY, Monitor, peak_memory, read_history
from utils.trainer.plots import MATPLOTLIB_MISSING, image_name, report_figures, stage_panels
from utils.trainer.report import pipeline_report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
NO_TRACKERS = Namespace(report_to=None)  # a step's flags with --report_to none: the history alone
EVALUATION = {model: {"sampled": {"all": score, "add": score / 2, "upper": 1.0}, "greedy": {"all": score}}
              for model, score in (("baseline", 0.5), ("finetune", 0.75))}


def test_the_monitor_writes_a_history_that_a_resumed_run_continues(tmp_path):
    monitor = Monitor(NO_TRACKERS, "run", tmp_path)
    monitor.write(1, "train", loss=2.0, lr=0.1)
    monitor.write(2, "train", loss=1.5, lr=0.1)
    monitor.write(2, "eval", accuracy=0.5)
    monitor.close()
    assert not (tmp_path / "tb").exists()  # TensorBoard off: the history alone
    assert not (tmp_path / HISTORY).exists()  # the run's model is not saved yet: its history is partial
    # Resumed from a checkpoint at step 1: step 2 is trained again, and its new line wins; a torn line is skipped.
    with open(tmp_path / PARTIAL_HISTORY, "a") as f:
        f.write('{"step": 3, "pre')
    resumed = Monitor(NO_TRACKERS, "run", tmp_path, resumed=True)
    resumed.write(2, "train", loss=1.25)
    resumed.publish()  # the model saved: the history is the folder's
    assert not (tmp_path / PARTIAL_HISTORY).exists()
    assert json.loads((tmp_path / HISTORY).read_text().splitlines()[0]) == {"step": 1, "prefix": "train",
                                                                             "loss": 2.0, "lr": 0.1}
    history = read_history(tmp_path)
    assert history["train"]["loss"] == [(1, 2.0), (2, 1.25)]
    assert history["eval"] == {"accuracy": [(2, 0.5)]}
    Monitor(NO_TRACKERS, "run", tmp_path).publish()  # a fresh run that wrote nothing leaves the old history alone
    assert read_history(tmp_path) == history
    failed = Monitor(NO_TRACKERS, "run", tmp_path)  # a fresh run that fails before its model is saved: the same
    failed.write(1, "train", loss=9.0)
    failed.close()
    assert read_history(tmp_path) == history
    fresh = Monitor(NO_TRACKERS, "run", tmp_path)
    fresh.write(1, "train", loss=3.0)
    fresh.publish()
    assert read_history(tmp_path) == {"train": {"loss": [(1, 3.0)]}}
    assert read_history(tmp_path / "none") == {}


def test_peak_memory_is_reported_on_cuda_only():
    import torch

    assert ("peak_memory_gib" in peak_memory()) == torch.cuda.is_available()


def write_history(folder, lines):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / HISTORY).write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_a_stage_gets_the_panels_it_has_data_for(tmp_path):
    write_history(tmp_path, [{"step": 1, "prefix": "ppo", "score": 0.1, "kl": 0.0, "answer_length": 5.0},
                             {"step": 2, "prefix": "ppo", "score": 0.3, "kl": 0.1, "answer_length": 6.0},
                             {"step": 2, "prefix": "eval_greedy", "all": 0.4}])
    panels = stage_panels(read_history(tmp_path))
    assert [title for title, _, _ in panels] == ["score / reward", "KL to the reference (nats per answer)",
                                                 "answer length (tokens)", "accuracy / held-out score"]
    assert panels[0][1] == [("ppo/score", (1, 2), (0.1, 0.3))]
    assert image_name("dpo@2") == "report-dpo-round2.png"


def test_the_report_links_each_stages_curves_and_the_skill_scores_as_png_files(tmp_path):
    sft, rl, empty = tmp_path / "sft", tmp_path / "rl", tmp_path / "reward"
    write_history(sft, [{"step": step, "prefix": "train", "loss": 3.0 / step} for step in (1, 2, 3)]
                  + [{"step": 0, "prefix": "eval", "perplexity": 300.0}, {"step": 3, "prefix": "eval",
                                                                          "perplexity": 20.0}])
    write_history(rl, [{"step": 1, "prefix": "ppo", "score": 0.2, "kl": 0.01}])
    empty.mkdir()
    out = tmp_path / "out"
    report = pipeline_report({"sft": sft, "reward": empty, "rl": rl}, {}, EVALUATION, figures_dir=out)
    links = [line for line in report.splitlines() if line.startswith("![")]
    assert [line.split("(")[-1].rstrip(")") for line in links] == ["report-sft.png", "report-rl.png",
                                                                     "report-skills.png"]
    for name in ("report-sft.png", "report-rl.png", "report-skills.png"):
        assert (out / name).read_bytes().startswith(PNG_SIGNATURE), name
    assert not (out / "report-reward.png").exists()  # no history, no picture
    assert "![" not in pipeline_report({"sft": sft}, {}, EVALUATION)  # no figures_dir: no pictures


def test_without_matplotlib_the_report_says_so_and_draws_nothing(tmp_path, monkeypatch):
    write_history(tmp_path / "sft", [{"step": 1, "prefix": "train", "loss": 1.0}])
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    assert report_figures({"sft": tmp_path / "sft"}, EVALUATION, tmp_path / "out") == [MATPLOTLIB_MISSING]
    report = pipeline_report({"sft": tmp_path / "sft"}, {}, EVALUATION, figures_dir=tmp_path / "out")
    assert report.rstrip().endswith(MATPLOTLIB_MISSING)
    assert not list(tmp_path.rglob("*.png"))
