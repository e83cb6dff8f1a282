"""Tests of utils/trainer/checkpoint.py in this process: which folder `--resume` picks (never a half-written one), when a
checkpoint is due, a save/resume round trip of a real DeepSpeed engine that then trains on identically, the
newest --save_total_limit kept, a failed save or non-finite weights leaving the last checkpoint as it was, and
a TrainingPosition that resumes the same batches and the same random draws across an epoch boundary."""
import hashlib
import json
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest
import torch
from processes import subprocess_env
from transformers import AutoModelForCausalLM

from utils.data.data_utils import DataCollatorSFT, ListDataset, make_dataloader
from utils.runtime.ds_utils import get_train_ds_config
from utils.runtime.errors import ChatRLHFError, ConfigError, _run_exit_callbacks
from utils.trainer.checkpoint import (COMPLETE, LATEST, Checkpointer, TrainingPosition, claim_output_dir, file_manifest,
                                      is_complete, json_shape_problem, latest_checkpoint, rng_state, set_rng_state,
                                      verify_checkpoint)
from utils.trainer.engine import init_train_engine


def make_checkpoint(root, name, complete=True):
    path = root / name
    (path / "model").mkdir(parents=True)
    if complete:
        (path / COMPLETE).write_text("done\n")
    return path


def test_latest_checkpoint_follows_the_pointer_and_never_picks_a_half_written_folder(tmp_path):
    root = tmp_path / "checkpoints"
    assert latest_checkpoint(root) is None  # no folder at all
    root.mkdir()
    step5 = make_checkpoint(root, "step5")
    make_checkpoint(root, "step9", complete=False)            # killed before its marker: not a checkpoint
    make_checkpoint(root, ".step12.k2x9.tmp")                 # a temporary folder, even with a marker
    assert latest_checkpoint(root) == step5                   # no pointer: the complete one of highest step
    (root / LATEST).write_text("step9\n")
    assert latest_checkpoint(root) == step5                   # the pointer names an incomplete folder
    step7 = make_checkpoint(root, "step7")
    (root / LATEST).write_text("step5\n")
    assert latest_checkpoint(root) == step5                   # a valid pointer wins over a higher step
    (root / LATEST).write_text("step7\n")
    assert latest_checkpoint(root) == step7


def due_steps(save_steps, total_steps, steps_per_round=1):
    checkpointer = Checkpointer("unused", save_steps, 2, engines={}, position=None)
    due = []
    for step in range(steps_per_round, total_steps + 1, steps_per_round):
        if checkpointer.due(step, total_steps):
            due.append(step)
            checkpointer.last_step = step  # what a save does
    return due


def test_a_checkpoint_is_due_every_save_steps_and_at_the_last_step():
    assert due_steps(4, 10) == [4, 8, 10]
    assert due_steps(5, 10) == [5, 10]
    assert due_steps(0, 10) == []
    # Step 3 with --generation_batches 2: at the first round end at or after each multiple of 3.
    assert due_steps(3, 12, steps_per_round=2) == [4, 6, 10, 12]


# --------------------------------------------------------------------------- a real engine


@pytest.fixture()
def make_engine(distributed, small_config):
    def make(seed=0):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(small_config("llama"))
        config = get_train_ds_config(micro_batch_size=2, gradient_accumulation_steps=1, world_size=1, dtype="fp32",
                                     stage=0)
        return init_train_engine(model, ds_config=config, learning_rate=1e-2, weight_decay=0.0,
                                 lora_learning_rate=None, offload=False, lr_scheduler_type="cosine",
                                 num_warmup_steps=2, num_training_steps=20)

    return make


def make_loader(rows=10, batch_size=2, seed=3):
    dataset = ListDataset([{"input_ids": [4 + i, 5 + i, 6 + i], "labels": [4 + i, 5 + i, 6 + i]}
                           for i in range(rows)])
    return make_dataloader(dataset, DataCollatorSFT(0), batch_size, True, seed)


def train_step(engine, batch):
    loss = engine(**batch, use_cache=False).loss
    engine.backward(loss)
    engine.step()


