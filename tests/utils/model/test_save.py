"""Tests of utils/model/save.py with real DeepSpeed engines in this process: a ZeRO-3 save equals a stage-0 save, a
LoRA model is saved fused, and `atomic_dir` swaps folders in whole while keeping a run's own files."""
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from utils.model.lora import LinearLayerLoRA
from utils.model.model_utils import create_hf_model
from utils.model.save import atomic_dir, release_prefetched, save_engine_model, save_hf_model
from utils.runtime.ds_utils import get_train_ds_config
from utils.trainer.engine import init_train_engine, prepare_trainable


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory, small_config, tiny_tokenizer):
    """A small Llama (tied embeddings) saved with the tiny tokenizer, as a step would find a model folder."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(small_config("llama", vocab_size=len(tiny_tokenizer)))
    path = tmp_path_factory.mktemp("base")
    model.save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return path


def engine_for(base_dir, tokenizer, stage, lora_dim=0):
    ds_config = get_train_ds_config(micro_batch_size=1, gradient_accumulation_steps=1, world_size=1,
                                    dtype="fp32", stage=stage)
    model = create_hf_model(AutoModelForCausalLM, str(base_dir), tokenizer, ds_config)
    prepare_trainable(model, lora_dim=lora_dim, lora_module_name="layers.", only_optimize_lora=lora_dim > 0)
    if lora_dim:
        with torch.no_grad():  # non-zero left factors, so fusing changes the weights
            generator = torch.Generator().manual_seed(5)
            for module in model.modules():
                if isinstance(module, LinearLayerLoRA):
                    module.lora_left_weight.copy_(torch.randn(module.lora_left_weight.shape, generator=generator))
    engine = init_train_engine(model, ds_config=ds_config, learning_rate=1e-3, weight_decay=0.0,
                               lora_learning_rate=None, offload=False, lr_scheduler_type="constant",
                               num_warmup_steps=0, num_training_steps=1)
    engine.eval()
    return engine


def input_ids(vocab_size):
    """Two fixed rows of ids past the four special tokens."""
    return torch.randint(4, vocab_size, (2, 11), generator=torch.Generator().manual_seed(2))


def logits(model):
    with torch.no_grad():
        vocab_size = getattr(model, "module", model).config.vocab_size  # an engine or a plain model
        return model(input_ids=input_ids(vocab_size)).logits


def load_plain(path):
    return AutoModelForCausalLM.from_pretrained(path).eval()


def test_zero3_save_equals_stage0_save(distributed, base_dir, tiny_tokenizer, tmp_path):
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
    from transformers.integrations import is_deepspeed_zero3_enabled

    saved = {}
    for stage in (0, 3):
        engine = engine_for(base_dir, tiny_tokenizer, stage)
        assert not is_deepspeed_zero3_enabled()  # the ZeRO-3 loading context ended with the load
        partitioned = [p for p in engine.module.parameters() if hasattr(p, "ds_id")]
        assert bool(partitioned) == (stage == 3)
        if stage == 3:
            assert all(p.numel() == 0 for p in partitioned)  # the weights live in ZeRO's partitions only
        engine_logits = logits(engine)
        if stage == 3:  # small weights persist after a forward (stage3_param_persistence_threshold), the
            # embedding (vocab x hidden) does not: the save really has to gather it
            embedding = engine.module.get_input_embeddings().weight
            assert embedding.ds_status == ZeroParamStatus.NOT_AVAILABLE and embedding.numel() == 0
        saved[stage] = tmp_path / f"stage{stage}"
        save_hf_model(engine.module, tiny_tokenizer, saved[stage], stage)
        torch.testing.assert_close(logits(load_plain(saved[stage])), engine_logits, atol=0, rtol=0)

    stage0 = load_file(saved[0] / "model.safetensors")
    stage3 = load_file(saved[3] / "model.safetensors")
    assert sorted(stage0) == sorted(stage3)
    for name in stage0:
        assert stage0[name].dtype == stage3[name].dtype == torch.float32
        assert torch.equal(stage0[name], stage3[name]), name
    # Nothing was trained: both equal the folder they were loaded from, key for key (tied head written once).
    original = load_file(base_dir / "model.safetensors")
    assert sorted(original) == sorted(stage0)
    assert all(torch.equal(original[name], stage0[name]) for name in original)
    torch.testing.assert_close(logits(load_plain(saved[0])), logits(load_plain(saved[3])), atol=0, rtol=0)
    reloaded_tokenizer_files = {p.name for p in saved[3].iterdir()}
    assert {"config.json", "tokenizer.json", "model.safetensors"} <= reloaded_tokenizer_files


def test_a_zero3_engine_saved_after_a_forward_pass_has_every_parameter_released(distributed, base_dir,
                                                                                 tiny_tokenizer, tmp_path):
    """On a GPU the last forward pass can leave prefetched parameters in flight, which a save's gather cannot
    partition again (an H100 run failed so: docs/gpu.md). release_prefetched waits for and releases every gathered
    parameter. On this CPU the gathers are synchronous and nothing is left in flight, so what is checked is that it
    runs on a real ZeRO-3 engine after a forward pass, leaves every parameter partitioned, and that the save that
    follows is whole."""
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    engine = engine_for(base_dir, tiny_tokenizer, stage=3)
    engine_logits = logits(engine)
    release_prefetched(engine)
    assert all(p.ds_status == ZeroParamStatus.NOT_AVAILABLE for p in engine.module.parameters())
    save_engine_model(engine, tiny_tokenizer, tmp_path / "saved")
    torch.testing.assert_close(logits(load_plain(tmp_path / "saved")), engine_logits, atol=0, rtol=0)
    original = load_file(base_dir / "model.safetensors")
    saved = load_file(tmp_path / "saved" / "model.safetensors")
    assert sorted(saved) == sorted(original) and all(torch.equal(original[n], saved[n]) for n in original)


def test_lora_model_saved_under_zero3_is_fused(distributed, base_dir, tiny_tokenizer, tmp_path):
    engine = engine_for(base_dir, tiny_tokenizer, stage=3, lora_dim=4)
    engine_logits = logits(engine)
    out = tmp_path / "lora"
    save_hf_model(engine.module, tiny_tokenizer, out, zero_stage=3)
    tensors = load_file(out / "model.safetensors")
    assert not [name for name in tensors if "lora" in name]
    original = load_file(base_dir / "model.safetensors")
    assert sorted(tensors) == sorted(original)
    changed = [name for name in tensors if not torch.equal(tensors[name], original[name])]
    assert changed and all("layers." in name for name in changed)  # only the LoRA layers' weights moved
    plain = load_plain(out)
    assert not any("lora" in name for name, _ in plain.named_parameters())
    torch.testing.assert_close(logits(plain), engine_logits, atol=1e-5, rtol=0)


def test_save_into_an_existing_run_folder_keeps_the_log(distributed, base_dir, tiny_tokenizer, tmp_path):
    out = tmp_path / "actor"
    out.mkdir()
    (out / "pytorch_model.bin").write_bytes(b"stale weights")
    with open(out / "training.log", "a") as log:
        log.write("step 1\n")
        log.flush()
        save_hf_model(engine_for(base_dir, tiny_tokenizer, stage=0).module, tiny_tokenizer, out, 0)
        log.write("after save\n")
    assert (out / "training.log").read_text() == "step 1\nafter save\n"
    assert not (out / "pytorch_model.bin").exists()
    assert (out / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["actor"]  # no temporary or old folders left


# --------------------------------------------------------------------------- atomic_dir


def test_atomic_dir_failure_leaves_nothing(tmp_path):
    parent = tmp_path / "out"
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_dir(parent / "model") as tmp:
            (tmp / "config.json").write_text("{}")
            raise RuntimeError("boom")
    assert list(parent.iterdir()) == []


def test_atomic_dir_failure_keeps_the_previous_folder(tmp_path):
    target = tmp_path / "model"
    target.mkdir()
    (target / "config.json").write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_dir(target) as tmp:
            (tmp / "config.json").write_text("new")
            raise RuntimeError("boom")
    assert (target / "config.json").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_atomic_dir_replaces_model_files_and_keeps_run_files(tmp_path):
    target = tmp_path / "model"
    (target / "runs").mkdir(parents=True)
    (target / "runs" / "events.out").write_text("tb")
    (target / "config.json").write_text("old config")
    (target / "pytorch_model.bin").write_text("old weights")
    (target / "tokenizer_config.json").write_text("old tokenizer")
    (target / "metrics.json").write_text("old metrics")
    log = open(target / "training.log", "w")
    try:
        log.write("before\n")
        log.flush()
        with atomic_dir(target) as tmp:
            assert tmp.parent == tmp_path and tmp != target
            (tmp / "config.json").write_text("new config")
            (tmp / "model.safetensors").write_text("new weights")
            (tmp / "metrics.json").write_text("new metrics")
            assert (target / "config.json").read_text() == "old config"  # nothing visible before the swap
        log.write("after\n")
        log.flush()
    finally:
        log.close()
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "metrics.json", "model.safetensors",
                                                        "runs", "training.log"]
    assert (target / "config.json").read_text() == "new config"
    assert (target / "metrics.json").read_text() == "new metrics"  # the new save's file wins over the old one
    assert (target / "runs" / "events.out").read_text() == "tb"
    assert (target / "training.log").read_text() == "before\nafter\n"  # the open handle writes to the kept file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_saved_files_have_the_permissions_the_umask_gives(distributed, small_config, tiny_tokenizer, tmp_path):
    """safetensors alone writes 0600: a server under another user could not read the weights."""
    import os
    import stat

    from utils.model.save import save_safetensors

    model = AutoModelForCausalLM.from_config(small_config("llama", vocab_size=len(tiny_tokenizer)))
    umask = os.umask(0o027)
    try:
        save_hf_model(model, tiny_tokenizer, tmp_path / "out", 0)
        save_safetensors({"weight": torch.zeros(2)}, tmp_path / "head.safetensors")
    finally:
        os.umask(umask)
    files = [path for path in (tmp_path / "out").iterdir() if path.is_file()] + [tmp_path / "head.safetensors"]
    modes = {path.name: oct(stat.S_IMODE(path.stat().st_mode)) for path in files}
    assert "model.safetensors" in modes and set(modes.values()) == {"0o640"}, modes


def test_saved_training_settings_give_the_evaluation_tools_their_lengths(base_dir, tiny_tokenizer, tmp_path):
    from utils.model.save import (TRAINING_SETTINGS, read_training_settings, trained_answer_length,
                                  trained_sequence_length)

    engine = engine_for(base_dir, tiny_tokenizer, stage=0)
    step1 = {"step": 1, "max_seq_len": 48, "learning_rate": 1e-3}
    save_hf_model(engine.module, tiny_tokenizer, tmp_path / "step1", settings=step1)
    assert read_training_settings(tmp_path / "step1") == step1
    assert trained_sequence_length(tmp_path / "step1") == 48
    assert trained_answer_length(tmp_path / "step1", longest_prompt=20) == 28  # prompt + answer fit in 48
    assert trained_answer_length(tmp_path / "step1", longest_prompt=60) == 1
    # A save without settings replaces the old ones whole (they belong to the model, not the run).
    save_hf_model(engine.module, tiny_tokenizer, tmp_path / "step1")
    assert not (tmp_path / "step1" / TRAINING_SETTINGS).exists()
    assert read_training_settings(tmp_path / "step1") == {} and trained_answer_length(tmp_path / "step1") is None
    step3 = {"step": 3, "max_prompt_seq_len": 32, "max_answer_seq_len": 12}
    save_hf_model(engine.module, tiny_tokenizer, tmp_path / "actor", settings=step3)
    assert trained_answer_length(tmp_path / "actor", longest_prompt=30) == 12
    assert trained_sequence_length(tmp_path / "actor") == 44


def test_unreadable_training_settings_are_one_config_error(tmp_path):
    from utils.model.save import TRAINING_SETTINGS, read_training_settings
    from utils.runtime.errors import ConfigError

    (tmp_path / TRAINING_SETTINGS).write_text("{not json")
    with pytest.raises(ConfigError, match=TRAINING_SETTINGS):
        read_training_settings(tmp_path)
    (tmp_path / TRAINING_SETTINGS).write_text("[1, 2]")
    with pytest.raises(ConfigError, match="is not a model's training settings"):
        read_training_settings(tmp_path)


# --------------------------------------------------------------------------- a save that fails: a full disk


def folder_bytes(path):
    return {file.name: file.read_bytes() for file in sorted(path.iterdir()) if file.is_file()}


@pytest.fixture()
def elsewhere(tmp_path, monkeypatch):
    """The temporary directory ($TMPDIR), where a model that cannot be saved in its folder is kept."""
    import tempfile

    folder = tmp_path / "elsewhere"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", None)
    return folder


def disk_full_but_in(monkeypatch, allowed):
    """safetensors' writer fails as it does on a full disk, except under `allowed` (None: everywhere)."""
    from safetensors import SafetensorError

    import transformers.modeling_utils

    real = transformers.modeling_utils.safe_save_file

    def save_file(tensors, filename, *args, **kwargs):
        if allowed is None or not str(filename).startswith(str(allowed)):
            raise SafetensorError('Error while serializing: I/O error: No space left on device (os error 28)')
        return real(tensors, filename, *args, **kwargs)

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", save_file)


