"""Saving trained models as Hugging Face folders (safetensors), whole even under ZeRO-3, LoRA fused, atomically: a
save that fails (a full disk) leaves the folder's earlier model as it was, and the trained weights in a folder
named in the error instead of lost."""
import fnmatch
import os
import shutil
import tempfile
from pathlib import Path

from utils.model.lora import fuse_lora_state_dict, has_lora
from utils.model.model_utils import read_json_object
from utils.runtime.dist import barrier
from utils.runtime.errors import ChatRLHFError, ConfigError, error_line, interrupts_deferred
from utils.runtime.paths import honour_umask, make_temp_dir_beside, replace_dir
from utils.runtime.progress import is_rank_0

TRAINING_SETTINGS = "training_settings.json"
"""The flags that shaped a saved model's training (args.training_flags), saved with it: evaluation tools take
their lengths from it."""
MODEL_CARD = "README.md"
"""A saved model's card: Hugging Face front matter and how it was trained (utils/model/card.py)."""
# Files that belong to a saved model; anything else in an output folder (training.log, TensorBoard runs,
# checkpoints) is the run's and survives a new save.
MODEL_FILE_PATTERNS = ("config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json",
                       "*.bin", "*.bin.index.json", "tokenizer*", "special_tokens_map.json", "added_tokens.json",
                       "vocab*", "merges.txt", "chat_template*", TRAINING_SETTINGS, MODEL_CARD)


def gather_state_dict(module, zero_stage):
    """The full state dict of `module` on rank 0 (None on other ranks), tensors on the CPU.

    Built from `named_parameters` (tied weights once, as a plain `save_pretrained` writes them) and the persistent
    buffers, the same way at every stage. Under ZeRO-3 each parameter is gathered in turn, so no rank ever holds
    two whole copies of the model.
    """
    import contextlib

    import deepspeed

    persistent = set(module.state_dict().keys())
    state_dict = {}
    for name, param in module.named_parameters():
        gathered = (deepspeed.zero.GatheredParameters([param], modifier_rank=None) if zero_stage == 3
                    else contextlib.nullcontext())
        with gathered:
            if is_rank_0():
                state_dict[name] = param.detach().cpu().clone()
    if not is_rank_0():
        return None
    for name, buffer in module.named_buffers():
        if name in persistent:
            state_dict[name] = buffer.detach().cpu().clone()
    return state_dict


def release_prefetched(engine):
    """Wait for and release the parameters DeepSpeed's ZeRO-3 prefetcher gathered ahead of a forward pass that never
    came. On a GPU the gathers run asynchronously, and the last pass (an evaluation, say) can leave some in flight,
    which a save's gather cannot partition again ("Cannot partition a param in flight", seen on an H100:
    docs/gpu.md); on a CPU they are synchronous. Call it before gathering a trained engine's weights; a no-op below
    ZeRO-3."""
    if engine.zero_optimization_stage() == 3:
        engine.empty_partition_cache()


def save_engine_model(engine, tokenizer, output_dir, settings=None, card=None):
    """save_hf_model for a DeepSpeed engine's model, at the engine's ZeRO stage. Every rank must call it."""
    release_prefetched(engine)
    save_hf_model(engine.module, tokenizer, output_dir, engine.zero_optimization_stage(), settings=settings,
                  card=card)


def save_hf_model(module, tokenizer, output_dir, zero_stage=0, settings=None, card=None):
    """Write `module` (a transformers model, or a module with the same `save_pretrained(dir, state_dict=...)`)
    and its tokenizer into `output_dir` as a Hugging Face folder, with the run's `settings` (the flags that shaped
    its training) as TRAINING_SETTINGS and its model `card` (utils/model/card.py) as MODEL_CARD if given. Every rank
    must call it (ZeRO-3 gathers).

    ChatRLHFError, nothing written, if a weight is not finite (a run that diverged: its model is of no use). If
    the write fails (a full disk), `output_dir` keeps what it held and the model is written to a new folder in the
    temporary directory ($TMPDIR) instead, which the error names (or, if that fails too, says so)."""
    import json

    state_dict = gather_state_dict(module, zero_stage)
    problem = None
    if is_rank_0():
        if has_lora(module):
            state_dict = fuse_lora_state_dict(module, state_dict)
        problem = _not_finite(state_dict, output_dir)

        def write(folder):  # a copy of the dict each time: save_pretrained may empty the one it is given
            module.save_pretrained(folder, state_dict=dict(state_dict))
            tokenizer.save_pretrained(folder)
            if settings is not None:
                (Path(folder) / TRAINING_SETTINGS).write_text(json.dumps(settings, indent=2) + "\n")
            if card is not None:
                (Path(folder) / MODEL_CARD).write_text(card)

        if problem is None:
            try:
                with atomic_dir(output_dir) as tmp:
                    write(tmp)
            except Exception as err:  # noqa: BLE001 (SafetensorError, OSError...: the weights must not be lost)
                problem = _saved_elsewhere(write, output_dir, err)
    barrier()
    if problem is not None:
        raise ChatRLHFError(problem)