def parameters(engine):
    return {name: param.detach().clone() for name, param in engine.module.named_parameters()}


def test_save_then_resume_restores_engine_data_position_and_state(make_engine, tmp_path):
    engine, position = make_engine(), TrainingPosition(make_loader())
    checkpointer = Checkpointer(tmp_path, 1, 2, {"model": engine}, position)
    batches = position.batches(0)
    for _ in range(3):
        _, batch = next(batches)
        train_step(engine, batch)
    checkpointer.save(3, {"metrics": {"perplexity_before": 1.5}})

    root = tmp_path / "checkpoints"
    assert (root / LATEST).read_text().strip() == "step3"
    assert sorted(p.name for p in (root / "step3").iterdir()) == [COMPLETE, "model", "position_rank0.json",
                                                                  "state.json"]

    resumed_engine, resumed_position = make_engine(seed=1), TrainingPosition(make_loader())
    state = Checkpointer(tmp_path, 1, 2, {"model": resumed_engine}, resumed_position).resume()
    assert state == {"step": 3, "metrics": {"perplexity_before": 1.5}}
    assert resumed_engine.global_steps == 3 and resumed_engine.micro_steps == engine.micro_steps
    assert resumed_engine.lr_scheduler.get_last_lr() == engine.lr_scheduler.get_last_lr()
    for name, param in parameters(engine).items():
        assert torch.equal(param, parameters(resumed_engine)[name]), name

    # Both go on with the same next batch and reach the same weights, to the bit (optimizer moments restored).
    _, batch = next(batches)
    _, resumed_batch = next(resumed_position.batches(0))
    assert torch.equal(batch["input_ids"], resumed_batch["input_ids"])
    train_step(engine, batch)
    train_step(resumed_engine, resumed_batch)
    for name, param in parameters(engine).items():
        assert torch.equal(param, parameters(resumed_engine)[name]), name


def test_resume_without_a_checkpoint_starts_over_and_refuses_another_world_size(make_engine, tmp_path):
    engine, position = make_engine(), TrainingPosition(make_loader())
    checkpointer = Checkpointer(tmp_path, 1, 2, {"model": engine}, position)
    assert checkpointer.resume() is None
    checkpointer.save(1, {})
    state_file = tmp_path / "checkpoints" / "step1" / "state.json"
    state = json.loads(state_file.read_text())
    state_file.write_text(json.dumps(dict(state, world_size=2)))  # as a two-process run would have written it
    complete = state_file.parent / COMPLETE
    complete.unlink()
    complete.write_text(json.dumps({"step": 1, "files": file_manifest(state_file.parent)}))
    with pytest.raises(ConfigError, match=r"written with other flags: processes: 2 \(now 1\)"):
        checkpointer.resume()


def test_resume_with_flags_that_shape_training_changed_names_each_difference(make_engine, tmp_path):
    from utils.runtime.args import training_flags

    flags = Namespace(model_name_or_path="tiny", per_device_train_batch_size=4, learning_rate=1e-3, seed=1,
                      data_path=["builtin"], lora_dim=0, save_steps=5, print_interval=10, resume=False)
    engine, position = make_engine(), TrainingPosition(make_loader())
    Checkpointer(tmp_path, 1, 2, {"model": engine}, position, flags=training_flags(flags, step=1)).save(1, {})

    def resume(step=1, **changes):
        changed = training_flags(Namespace(**{**vars(flags), **changes}), step=step)
        return Checkpointer(tmp_path, 1, 2, {"model": make_engine()}, TrainingPosition(make_loader()),
                            flags=changed).resume()

    assert resume(save_steps=50, print_interval=1, resume=True)["step"] == 1  # these may change
    with pytest.raises(ConfigError) as error:
        resume(per_device_train_batch_size=8, learning_rate=2e-3, data_path=["builtin", "x.jsonl"], lora_dim=4)
    message = str(error.value)
    for difference in ("--per_device_train_batch_size 4 (now 8)", "--learning_rate 0.001 (now 0.002)",
                       "--data_path builtin (now builtin x.jsonl)", "--lora_dim 0 (now 4)"):
        assert difference in message
    assert "--save_steps" not in message and "\n" not in message
    with pytest.raises(ConfigError, match=r"--step 1 \(now 2\)"):
        resume(step=2)