def trained_copy(base_dir):
    model = AutoModelForCausalLM.from_pretrained(base_dir)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.5)
    return model


def test_a_save_on_a_full_disk_keeps_the_folder_and_the_trained_weights_elsewhere(
        base_dir, tiny_tokenizer, tmp_path, elsewhere, monkeypatch):
    """Before: a SafetensorError traceback and the trained model lost (the temporary folder deleted)."""
    import shutil

    from utils.runtime.errors import ChatRLHFError

    out = shutil.copytree(base_dir, tmp_path / "out")  # the folder's earlier model
    before = folder_bytes(out)
    model = trained_copy(base_dir)
    disk_full_but_in(monkeypatch, allowed=elsewhere)
    with pytest.raises(ChatRLHFError) as error:
        save_hf_model(model, tiny_tokenizer, out)
    kept = next(elsewhere.iterdir())
    assert str(error.value) == (
        f"could not save the trained model in {out} (SafetensorError: Error while serializing: I/O error: No space "
        f"left on device (os error 28)); it is kept in {kept} instead: move it to {out} once there is room ({out} "
        "keeps what it held before)")
    assert kept.name.startswith("chatrlhf-unsaved-out-")
    assert folder_bytes(out) == before and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    saved = load_file(str(kept / "model.safetensors"))
    for name, param in model.named_parameters():
        assert torch.equal(saved[name], param.detach()), name


