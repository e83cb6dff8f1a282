"""Resumable training end to end, through the real CLIs on the built-in tiny default: each step (and DPO), killed
with SIGKILL after its first checkpoint and resumed with --resume, ends with the very weights (bitwise) and metrics
of an uninterrupted run of the same seed; a non-finite loss ends in one `error:` line, saves no model and leaves the
last checkpoint as it was; train.py passes --save-steps and --resume on to every step."""
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from processes import subprocess_env
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[2]
STEP1 = REPO / "training" / "step1_supervised_finetuning"
STEP2 = REPO / "training" / "step2_reward_model_finetuning"
STEP3 = REPO / "training" / "step3_rlhf_finetuning"
DPO = REPO / "training" / "step2_dpo_finetuning"
KTO = REPO / "training" / "step2_kto_finetuning"
SAVED = re.compile(r"saved checkpoint (\S+)")

# --data_split gives each step a small part of the built-in data (about 100 rows), so three epochs take seconds
# and the runs below cross epoch boundaries after the kill.
STEP1_FLAGS = ["--data_split", "10,1000,1000", "--per_device_train_batch_size", "4", "--per_device_eval_batch_size",
               "8", "--max_seq_len", "64", "--num_train_epochs", "3", "--max_steps", "60", "--print_interval", "10"]
STEP2_FLAGS = ["--data_split", "1000,10,1000", "--per_device_train_batch_size", "4", "--per_device_eval_batch_size",
               "8", "--max_seq_len", "64", "--num_train_epochs", "3", "--max_steps", "60", "--eval_interval", "25",
               "--print_interval", "10"]
# DPO from the (untrained) tiny model, its reference scoring each batch.
DPO_FLAGS = [*STEP2_FLAGS, "--learning_rate", "1e-3", "--beta", "0.5"]
# KTO likewise, a pair as two labelled answers, the reference and the batch's KL estimate scoring each batch; ORPO:
# DPO's stage with its reference-free loss.
KTO_FLAGS = [*STEP2_FLAGS, "--learning_rate", "1e-3", "--beta", "0.5", "--desirable_weight", "1.2"]
ORPO_FLAGS = [*STEP2_FLAGS, "--learning_rate", "1e-3", "--loss_type", "orpo", "--beta", "0.5"]
# Step 3 with every piece of PPO state in play: two rounds of generation batches, two PPO epochs (the minibatch
# shuffler), EMA, the unsupervised loss (its batch cycle), the adaptive KL controller and reward normalisation.
STEP3_FLAGS = ["--data_split", "1000,1000,5", "--per_device_generation_batch_size", "4",
               "--per_device_training_batch_size", "2", "--generation_batches", "2", "--ppo_epochs", "2",
               "--max_prompt_seq_len", "32", "--max_answer_seq_len", "8", "--num_warmup_steps", "0",
               "--num_train_epochs", "3", "--max_steps", "24", "--enable_ema", "--unsupervised_dataset_name", "builtin",
               "--adaptive_kl_target", "0.5", "--adaptive_kl_horizon", "100", "--print_interval", "4"]


def run(command, timeout=300):
    result = subprocess.run(command, cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=timeout)
    return result


def run_ok(command):
    result = run(command)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def run_until_checkpoint_then_kill(command):
    """Start `command` in its own process group, wait for its log to report a saved checkpoint, then SIGKILL the
    whole group (the launcher and every rank). Returns the log up to the kill and the checkpoint's path."""
    process = subprocess.Popen(command, cwd=REPO, env=subprocess_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    log, checkpoint = [], None
    try:
        for line in process.stdout:
            log.append(line)
            match = SAVED.search(line)
            if match:
                checkpoint = match.group(1)
                os.killpg(process.pid, signal.SIGKILL)
                break
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=60)
    assert checkpoint, "".join(log[-50:])
    assert process.returncode == -signal.SIGKILL
    return "".join(log), checkpoint


def safetensors_files(folder):
    return sorted(path.relative_to(folder) for path in Path(folder).rglob("*.safetensors")
                  if "checkpoints" not in path.parts)


def assert_same_weights(folder_a, folder_b):
    """Every safetensors file of the two output folders holds the same tensors, bit for bit."""
    files = safetensors_files(folder_a)
    assert files and files == safetensors_files(folder_b)
    for name in files:
        a, b = load_file(Path(folder_a) / name), load_file(Path(folder_b) / name)
        assert a.keys() == b.keys(), name
        for key in a:
            assert a[key].dtype == b[key].dtype and a[key].equal(b[key]), f"{name}: {key} differs"