def test_only_the_newest_checkpoints_of_this_run_are_kept_and_no_other_is_touched(make_engine, tmp_path):
    engine, position = make_engine(), TrainingPosition(make_loader())
    root = tmp_path / "checkpoints"
    make_checkpoint(root, "step50")                # another run's (one writing here now, say): never pruned
    checkpointer = Checkpointer(tmp_path, 1, 2, {"model": engine}, position)
    for step in (1, 2, 3):
        checkpointer.save(step, {})
        assert (root / LATEST).read_text().strip() == f"step{step}"
    assert sorted(p.name for p in root.iterdir()) == [LATEST, "step2", "step3", "step50"]
    assert latest_checkpoint(root) == root / "step3"


# --------------------------------------------------------------------------- the output folder


def claim(output_dir, resume=False, overwrite=False, **kwargs):
    args = Namespace(output_dir=str(output_dir), resume=resume, overwrite_output_dir=overwrite)
    try:
        claim_output_dir(args, **kwargs)
    finally:
        _run_exit_callbacks()  # what cli_entry does when the main ends: release the lock


def test_claiming_the_output_dir_cleans_what_interrupted_saves_left_and_nothing_else(distributed, tmp_path):
    out = tmp_path / "out"
    root = out / "checkpoints"
    step5 = make_checkpoint(root, "step5")
    leftovers = [make_checkpoint(root, ".step60.k2x9ab_1.tmp"), root / ".latest.4242.tmp",   # a checkpoint's
                 tmp_path / ".out.q1w2e3r4.tmp", tmp_path / ".out.old",                     # steps 1-2 model save
                 make_checkpoint(out, ".actor.zzzzzzzz.tmp")]                                # step 3's
    leftovers[1].write_text("step60\n")
    for folder in leftovers[2:4]:
        folder.mkdir()
    others = [tmp_path / ".other.q1w2e3r4.tmp", tmp_path / ".out2.q1w2e3r4.tmp", out / "training.log"]
    others[0].mkdir(), others[1].mkdir(), others[2].write_text("log\n")
    claim(out, resume=True)
    assert not any(path.exists() for path in leftovers)
    assert all(path.exists() for path in others) and is_complete(step5)
    assert not (tmp_path / ".out.lock").exists()  # released at exit


def test_overwrite_output_dir_deletes_the_earlier_checkpoints_and_a_new_folder_left_empty_is_removed(
        distributed, tmp_path, make_engine):
    """--overwrite_output_dir deletes the earlier checkpoints once the run's Checkpointer is made (its data and
    models loaded), not at the claim: before, a run then refused for its data had already lost them."""
    out = tmp_path / "out"
    make_checkpoint(out / "checkpoints", "step5")
    with pytest.raises(ConfigError, match=r"holds checkpoints of an earlier run \(step5\)"):
        claim(out)
    claim(out, overwrite=True)
    assert (out / "checkpoints" / "step5").is_dir()  # a run that fails from here on loses nothing
    Checkpointer(out, 0, 2, {"model": make_engine()}, TrainingPosition(make_loader()))
    assert not (out / "checkpoints").exists() and out.is_dir()
    new = tmp_path / "a" / "b"
    claim(new)
    assert not (tmp_path / "a").exists()  # created for the run, left empty: removed at exit


def test_a_second_claim_of_a_locked_output_dir_names_the_holder(distributed, tmp_path):
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(out)], stdout=subprocess.PIPE, text=True,
                              env=subprocess_env())
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ConfigError, match=f"in use by another run \\(PID {holder.pid},"):
            claim(out)
    finally:
        holder.kill()
        holder.wait()
    claim(out)  # the kernel dropped the dead holder's lock: free again, although its file is still there


HOLD_LOCK = """
import sys, time
from utils.runtime.paths import FolderLock
lock = FolderLock(sys.argv[1])
assert lock.acquire()
print("locked", flush=True)
time.sleep(600)
"""


