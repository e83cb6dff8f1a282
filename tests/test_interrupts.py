"""SIGINT, SIGTERM and SIGHUP, as a user, a scheduler or a closed terminal sends them: every entry point ends in one
line `interrupted: <signal>[; resume with --resume]` and exit 128 + the signal's number (130, 143, 129), no
traceback (the hint only once there is a checkpoint to resume from); a
checkpoint being written when the signal comes is finished first; the output folder is left resumable (complete
checkpoints only, the lock released); train.py passes the signal on to the step it runs and waits for it, so no
step trains on as an orphan."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import train
from processes import REPO, subprocess_env
from utils.runtime.errors import INTERRUPT_SIGNALS

STEP1 = REPO / "training" / "step1_supervised_finetuning" / "main.py"
STEP1_FLAGS = ["--data_split", "10,1000,1000", "--per_device_train_batch_size", "4", "--max_seq_len", "64",
               "--num_train_epochs", "3", "--max_steps", "60", "--print_interval", "1", "--save_steps", "5"]
EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}


def wait_for_line(stream, text, seen):
    for line in stream:
        seen.append(line)
        if text in line:
            return line
    raise AssertionError(f"{text!r} never came:\n" + "".join(seen[-40:]))


def assert_resumable(out):
    """Complete checkpoints only (no temporary folder), `latest` naming one, the lock released."""
    root = out / "checkpoints"
    names = sorted(path.name for path in root.iterdir())
    assert "latest" in names and all(name == "latest" or name.startswith("step") for name in names), names
    assert (root / (root / "latest").read_text().strip() / "COMPLETE").is_file()
    assert not (out.parent / f".{out.name}.lock").exists()


# SIGHUP to a running step, not e2e: tests/test_hostile.py (with the tools that its folder is refused to meanwhile)
@pytest.mark.parametrize("signum", [pytest.param(signal.SIGINT, marks=pytest.mark.e2e), signal.SIGTERM,
                                    pytest.param(signal.SIGHUP, marks=pytest.mark.e2e)],
                         ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_step_interrupted_ends_in_one_line_and_resumes(tmp_path, signum):
    out = tmp_path / "out"
    command = [sys.executable, str(STEP1), *STEP1_FLAGS, "--data_output_path", str(tmp_path / "data"),
               "--output_dir", str(out)]
    process = subprocess.Popen(command, cwd=REPO, env=subprocess_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    seen = []
    wait_for_line(process.stdout, "saved checkpoint", seen)
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == EXIT[signum], stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.startswith(("interrupted:", "error:"))]
    assert lines == [f"interrupted: {signal.Signals(signum).name}; resume with --resume"], stderr[-3000:]
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    assert not (out / "model.safetensors").exists()
    assert_resumable(out)
    if signum == signal.SIGTERM:
        resumed = subprocess.run([*command, "--resume"], cwd=REPO, env=subprocess_env(), capture_output=True,
                                 text=True, timeout=300)
        assert resumed.returncode == 0 and "resumed from" in resumed.stdout, resumed.stderr[-3000:]


def test_train_py_passes_sigterm_to_its_step_and_waits_for_it(tmp_path):
    """Before: the driver died and its step trained on, saving a model after the user had stopped the run."""
    out = tmp_path / "out"
    flags = " ".join([*STEP1_FLAGS, "--data_output_path", str(tmp_path / "data")])
    process = subprocess.Popen([sys.executable, "train.py", "--step", "1", "--no-eval", "--output-dir", str(out),
                                "--step1-args", flags], cwd=REPO, env=subprocess_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    step_dir = out / "actor-models" / "tiny"
    log = step_dir / "training.log"
    deadline = time.time() + 300
    while not (log.is_file() and "saved checkpoint" in log.read_text()):
        assert process.poll() is None and time.time() < deadline, process.communicate()
        time.sleep(0.5)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=180)
    assert process.returncode == 143, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.startswith(("interrupted:", "error:"))]
    assert lines == [f"interrupted: SIGTERM; step 1 stopped (its log: {log}); resume with --resume"], stderr
    assert "Traceback" not in stderr
    assert not running_with(str(out)), "the step outlived the driver"
    assert "interrupted: SIGTERM; resume with --resume" in log.read_text()  # the step's own line, in its log
    assert not (step_dir / "model.safetensors").exists()
    assert_resumable(step_dir)


def interrupt_train_py(argv, signum, monkeypatch, capsys, when):
    """(exit code, the interrupted: line) of train.main(argv) in process, its steps pretending to finish at once, the
    signal sent to itself when `when(command)` of a launched command (else at the report)."""
    def run_child(command, **kwargs):
        if when(command):
            os.kill(os.getpid(), signum)
            time.sleep(30)  # the signal's handler raises here
        if "--output_dir" in command:  # a step's last write, by which train.py knows it finished
            (Path(command[command.index("--output_dir") + 1]) / "metrics.json").write_text("{}")
        return 0

    def pipeline_report(*args, **kwargs):
        os.kill(os.getpid(), signum)
        time.sleep(30)

    monkeypatch.setattr(train, "run_child", run_child)
    monkeypatch.setattr("utils.trainer.report.pipeline_report", pipeline_report)
    with pytest.raises(SystemExit) as exit_:
        train.main(argv)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith(("interrupted:", "error:"))]
    return exit_.value.code, lines


@pytest.mark.parametrize("signum", INTERRUPT_SIGNALS, ids=lambda signum: signal.Signals(signum).name)
def test_train_py_interrupted_after_its_steps_names_what_was_running(tmp_path, signum, monkeypatch, capsys):
    """Before: `step 3 stopped (its log: ...); resume with --resume` during the closing evaluation and the report,
    when step 3 had finished and nothing was left to resume."""
    name, out = signal.Signals(signum).name, str(tmp_path / "out")
    code, lines = interrupt_train_py(["--output-dir", out, "--pair-judge", "none"], signum, monkeypatch, capsys,
                                     when=lambda command: "prompt_eval.py" in " ".join(command))
    assert code == 128 + signum
    assert lines == [f"interrupted: {name}; the closing evaluation stopped, every step having finished (its "
                     "command: the '---- evaluation:' line above)"]
    code, lines = interrupt_train_py(["--output-dir", out, "--pair-judge", "none", "--no-eval"], signum, monkeypatch,
                                     capsys,
                                     when=lambda command: False)
    assert code == 128 + signum
    assert lines == [f"interrupted: {name}; writing the report stopped, every step having finished"]


def running_with(text):
    """PIDs of the processes whose command line holds `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_chat_interrupted_while_waiting_for_input_is_one_line(tmp_path):
    process = subprocess.Popen([sys.executable, "chat.py", "--path", "tiny", "--max_new_tokens", "4"], cwd=REPO,
                               env=subprocess_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    process.stdin.write(" Human: What is 1 + 2? Assistant:\n")
    process.stdin.flush()
    assert process.stdout.readline()  # its answer: the model is loaded, and it waits for the next turn
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.startswith(("interrupted:", "error:"))]
    assert lines == ["interrupted: SIGINT"] and "Traceback" not in stderr, stderr[-3000:]