def assert_same_metrics(folder_a, folder_b):
    a, b = (json.loads((Path(folder) / "metrics.json").read_text()) for folder in (folder_a, folder_b))
    a.pop("wall_time_s"), b.pop("wall_time_s")
    assert a == b


def check_kill_and_resume(main_command, reference_dir, resumed_dir, save_steps):
    """Uninterrupted run into `reference_dir`; the same run with checkpoints into `resumed_dir`, killed after its
    first checkpoint and resumed; both must end with the same weights and metrics."""
    run_ok([*main_command, "--output_dir", str(reference_dir)])
    with_checkpoints = [*main_command, "--output_dir", str(resumed_dir), "--save_steps", str(save_steps)]
    _, checkpoint = run_until_checkpoint_then_kill(with_checkpoints)
    assert not (resumed_dir / "metrics.json").exists()  # killed before the end
    log = run_ok([*with_checkpoints, "--resume"])
    resumed_step = int(re.search(r"resumed from \S+ \(step (\d+)\)", log).group(1))
    assert resumed_step >= save_steps and Path(checkpoint).name.startswith("step")
    assert_same_weights(reference_dir, resumed_dir)
    assert_same_metrics(reference_dir, resumed_dir)
    return log


def test_step1_killed_and_resumed_equals_an_uninterrupted_run(tmp_path):
    main = [sys.executable, str(STEP1 / "main.py"), *STEP1_FLAGS, "--data_output_path", str(tmp_path / "data")]
    log = check_kill_and_resume(main, tmp_path / "reference", tmp_path / "resumed", save_steps=10)
    checkpoints = tmp_path / "resumed" / "checkpoints"
    # The last step is always saved; --save_total_limit 2 keeps the newest two; `latest` names the newest.
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest", "step50", "step60"]
    assert (checkpoints / "latest").read_text().strip() == "step60"
    assert "eval before training" not in log  # the resumed run takes its first eval from the checkpoint


def test_step2_killed_and_resumed_equals_an_uninterrupted_run(tmp_path):
    """With --load_best_model_at_end: the kill comes after the evaluation at step 25, so the weights it kept
    travel in the checkpoint of step 30 (best.safetensors) and the resumed run chooses as the first would."""
    main = [sys.executable, str(STEP2 / "main.py"), *STEP2_FLAGS, "--load_best_model_at_end",
            "--data_output_path", str(tmp_path / "data")]
    check_kill_and_resume(main, tmp_path / "reference", tmp_path / "resumed", save_steps=30)
    assert (tmp_path / "resumed" / "checkpoints" / "step30" / "best.safetensors").is_file()
    assert json.loads((tmp_path / "resumed" / "metrics.json").read_text())["saved_best"]["step"] in (25, 50, 60)


@pytest.mark.e2e  # slow (~1 min each on a quiet 2-core CPU): run with -m e2e
def test_dpo_killed_and_resumed_equals_an_uninterrupted_run(tmp_path):
    main = [sys.executable, str(DPO / "main.py"), *DPO_FLAGS, "--data_output_path", str(tmp_path / "data")]
    check_kill_and_resume(main, tmp_path / "reference", tmp_path / "resumed", save_steps=10)


@pytest.mark.e2e
@pytest.mark.parametrize("script, flags", [(KTO, KTO_FLAGS), (DPO, ORPO_FLAGS)], ids=["kto", "orpo"])
def test_kto_and_orpo_killed_and_resumed_equal_an_uninterrupted_run(script, flags, tmp_path):
    main = [sys.executable, str(script / "main.py"), *flags, "--data_output_path", str(tmp_path / "data")]
    check_kill_and_resume(main, tmp_path / "reference", tmp_path / "resumed", save_steps=10)


def test_step3_killed_and_resumed_equals_an_uninterrupted_run(step3_model_dirs, tmp_path):
    actor_dir, critic_dir = step3_model_dirs
    main = [sys.executable, str(STEP3 / "main.py"), "--actor_model_name_or_path", str(actor_dir),
            "--critic_model_name_or_path", str(critic_dir), *STEP3_FLAGS, "--data_output_path", str(tmp_path / "data")]
    check_kill_and_resume(main, tmp_path / "reference", tmp_path / "resumed", save_steps=4)
    for name in ("actor", "critic", "actor_ema"):
        assert (tmp_path / "resumed" / name / "model.safetensors").is_file()