def test_a_damaged_checkpoint_is_skipped_for_the_newest_good_one_and_none_good_is_one_error(
        make_engine, tmp_path, capsys):
    engine, position = make_engine(), TrainingPosition(make_loader())
    checkpointer = Checkpointer(tmp_path, 1, 3, {"model": engine}, position)
    batches = position.batches(0)
    for step in (1, 2):
        train_step(engine, next(batches)[1])
        checkpointer.save(step, {"at": step})
    root = tmp_path / "checkpoints"
    weights = max((root / "step2" / "model").rglob("*model_states.pt"), key=lambda path: path.stat().st_size)
    weights.write_bytes(weights.read_bytes()[:100])  # truncated (a full disk, a copy cut short)
    state = Checkpointer(tmp_path, 1, 3, {"model": make_engine(seed=1)}, TrainingPosition(make_loader())).resume()
    assert state == {"step": 1, "at": 1}
    warning = capsys.readouterr().err
    assert "warning: --resume: skipping" in warning and f"{weights.relative_to(root / 'step2')} has 100 bytes" in warning

    position_file = root / "step1" / "position_rank0.json"
    position_file.write_text(position_file.read_text().replace("0", "1"))  # same size, other bytes
    with pytest.raises(ChatRLHFError) as error:
        Checkpointer(tmp_path, 1, 3, {"model": make_engine()}, TrainingPosition(make_loader())).resume()
    assert str(error.value).startswith(f"--resume: no checkpoint in {root} is usable (step2: ")
    assert "step1: position_rank0.json does not match the checksum written with it" in str(error.value)


class FailingEngine:
    """An engine whose save dies half-way (a full disk, say): it writes part of its folder, then raises `error`."""

    def __init__(self, engine, error=None):
        self.engine, self.module, self.micro_steps = engine, engine.module, 0
        self.error = error or OSError(28, "No space left on device")

    def save_checkpoint(self, save_dir, tag, save_latest):
        (Path(save_dir) / tag).mkdir()
        (Path(save_dir) / tag / "half_written.pt").write_bytes(b"\0" * 10)
        raise self.error


# What torch.save raises when the disk fills up under it, and what an OSError of a full disk reads as.
DISK_FULL = [RuntimeError("[enforce fail at inline_container.cc:778] . PytorchStreamWriter failed writing file "
                          "data/3: file write failed. unexpected pos 1408 vs 1344"),
             OSError(28, "No space left on device")]


@pytest.mark.parametrize("error", DISK_FULL, ids=["torch.save", "ENOSPC"])
def test_a_failed_save_is_one_error_and_leaves_the_last_checkpoint_the_latest(make_engine, tmp_path, error):
    engine, position = make_engine(), TrainingPosition(make_loader())
    root = tmp_path / "checkpoints"
    with pytest.raises(ChatRLHFError) as first:
        Checkpointer(tmp_path, 1, 2, {"model": FailingEngine(engine, error)}, position).save(1, {})
    assert str(first.value).startswith(f"could not write the checkpoint {root / 'step1'} ({type(error).__name__}: ")
    assert str(first.value).endswith("there is no earlier checkpoint: free some space and run again")
    Checkpointer(tmp_path, 1, 2, {"model": engine}, position).save(1, {})
    with pytest.raises(ChatRLHFError) as second:
        Checkpointer(tmp_path, 1, 2, {"model": FailingEngine(engine, error)}, position).save(2, {})
    assert str(second.value).endswith(f"the last complete checkpoint, {root / 'step1'}, is kept: free some space "
                                      "and resume with --resume")
    assert "\n" not in str(second.value)
    assert sorted(p.name for p in root.iterdir()) == [LATEST, "step1"]  # no step2, no temporary folder
    assert latest_checkpoint(root) == root / "step1"