def _not_finite(state_dict, output_dir):
    """What is wrong with weights holding a NaN or inf (None if all are finite)."""
    import torch

    for name, tensor in state_dict.items():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            return (f"the trained weights are not finite ({name} holds NaN or inf): not saved in {output_dir}, "
                    "which keeps what it held; the run diverged (try a lower learning rate)")
    return None


def _saved_elsewhere(write, output_dir, err):
    """The error line of a save into `output_dir` that failed with `err`: the model written by `write(folder)`
    into a new folder of the temporary directory instead, named; or why that failed too."""
    why = error_line(err)
    fallback = Path(tempfile.mkdtemp(prefix=f"chatrlhf-unsaved-{Path(output_dir).name}-"))
    try:
        write(fallback)
    except Exception as second:  # noqa: BLE001
        shutil.rmtree(fallback, ignore_errors=True)
        return (f"could not save the trained model in {output_dir} ({why}), nor in {fallback.parent} "
                f"({type(second).__name__}: {second}); {output_dir} keeps what it held before: free some space and "
                "run again (with --resume, from the last checkpoint)")
    return (f"could not save the trained model in {output_dir} ({why}); it is kept in {fallback} instead: move "
            f"it to {output_dir} once there is room ({output_dir} keeps what it held before)")


def read_training_settings(folder):
    """The TRAINING_SETTINGS of a model folder ({} where there are none: a base model, a hub name)."""
    path = Path(folder) / TRAINING_SETTINGS
    return read_json_object(path, "a model's training settings") if path.is_file() else {}


def trained_sequence_length(folder):
    """The longest prompt + answer the model in `folder` was trained on, from its saved settings: --max_seq_len
    (steps 1, 2, DPO), else --max_prompt_seq_len + --max_answer_seq_len (step 3); None without saved settings."""
    settings = _lengths(folder)
    if settings.get("max_seq_len"):
        return settings["max_seq_len"]
    if settings.get("max_prompt_seq_len") and settings.get("max_answer_seq_len"):
        return settings["max_prompt_seq_len"] + settings["max_answer_seq_len"]
    return None


def trained_answer_length(folder, longest_prompt=0):
    """The longest answer the model in `folder` was trained to write, from its saved settings: step 3's
    --max_answer_seq_len, else --max_seq_len - longest_prompt (steps 1 and DPO fit prompt + answer in
    --max_seq_len), at least 1; None for a folder without saved settings."""
    settings = _lengths(folder)
    if settings.get("max_answer_seq_len"):
        return settings["max_answer_seq_len"]
    if settings.get("max_seq_len"):
        return max(1, settings["max_seq_len"] - longest_prompt)
    return None


LENGTH_SETTINGS = ("max_seq_len", "max_prompt_seq_len", "max_answer_seq_len")


def _lengths(folder):
    """The LENGTH_SETTINGS the model in `folder` was trained with, those its TRAINING_SETTINGS hold as numbers of
    tokens; a ConfigError naming the file and key for any other number or a bool (a string, such as `auto`
    written by hand, is no length and is left out)."""
    settings = read_training_settings(folder)
    lengths = {}
    for key in LENGTH_SETTINGS:
        value = settings.get(key)
        if not isinstance(value, (int, float)):
            continue  # absent, or no number (`auto` written by hand): no length
        if isinstance(value, (bool, float)) or value < 1:
            raise ConfigError(f"{Path(folder) / TRAINING_SETTINGS}: '{key}' must be a number of tokens (1 or more), "
                              f"got {value!r}")
        lengths[key] = value
    return lengths


class atomic_dir:
    """`with atomic_dir(target) as tmp:` writes into `tmp` and, only if the block succeeds, swaps `tmp` in as
    `target`. Files already in `target` that are not model files (see MODEL_FILE_PATTERNS) are carried over, so
    a log being written there keeps going; old model files are replaced as a whole, never half-overwritten."""

    def __init__(self, target):
        self.target = Path(target)

    def __enter__(self):
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = make_temp_dir_beside(self.target)
        return self.tmp

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return False
        for path in self.tmp.rglob("*.safetensors"):
            honour_umask(path)
        with interrupts_deferred():  # never a moment without the target folder
            self._swap()
        return False

    def _swap(self):
        if self.target.exists():
            for entry in self.target.iterdir():
                if not _is_model_file(entry.name) and not (self.tmp / entry.name).exists():
                    os.replace(entry, self.tmp / entry.name)
        replace_dir(self.tmp, self.target)


def _is_model_file(name):
    return any(fnmatch.fnmatch(name, pattern) for pattern in MODEL_FILE_PATTERNS)


def load_safetensors(path):
    """Tensors of a safetensors file (never a pickle)."""
    from safetensors.torch import load_file

    return load_file(str(path))


def save_safetensors(tensors, path):
    from safetensors.torch import save_file

    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(path))
    honour_umask(path)