# Step 3 without a critic: GRPO groups of two answers, scored by a reward function of the user's (the built-in
# checker gives a random actor's answers all the same score), the KL loss, the NLL of answers scored 1 or 2,
# clip-higher, equal groups dropped and rounds refilled from up to 3 prompt batches (dynamic sampling: the data
# position is the batches drawn), an entropy bonus steered by a target above the tiny actor's entropy (its
# coefficient rises every round: checkpointed state) and evaluations on held-out prompts, in the metrics.
CRITIC_FREE_FLAGS = [*STEP3_FLAGS, "--per_device_generation_batch_size", "2", "--advantage_estimator", "grpo",
                     "--num_samples_per_prompt", "2", "--use_kl_loss", "--kl_loss_coef", "0.1", "--positive_nll_coef",
                     "0.5", "--cliprange_high", "0.28", "--filter_zero_variance", "--max_generation_batches", "3",
                     "--target_entropy", "50", "--entropy_coef_step", "0.01", "--eval_interval", "4",
                     "--eval_prompts", "4", "--max_steps", "12"]
LENGTH_REWARD = "def score(prompts, answers):\n    return [len(answer) % 3 for answer in answers]\n"


@pytest.mark.e2e  # slow (~1 min each on a quiet 2-core CPU): run with -m e2e
def test_step3_critic_free_killed_and_resumed_equals_an_uninterrupted_run(step3_model_dirs, tmp_path):
    from transformers import AutoModelForCausalLM

    reward_file = tmp_path / "length_reward.py"
    reward_file.write_text(LENGTH_REWARD)
    actor_dir = step3_model_dirs[0]
    main = [sys.executable, str(STEP3 / "main.py"), "--actor_model_name_or_path", str(actor_dir), *CRITIC_FREE_FLAGS,
            "--reward_fn", f"{reward_file}:score", "--data_output_path", str(tmp_path / "data")]
    log = check_kill_and_resume(main, tmp_path / "reference", tmp_path / "resumed", save_steps=4)
    resumed = tmp_path / "resumed"
    assert sorted(p.name for p in resumed.iterdir() if p.is_dir()) == ["actor", "actor_ema", "checkpoints"]
    checkpoint = resumed / "checkpoints" / (resumed / "checkpoints" / "latest").read_text().strip()
    assert (checkpoint / "actor").is_dir() and not (checkpoint / "critic").exists()
    assert "eval at step 8 (4 held-out prompts)" in log and "zero_variance_groups=" in log
    assert max(float(drawn) for drawn in re.findall(r"drawn_batches=([0-9.]+)", log)) > 1  # rounds were refilled
    coefs = [float(coef) for coef in re.findall(r"entropy_coef=([0-9.e-]+)", log)]
    assert coefs[0] < coefs[-1]  # the bonus rose with the rounds
    metrics = json.loads((resumed / "metrics.json").read_text())
    assert {"heldout_sampled_start", "heldout_greedy_end"} <= set(metrics)
    start = AutoModelForCausalLM.from_pretrained(actor_dir).state_dict()
    trained = AutoModelForCausalLM.from_pretrained(resumed / "actor").state_dict()
    assert any(not torch.equal(start[name], trained[name]) for name in start)  # the run trained the actor


@pytest.mark.e2e
def test_step1_two_processes_zero2_killed_and_resumed_equals_an_uninterrupted_run(tmp_path):
    """Every rank writes its own optimizer partition and position file; rank 0 renames after a barrier."""
    script = STEP1 / "training_scripts" / "single_node" / "run.sh"
    flags = [*STEP1_FLAGS, "--max_steps", "30"]  # two ranks share the batches: three epochs are 39 steps
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    data = ["--data_output_path", str(tmp_path / "data")]
    run_ok(["bash", str(script), "--output_dir", str(reference), "--zero_stage", "2", "--model_name_or_path", "tiny",
            *flags, *data])
    with_checkpoints = ["bash", str(script), "--output_dir", str(resumed), "--zero_stage", "2", "--model_name_or_path",
                        "tiny", *flags, *data, "--save_steps", "5"]
    _, checkpoint = run_until_checkpoint_then_kill(with_checkpoints)
    assert {"position_rank0.json", "position_rank1.json"} <= {p.name for p in Path(checkpoint).iterdir()}
    log = run_ok([*with_checkpoints, "--resume"])
    assert "resumed from" in log and "2 process(es)" in log
    assert_same_weights(reference, resumed)
    assert_same_metrics(reference, resumed)