def test_an_interruption_says_resume_with_resume_only_once_there_is_a_checkpoint(make_engine, tmp_path):
    """Before: `interrupted: SIGTERM; resume with --resume` from the moment the output folder was claimed, also
    during start-up, with nothing to resume."""
    from utils.runtime.errors import _interrupt, interrupt_hint

    interrupt_hint(None)  # an earlier test's save, outside a cli_entry main that would have reset it
    out = tmp_path / "out"
    args = Namespace(output_dir=str(out), resume=False, overwrite_output_dir=False)
    try:
        claim_output_dir(args)
        assert _interrupt["hint"] is None
        Checkpointer(out, 1, 2, {"model": make_engine()}, TrainingPosition(make_loader())).save(1, {})
        assert _interrupt["hint"] == "resume with --resume"
    finally:
        _run_exit_callbacks()
    assert _interrupt["hint"] is None
    try:  # a resumed run has something to resume from the start
        claim_output_dir(Namespace(**{**vars(args), "resume": True}))
        assert _interrupt["hint"] == "resume with --resume"
    finally:
        _run_exit_callbacks()


def test_resume_compares_paths_as_the_files_they_name_and_not_the_run_folder(make_engine, tmp_path, monkeypatch):
    """A run folder moved, copied or reached through a symbolic link resumes, and so does data or a model named by
    a relative path or a link; another data file is still a difference."""
    from utils.runtime.args import training_flags

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "pairs.jsonl").write_text("{}\n")
    (tmp_path / "other.jsonl").write_text("{}\n")
    (tmp_path / "model").mkdir()
    (tmp_path / "model-link").symlink_to(tmp_path / "model")
    flags = Namespace(output_dir=str(tmp_path / "run"), data_path=["builtin", str(tmp_path / "data" / "pairs.jsonl")],
                      model_name_or_path=str(tmp_path / "model"), reward_fn=None, seed=1)
    Checkpointer(tmp_path / "run", 1, 2, {"model": make_engine()}, TrainingPosition(make_loader()),
                 flags=training_flags(flags, step=1)).save(1, {})
    (tmp_path / "run").rename(tmp_path / "moved")
    (tmp_path / "link").symlink_to(tmp_path / "moved")
    monkeypatch.chdir(tmp_path)

    def resume(**changes):
        changed = training_flags(Namespace(**{**vars(flags), **changes}), step=1)
        return Checkpointer(changes["output_dir"], 1, 2, {"model": make_engine()}, TrainingPosition(make_loader()),
                            flags=changed).resume()

    assert resume(output_dir="link", data_path=["builtin", "data/pairs.jsonl"],
                  model_name_or_path="model-link")["step"] == 1
    with pytest.raises(ConfigError, match=r"--data_path builtin \S+/data/pairs.jsonl \(now builtin \S+/other.jsonl\)"):
        resume(output_dir="moved", data_path=["builtin", "other.jsonl"])


def test_non_finite_weights_are_never_checkpointed(make_engine, tmp_path):
    engine, position = make_engine(), TrainingPosition(make_loader())
    checkpointer = Checkpointer(tmp_path, 1, 2, {"model": engine}, position)
    checkpointer.save(1, {})
    with torch.no_grad():
        next(engine.module.parameters())[0, 0] = float("nan")
    with pytest.raises(ChatRLHFError, match="model weights after step 2 are not finite"):
        checkpointer.save(2, {})
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == [LATEST, "step1"]


# --------------------------------------------------------------------------- data position and random states


def walk(position, num_epochs, stop_at=None):
    """(epoch, micro_step, first token of the batch, a random draw after the batch) for every batch, as a
    training loop with dropout would draw; stops after `stop_at` = (epoch, micro_step) when given."""
    seen = []
    for epoch in position.epochs(num_epochs):
        for micro_step, batch in position.batches(epoch):
            seen.append((epoch, micro_step, batch["input_ids"][:, 0].tolist(), torch.rand(1).item()))
            if (epoch, micro_step) == stop_at:
                return seen
    return seen