def test_a_save_that_fails_everywhere_says_so_and_keeps_the_folder(base_dir, tiny_tokenizer, tmp_path, elsewhere,
                                                                   monkeypatch):
    import shutil

    from utils.runtime.errors import ChatRLHFError

    out = shutil.copytree(base_dir, tmp_path / "out")
    before = folder_bytes(out)
    disk_full_but_in(monkeypatch, allowed=None)
    with pytest.raises(ChatRLHFError, match=f"could not save the trained model in {out} .*, nor in {elsewhere} "
                                            f".*; {out} keeps what it held before: free some space and run again"):
        save_hf_model(trained_copy(base_dir), tiny_tokenizer, out)
    assert folder_bytes(out) == before and list(elsewhere.iterdir()) == []


def test_non_finite_weights_are_not_saved(base_dir, tiny_tokenizer, tmp_path):
    from utils.runtime.errors import ChatRLHFError

    model = trained_copy(base_dir)
    with torch.no_grad():
        model.lm_head.weight[0, 0] = float("nan")
    with pytest.raises(ChatRLHFError, match=r"the trained weights are not finite \(\S+ holds NaN or inf\): not saved"):
        save_hf_model(model, tiny_tokenizer, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.fixture()
def small_disk(tmp_path):
    """A 1 MiB tmpfs (root may mount one; skipped where mounting is not allowed), unmounted at the end."""
    import subprocess

    folder = tmp_path / "small_disk"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode(errors='replace').strip()}")
    yield folder
    subprocess.run(["umount", str(folder)], check=True)


def test_a_save_on_a_really_full_disk_keeps_the_folder_and_the_weights_elsewhere(
        base_dir, tiny_tokenizer, small_config, small_disk, elsewhere):
    """The same on a real file system that fills up: safetensors' own error, the earlier model untouched."""
    import shutil

    from utils.runtime.errors import ChatRLHFError

    out = shutil.copytree(base_dir, small_disk / "out")  # ~0.2 MB: fits
    before = folder_bytes(out)
    config = small_config("llama", vocab_size=len(tiny_tokenizer))
    config.hidden_size, config.intermediate_size = 256, 512  # ~4 MB of weights: does not
    model = AutoModelForCausalLM.from_config(config)
    with pytest.raises(ChatRLHFError, match=f"could not save the trained model in {out} .*No space left on device.*; "
                                            f"it is kept in {elsewhere}/chatrlhf-unsaved-out-"):
        save_hf_model(model, tiny_tokenizer, out)
    assert folder_bytes(out) == before and sorted(p.name for p in small_disk.iterdir()) == ["out"]
    assert (next(elsewhere.iterdir()) / "model.safetensors").stat().st_size > 3_000_000