def test_a_second_run_on_the_same_output_dir_stops_at_once_naming_the_first(tmp_path):
    """Two step-1 runs with checkpoints on one --output_dir: the second ends in one line naming the first's PID,
    and the first, undisturbed, finishes with its checkpoints. (The first is paused while the second starts, so
    it cannot finish first on a fast machine.)"""
    out = tmp_path / "out"
    command = [sys.executable, str(STEP1 / "main.py"), *STEP1_FLAGS, "--max_steps", "10", "--data_output_path",
               str(tmp_path / "data"), "--output_dir", str(out), "--save_steps", "5"]
    first = subprocess.Popen(command, cwd=REPO, env=subprocess_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    log = []
    for line in first.stdout:
        log.append(line)
        if SAVED.search(line):
            first.send_signal(signal.SIGSTOP)
            try:
                second = run(command)
            finally:
                first.send_signal(signal.SIGCONT)
            break
    log += first.stdout.readlines()
    assert first.wait(timeout=300) == 0, "".join(log[-30:])
    errors = [line for line in second.stderr.splitlines() if line.startswith("error:")]
    assert second.returncode == 2 and len(errors) == 1, second.stderr[-2000:]
    assert f"--output_dir {out} is in use by another run (PID {first.pid}," in errors[0]
    assert "Traceback" not in second.stderr
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["latest", "step10", "step5"]


def test_resume_with_other_training_flags_stops_naming_each_and_touches_nothing(tmp_path):
    """Another batch size, learning rate and a --max_steps below the checkpoint's step: one line naming all three,
    nothing written. Changing only flags of the README's 'may change' list resumes."""
    out = tmp_path / "out"
    command = [sys.executable, str(STEP1 / "main.py"), *STEP1_FLAGS, "--max_steps", "10", "--data_output_path",
               str(tmp_path / "data"), "--output_dir", str(out), "--save_steps", "5"]
    run_ok(command)
    before = folder_digest(out)
    changed = run([*command, "--resume", "--per_device_train_batch_size", "8", "--learning_rate", "2e-3",
                   "--max_steps", "4"])
    errors = [line for line in changed.stderr.splitlines() if line.startswith("error:")]
    assert changed.returncode == 2 and len(errors) == 1 and "Traceback" not in changed.stderr, changed.stderr
    for difference in ("--per_device_train_batch_size 4 (now 8)", "--learning_rate 0.001 (now 0.002)",
                       "--max_steps 10 (now 4)"):
        assert difference in errors[0]
    assert folder_digest(out) == before
    log = run_ok([*command, "--resume", "--save_steps", "3", "--print_interval", "1", "--data_output_path",
                  str(tmp_path / "other")])
    assert "resumed from" in log and "(step 10)" in log


def test_resume_on_data_changed_at_the_same_path_stops_naming_it(tmp_path):
    """Before: a data file rewritten under the same name between the run and its --resume trained on from the
    checkpoint's position in the other data, silently. The checkpoint records a digest of the step's samples."""
    data = tmp_path / "pairs.jsonl"

    def write_data(answer):
        data.write_text("".join(json.dumps({"prompt": f"Human: what is {i} + 1? Assistant:",
                                            "chosen": f" {answer(i)}", "rejected": " no"}) + "\n" for i in range(60)))

    write_data(lambda i: i + 1)
    out = tmp_path / "out"
    command = [sys.executable, str(STEP1 / "main.py"), "--data_path", str(data), "--data_split", "10,0,0",
               "--per_device_train_batch_size", "4", "--max_seq_len", "32", "--max_steps", "6", "--data_output_path",
               str(tmp_path / "cache"), "--output_dir", str(out), "--save_steps", "3"]
    run_ok(command)
    write_data(lambda i: i + 2)  # the same rows, other answers
    changed = run([*command, "--resume"])
    errors = [line for line in changed.stderr.splitlines() if line.startswith("error:")]
    assert changed.returncode == 2 and len(errors) == 1 and "Traceback" not in changed.stderr, changed.stderr
    assert "the data's samples (sha256): " in errors[0] and "(now " in errors[0], errors[0]
    write_data(lambda i: i + 1)  # back as it was: resumes
    assert "(step 6)" in run_ok([*command, "--resume"])


def folder_digest(folder):
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(Path(folder).rglob("*")) if p.is_file()}