def test_training_position_resumes_the_same_batches_and_random_draws_across_epochs():
    torch.manual_seed(7)
    uninterrupted = walk(TrainingPosition(make_loader()), 3)
    assert len(uninterrupted) == 15
    assert uninterrupted[0][2] != uninterrupted[5][2]  # each epoch is shuffled anew

    torch.manual_seed(7)
    position = TrainingPosition(make_loader())
    first_part = walk(position, 3, stop_at=(1, 3))
    saved = json.loads(json.dumps({"data": position.state_dict(), "rng": rng_state()}))  # as written to disk

    torch.manual_seed(123)  # a resumed process starts from other random states (model building, ...)
    resumed = TrainingPosition(make_loader())
    resumed.load_state_dict(saved["data"], rng=saved["rng"])
    assert first_part + walk(resumed, 3) == uninterrupted


def test_rng_state_round_trips_through_json():
    import random

    import numpy as np

    state = json.loads(json.dumps(rng_state()))
    draws = (random.random(), np.random.rand(), torch.rand(1).item())
    set_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == draws


class SignallingEngine:
    """An engine that, half-way through its save, gets a SIGTERM (a scheduler ending the job)."""

    def __init__(self, engine):
        self.engine, self.module, self.micro_steps = engine, engine.module, engine.micro_steps

    def save_checkpoint(self, save_dir, tag, save_latest):
        import os
        import signal

        os.kill(os.getpid(), signal.SIGTERM)
        return self.engine.save_checkpoint(save_dir, tag=tag, save_latest=save_latest)


def test_a_signal_during_a_checkpoint_save_lets_it_finish_then_ends_the_run_in_one_line(
        make_engine, tmp_path, capsys):
    from utils.runtime.errors import cli_entry

    engine, position = make_engine(), TrainingPosition(make_loader())
    checkpointer = Checkpointer(tmp_path, 1, 2, {"model": SignallingEngine(engine)}, position)

    @cli_entry
    def main():
        checkpointer.save(1, {})
        raise AssertionError("the run went on after the signal")

    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 143
    assert capsys.readouterr().err == "interrupted: SIGTERM; resume with --resume\n"  # the checkpoint it finished
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == [LATEST, "step1"]  # finished, and complete
    assert latest_checkpoint(root) == root / "step1" and verify_checkpoint(root / "step1") is None


def test_a_checkpoint_whose_manifest_or_pickles_cannot_be_trusted_is_damaged(make_engine, tmp_path):
    """Before: a COMPLETE that was not JSON or listed no files passed unchecked (a truncated file then gave a
    traceback), and a planted pickle with its checksum in COMPLETE ran its code when the engine loaded it."""
    import pickle

    engine, position = make_engine(), TrainingPosition(make_loader())
    Checkpointer(tmp_path, 1, 2, {"model": engine}, position).save(1, {})
    folder = tmp_path / "checkpoints" / "step1"
    assert verify_checkpoint(folder) is None  # the engine's own files: tensors and plain containers only
    manifest = json.loads((folder / COMPLETE).read_text())
    for text in ("garbage", "[]", json.dumps({"step": 1, "files": {}})):
        (folder / COMPLETE).write_text(text)
        assert "COMPLETE" in verify_checkpoint(folder)
    planted = next(name for name in manifest["files"] if name.endswith(".pt"))

    class Payload:
        def __reduce__(self):
            return (print, ("a planted pickle ran",))

    for content in (pickle.dumps(Payload()), b"PK\x03\x04 not a zip either"):
        (folder / planted).write_bytes(content)
        (folder / COMPLETE).write_text(json.dumps({"step": 1, "files": {
            **manifest["files"], planted: [len(content), hashlib.sha256(content).hexdigest()]}}))
        assert verify_checkpoint(folder) == f"{planted} is not a torch.save archive"
    sneaky = tmp_path / "sneaky.pt"
    torch.save({"weights": torch.zeros(2), "hook": Payload()}, sneaky)  # a real archive naming a callable
    (folder / planted).write_bytes(sneaky.read_bytes())
    (folder / COMPLETE).write_text(json.dumps({"step": 1, "files": {
        **manifest["files"], planted: [sneaky.stat().st_size, hashlib.sha256(sneaky.read_bytes()).hexdigest()]}}))
    assert verify_checkpoint(folder).startswith(f"{planted} would load Python objects beyond tensors (builtins.print")