def test_a_non_finite_loss_stops_with_one_error_line_and_keeps_the_last_checkpoint(tmp_path):
    """A learning rate of 1e30 (after one warm-up step at 0) blows the weights up: the loss of step 3 is NaN. In
    fp32: in bf16 (auto on a CPU with native bf16) weights of 1e30 are still finite and DeepSpeed's bf16 optimizer
    leaves the loss finite too."""
    out = tmp_path / "out"
    command = [sys.executable, str(STEP1 / "main.py"), *STEP1_FLAGS, "--data_output_path", str(tmp_path / "data"),
               "--output_dir", str(out), "--learning_rate", "1e30", "--lr_scheduler_type", "constant_with_warmup",
               "--num_warmup_steps", "3", "--print_interval", "1", "--save_steps", "2", "--dtype", "fp32"]
    process = subprocess.Popen(command, cwd=REPO, env=subprocess_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    log, checkpoint, digest = [], None, None
    for line in process.stdout:
        log.append(line)
        if SAVED.search(line) and checkpoint is None:  # its bytes as soon as it is reported complete
            checkpoint = Path(SAVED.search(line).group(1))
            digest = folder_digest(checkpoint)
    process.wait(timeout=300)
    log = "".join(log)
    errors = [line for line in log.splitlines() if line.startswith("error: ")]
    assert process.returncode == 2, log[-3000:]
    assert len(errors) == 1 and re.search(r"the training loss is (nan|inf)", errors[0]), errors
    assert "Traceback" not in log
    assert not (out / "model.safetensors").exists() and not (out / "metrics.json").exists()  # no model saved
    root = out / "checkpoints"
    assert checkpoint == root / "step2"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step2"]  # no half-written folder either
    assert (root / "latest").read_text().strip() == "step2"
    assert folder_digest(checkpoint) == digest  # untouched since it was written


def test_a_failed_run_into_a_folder_keeps_the_earlier_model_and_its_history(tmp_path):
    """A step run again into the folder of an earlier one and failing (a NaN loss, in fp32 as above) leaves that
    folder's model, metrics and history.jsonl as they were; its own history stays partial beside them."""
    out = tmp_path / "out"
    base = [sys.executable, str(STEP1 / "main.py"), *STEP1_FLAGS, "--data_output_path", str(tmp_path / "data"),
            "--output_dir", str(out), "--dtype", "fp32", "--max_steps", "4", "--print_interval", "1"]
    run_ok(base)
    before = folder_digest(out)
    assert "history.jsonl" in before and "history.jsonl.partial" not in before
    result = run([*base, "--learning_rate", "1e30", "--lr_scheduler_type", "constant_with_warmup",
                  "--num_warmup_steps", "3"])
    assert result.returncode == 2 and "the training loss is" in result.stdout + result.stderr
    after = folder_digest(out)
    assert (out / "history.jsonl.partial").read_text().count("\n") >= 1  # the failed run's, beside the kept ones
    assert {name: digest for name, digest in after.items() if name != "history.jsonl.partial"} == before


def test_train_py_passes_save_steps_resume_and_overwrite_to_every_step():
    # --pair-judge none: the training steps alone (the judged pairs' sampling is a script without checkpoints)
    result = run([sys.executable, "train.py", "--dry-run", "--pair-judge", "none", "--save-steps", "50", "--resume"])
    assert result.returncode == 0, result.stderr
    step_lines = result.stdout.splitlines()[:3]
    assert all("--save_steps 50 --resume" in line for line in step_lines), step_lines
    overwrite = run([sys.executable, "train.py", "--dry-run", "--pair-judge", "none",
                     "--overwrite-output-dir"]).stdout.splitlines()[:3]
    assert all(line.endswith("--overwrite_output_dir") for line in overwrite), overwrite
    plain = run([sys.executable, "train.py", "--dry-run", "--pair-judge", "none"]).stdout
    assert "--save_steps" not in plain and "--resume" not in plain and "--overwrite_output_dir" not in plain


@pytest.mark.e2e
def test_step3_keeping_the_best_actor_killed_and_resumed_equals_an_uninterrupted_run(step3_model_dirs, tmp_path):
    """--load_best_model_at_end: the best weights so far travel in each checkpoint (best.safetensors), so the
    resumed run saves the same actor whichever side of the checkpoint its best evaluation fell on."""
    reward_file = tmp_path / "length_reward.py"
    reward_file.write_text(LENGTH_REWARD)
    flags = [flag for flag in CRITIC_FREE_FLAGS if flag != "--enable_ema"]
    main = [sys.executable, str(STEP3 / "main.py"), "--actor_model_name_or_path", str(step3_model_dirs[0]), *flags,
            "--load_best_model_at_end", "--reward_fn", f"{reward_file}:score",
            "--data_output_path", str(tmp_path / "data")]
    log = check_kill_and_resume(main, tmp_path / "reference", tmp_path / "resumed", save_steps=4)
    checkpoint = tmp_path / "resumed" / "checkpoints"
    assert (checkpoint / (checkpoint / "latest").read_text().strip() / "best.safetensors").is_file()
    assert "validation prompts" in log