def test_json_shape_problem_names_where_a_value_is_not_what_this_code_writes():
    shape = {"step": 0, "loss": (None, 0.0), "stopped": (None, {"reason": ""}), "history": [{"*": 0.0}]}
    good = {"step": 3, "loss": 2, "stopped": None, "history": [{"kl": 0.5, "reward": 1}], "extra": "kept"}
    assert json_shape_problem(good, shape, "state.json") is None
    for change, problem in [({"step": 3.5}, "state.json.step is a number, not a whole number"),
                            ({"step": True}, "state.json.step is true or false, not a whole number"),
                            ({"loss": "low"}, "state.json.loss is a string, not a number"),
                            ({"stopped": {"reason": 1}}, "state.json.stopped.reason is a whole number, not a string"),
                            ({"history": {"kl": 1.0}}, "state.json.history is an object, not a list"),
                            ({"history": [{"kl": 1.0}, {"kl": [1]}]}, "state.json.history[1].kl is a list, not a number")]:
        assert json_shape_problem({**good, **change}, shape, "state.json") == problem
    assert json_shape_problem({"loss": None}, shape, "state.json") == 'state.json has no "step"'
    assert json_shape_problem([], shape, "state.json") == "state.json is a list, not an object"


def test_a_checkpoint_whose_json_passes_its_checksums_but_not_its_shape_is_one_error(make_engine, tmp_path):
    """Before: state.json or position_rank0.json edited with their checksums written into COMPLETE to match ended
    the resumed run in a traceback (a KeyError, or a random state no generator takes, once its epoch came)."""
    engine, position = make_engine(), TrainingPosition(make_loader())
    next(position.batches(0))
    shape = {"metrics": {"*": 0.0}}
    Checkpointer(tmp_path, 1, 2, {"model": engine}, position).save(1, {"metrics": {"loss_before": 2.5}})
    folder = tmp_path / "checkpoints" / "step1"
    originals = {name: json.loads((folder / name).read_text()) for name in ("state.json", "position_rank0.json")}

    def craft(name, edit):
        value = json.loads(json.dumps(originals[name]))
        edit(value)
        (folder / name).write_text(json.dumps(value))
        manifest = json.loads((folder / COMPLETE).read_text())
        manifest["files"][name] = [(folder / name).stat().st_size,
                                   hashlib.sha256((folder / name).read_bytes()).hexdigest()]
        (folder / COMPLETE).write_text(json.dumps(manifest))
        assert verify_checkpoint(folder) is None  # the checksums pass

    crafted = [("state.json", lambda v: v.pop("micro_steps"), 'state.json has no "micro_steps"'),
               ("state.json", lambda v: v.update(step="1"), "state.json.step is a string, not a whole number"),
               ("state.json", lambda v: v["trainer"]["metrics"].update(loss_before="x"),
                "state.json.trainer.metrics.loss_before is a string, not a number"),
               ("position_rank0.json", lambda v: v["data"].update(consumed=None),
                "position_rank0.json.data.consumed is null, not a whole number"),
               ("position_rank0.json", lambda v: v["rng"].update(torch=[7, 7, 7]),
                "position_rank0.json: a random state no generator takes (RuntimeError: "),
               ("position_rank0.json", lambda v: v["rng"]["numpy"].__setitem__(1, [300] * 5),
                "position_rank0.json: a random state no generator takes (IndexError: ")]
    for name, edit, problem in crafted:
        craft(name, edit)
        with pytest.raises(ChatRLHFError) as error:
            Checkpointer(tmp_path, 1, 2, {"model": make_engine()}, TrainingPosition(make_loader())).resume(shape)
        assert str(error.value).startswith(f"--resume: {folder} cannot be resumed: {problem}"), str(error.value)
        assert str(error.value).endswith("; start over with --overwrite_output_dir")
        craft(name, lambda v: None)  # as saved: resumes
    assert Checkpointer(tmp_path, 1, 2, {"model": make_engine()}, TrainingPosition(make_loader())).resume(shape) == {
        "step": 1, "metrics": {"loss_before": 2.5}}
