"""Resumable training checkpoints: save every --save_steps optimizer steps (step 3: prompt batches), and with
--resume start from the latest complete one, so that the resumed run goes on exactly as the uninterrupted run
would have (same batches, same random draws, same weights to the bit).

A checkpoint holds everything a run's future depends on:

    <output_dir>/checkpoints/
        step120/                  one complete checkpoint
            model/                DeepSpeed's engine.save_checkpoint (weights, optimizer, LR scheduler), one
                                  folder per trained engine (step 3: actor/, critic/)
            actor_ema.safetensors weights of a model without an optimizer (step 3's EMA)
            best.safetensors      tensors a run keeps besides its models (step 3's --load_best_model_at_end), rank 0
            state.json            the step, the flags and a digest of the data, the trainer's own state
                                  (metrics so far; for PPO the KL controller, reward moments, minibatch
                                  shuffler, metric history), rank 0; checked for its shape before a resume
            position_rank0.json   per rank: where the run is in its data, and every random generator's state
            COMPLETE              written last, with each file's size and sha256: a folder without it is never
                                  resumed from, one whose files no longer match is skipped for an older one
        latest                    the name of the newest complete checkpoint (replaced atomically)
        .step130.k2x9.tmp/        a checkpoint being written, or left by a killed run: never resumed from

Writing is atomic: every rank writes into one temporary folder beside the final one; after a barrier rank 0
writes COMPLETE, renames the folder into place and then points `latest` at it (a temporary file and
`os.replace`). Only then are this run's checkpoints beyond the newest --save_total_limit deleted (never another
run's: `claim_output_dir` locks the output folder for one run and settles an earlier run's checkpoints and
leftovers before training starts). The output folder must be
on a file system every rank sees (as DeepSpeed's own checkpoints assume). Own state is JSON and safetensors,
never pickle (DeepSpeed's engine files are its own `torch.save` format).
"""
import contextlib
import fnmatch
import hashlib
import json
import os
import random
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

from utils.data.data_utils import KNOWN_NAMES
from utils.model.save import (MODEL_FILE_PATTERNS, TRAINING_SETTINGS, gather_state_dict, load_safetensors,
                              release_prefetched, save_safetensors)
from utils.runtime.dist import barrier, print_rank_0
from utils.runtime.errors import ChatRLHFError, ConfigError, error_line, interrupt_hint, interrupts_deferred, on_exit
from utils.runtime.paths import (claim_folder, delete_leftovers, make_temp_dir_beside, replace_dir,
                                 write_file_atomic)
from utils.runtime.progress import is_rank_0
from utils.trainer.monitor import HISTORY, PARTIAL_HISTORY

CHECKPOINTS = "checkpoints"
LATEST = "latest"
COMPLETE = "COMPLETE"
NAME = re.compile(r"step(\d+)")
RESUME_HINT = "resume with --resume"
"""What an interrupted run's line adds once its output folder holds a checkpoint to resume from (not before)."""
NOT_COMPARED = ("output_dir",)
"""Recorded flags a resume does not compare: the folder the checkpoint was found in is the run's, moved, copied or
reached through a symbolic link."""
DATA_DIGEST = "data_digest"
"""Recorded with the flags: samples_digest of the data the run trains on."""
COMPARED_LABELS = {"processes": "processes:", DATA_DIGEST: "the data's samples (sha256):"}
"""What a resume's refusal calls the recorded entries that are no flags."""
PATH_FLAGS = ("data_path", "model_name_or_path", "actor_model_name_or_path", "critic_model_name_or_path",
              "ref_model_name_or_path", "unsupervised_dataset_name", "reward_fn")
"""Recorded flags that may name local paths: compared as the files they name (absolute, links followed), so that
`data/x.jsonl` and `/home/me/data/x.jsonl` are the same data."""


def checkpoint_name(step):
    return f"step{step}"


def checkpoint_step(path):
    """The step of a checkpoint folder `stepN`; None for any other name (temporary folders included)."""
    match = NAME.fullmatch(Path(path).name)
    return int(match.group(1)) if match else None


def is_complete(path):
    """A checkpoint folder that was written to the end: named stepN and holding the COMPLETE marker."""
    path = Path(path)
    return checkpoint_step(path) is not None and (path / COMPLETE).is_file()


def latest_checkpoint(root):
    """The checkpoint to resume from in `root` (a `checkpoints/` folder): the one `latest` names if it is complete,
    else the complete one of the highest step (a run killed between the rename and the pointer); None if none."""
    return next(iter(_resume_order(root)), None)


def _resume_order(root):
    """Complete checkpoints in the order --resume tries them: the one `latest` names, then the others from the
    highest step down."""
    root = Path(root)
    pointer = root / LATEST
    named = pointer.read_text().strip() if pointer.is_file() else ""
    complete = sorted((path for path in root.iterdir() if is_complete(path)), key=checkpoint_step,
                      reverse=True) if root.is_dir() else []
    first = [path for path in complete if path.name == named]
    return first + [path for path in complete if path.name != named]


def newest_good_checkpoint(root):
    """(the checkpoint to resume from, [(a newer one skipped, why), ...]): the first of `latest_checkpoint`'s
    order whose files match the sizes and checksums written with it."""
    damaged = []
    for path in _resume_order(root):
        problem = verify_checkpoint(path)
        if problem is None:
            return path, damaged
        damaged.append((path, problem))
    return None, damaged


def file_manifest(folder):
    """{relative path: [size in bytes, sha256]} of every file under `folder`."""
    return {str(path.relative_to(folder)): [path.stat().st_size, _sha256(path)]
            for path in sorted(Path(folder).rglob("*")) if path.is_file()}


def _sha256(path):
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def verify_checkpoint(path):
    """None if every file the checkpoint's COMPLETE lists is there with its size and checksum, else what is
    wrong; a COMPLETE that cannot be read or lists no files is wrong too (every checkpoint lists its files)."""
    try:
        complete = json.loads((Path(path) / COMPLETE).read_text())
    except (OSError, ValueError):
        return f"its {COMPLETE} cannot be read"
    files = complete.get("files") if isinstance(complete, dict) else None
    if not isinstance(files, dict) or not files or not all(
            isinstance(entry, list) and len(entry) == 2 for entry in files.values()):
        return f"its {COMPLETE} lists no files with their sizes and checksums"
    for name, (size, digest) in files.items():
        file = Path(path) / name
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != size:
            return f"{name} has {file.stat().st_size} bytes, not the {size} written"
        if _sha256(file) != digest:
            return f"{name} does not match the checksum written with it"
        problem = _pickle_problem(file) if name.endswith(".pt") else None
        if problem:
            return f"{name} {problem}"
    return None


DEEPSPEED_STATE_GLOBALS = frozenset({
    "deepspeed.runtime.fp16.loss_scaler.LossScaler", "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.runtime.zero.config.ZeroStageEnum", "deepspeed.utils.tensor_fragment.fragment_address"})
"""The classes beyond torch's weights-only set that DeepSpeed's optimizer states pickle (ZeRO 1-3, bf16, fp16's
loss scaler): data holders whose construction runs no code of the file's choosing."""


def _pickle_problem(file):
    """Why a .pt file of a checkpoint must not be loaded, or None. DeepSpeed's resume unpickles its files in full
    (not weights-only), and a folder's checksums prove nothing against one made to pass them: a file that is not a
    torch.save archive, or whose pickle names globals beyond torch's weights-only set and DEEPSPEED_STATE_GLOBALS
    (code that loading would run), is refused before any of it is loaded."""
    from torch.serialization import get_unsafe_globals_in_checkpoint

    try:
        unsafe = [name for name in get_unsafe_globals_in_checkpoint(str(file)) if name not in DEEPSPEED_STATE_GLOBALS]
    except Exception:  # a legacy pickle, or no archive at all: torch.load would unpickle it
        return "is not a torch.save archive"
    return f"would load Python objects beyond tensors ({', '.join(unsafe[:3])})" if unsafe else None


def checkpoints_in(root):
    """The checkpoint folders (complete or not) in `root`, by step."""
    root = Path(root)
    found = [path for path in root.iterdir() if path.is_dir() and checkpoint_step(path) is not None] \
        if root.is_dir() else []
    return sorted(found, key=checkpoint_step)


# ---- the output folder -------------------------------------------------------------------------------------------


DISCARD = set()
"""The checkpoint roots whose earlier run's checkpoints --overwrite_output_dir deletes when this run's Checkpointer
is made (claim_output_dir)."""


def claim_output_dir(args, inputs=None, model_dirs=None):
    """Settle everything about --output_dir that could fail late or do harm, before any data or model is loaded.
    Rank 0 checks; every rank raises the same ConfigError if a check fails.

    - what every tool's output folder is checked for (utils.runtime.paths.claim_folder): it can be written; no
      input model folder (`inputs`: {flag: path}) is a folder the run saves a model into (`model_dirs`, default:
      the output folder itself), which the save would replace; no other run uses it (a lock held until this
      process's main ends, naming its PID);
    - a fresh run does not start over an earlier run's checkpoints (its pruning would delete them): --resume
      continues them, --overwrite_output_dir deletes them (DISCARD), not here but once the run's data and models
      have loaded (its Checkpointer is made), so that a run refused for its input loses nothing;
    - temporary folders and files left by an interrupted save are deleted.
    Folders it had to create are removed at exit if the run left them empty (or holding its monitor's history
    alone: a run that failed before its first checkpoint or save). An interruption says "resume with --resume"
    from the moment there is a checkpoint to resume from.
    """
    message = None
    if is_rank_0():
        try:
            _claim_output_dir(Path(args.output_dir), args.resume, args.overwrite_output_dir, inputs or {},
                              model_dirs)
        except ChatRLHFError as err:
            message = str(err)
    message = _broadcast(message)
    if message is not None:
        raise ConfigError(message)


def _check_replaceable(folder, overwrite):
    """Refuse a folder the run saves a model into that holds files the save would replace (MODEL_FILE_PATTERNS: a
    config.json, a README.md, vocab files...) but no model of this project's (its TRAINING_SETTINGS): someone
    else's model or files, not an earlier run's output. --overwrite_output_dir lets the save replace them."""
    if overwrite or not folder.is_dir() or (folder / TRAINING_SETTINGS).is_file():
        return
    replaced = sorted(path.name for path in folder.iterdir()
                      if any(fnmatch.fnmatch(path.name, pattern) for pattern in MODEL_FILE_PATTERNS))
    if replaced:
        raise ConfigError(f"--output_dir: {folder} holds files the trained model's save would replace "
                          f"({', '.join(replaced[:4])}{', ...' if len(replaced) > 4 else ''}) and no model of an "
                          "earlier run; pick another --output_dir, or pass --overwrite_output_dir to replace them")


def _claim_output_dir(out, resume, overwrite, inputs, model_dirs):
    claim_folder(out, "--output_dir", {flag: path for flag, path in inputs.items() if Path(path).is_dir()},
                 model_dirs=model_dirs or [out], scratch=(HISTORY, PARTIAL_HISTORY))
    on_exit(lambda: interrupt_hint(None))
    for folder in model_dirs or [out]:
        _check_replaceable(Path(folder), overwrite)
    root = out / CHECKPOINTS
    earlier = checkpoints_in(root)
    if earlier and not resume:
        if not overwrite:
            names = ", ".join(path.name for path in earlier)
            raise ConfigError(f"--output_dir {out} holds checkpoints of an earlier run ({names}); pass --resume to "
                              "continue it, --overwrite_output_dir to delete them and start over, or pick another "
                              "--output_dir")
        DISCARD.add(root.resolve())
        print_rank_0(f"--overwrite_output_dir: the earlier run's checkpoints in {root} are deleted once this run's "
                     "data and models have loaded")
    if resume and latest_checkpoint(root) is not None:
        interrupt_hint(RESUME_HINT)
    delete_leftovers(out, root, say=print_rank_0)


# ---- random states, as JSON --------------------------------------------------------------------------------------


def python_random_state(generator=random):
    """`random.getstate()` (of the module or a `random.Random`) as JSON-ready lists."""
    version, internal, gauss_next = generator.getstate()
    return [version, list(internal), gauss_next]


def set_python_random_state(state, generator=random):
    version, internal, gauss_next = state
    generator.setstate((version, tuple(internal), gauss_next))


def rng_state():
    """The states of every random generator a step draws from: Python, NumPy, torch on the CPU and on each CUDA
    device (this rank's view)."""
    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    state = {"python": python_random_state(),
             "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached_gaussian)],
             "torch": torch.get_rng_state().tolist()}
    if torch.cuda.is_available():
        state["cuda"] = [device_state.tolist() for device_state in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state):
    set_python_random_state(state["python"])
    name, keys, pos, has_gauss, cached_gaussian = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached_gaussian))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["cuda"]])


# ---- where a run is in its data ----------------------------------------------------------------------------------


class TrainingPosition:
    """Where a run is: the epoch, the batches of it already consumed, the shuffling sampler's state at the epoch's
    start, and (when resumed) the random states to continue with.

        position = TrainingPosition(train_loader)
        for epoch in position.epochs(num_train_epochs):
            for micro_step, batch in position.batches(epoch):   # micro_step counts from the epoch's start
                ...

    A resumed position re-shuffles the epoch exactly as before (the single-process sampler's generator is put
    back to its state at the epoch's start; a DistributedSampler shuffles by seed and epoch alone), skips the
    batches already consumed, and only then restores the random states: creating a DataLoader iterator draws from
    torch's global generator, so restoring them earlier would shift every later draw by one.
    """

    def __init__(self, loader):
        self.loader = loader
        self.epoch = 0
        self.consumed = 0
        self._sampler_state = None
        self._resume_rng = None

    def epochs(self, num_epochs):
        return range(self.epoch, num_epochs)

    def batches(self, epoch):
        sampler = self.loader.sampler
        resuming = self._resume_rng is not None and epoch == self.epoch
        if not resuming:
            self.epoch, self.consumed, self._sampler_state = epoch, 0, None
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        generator = getattr(sampler, "generator", None)
        if generator is not None:
            if self._sampler_state is not None:
                generator.set_state(torch.tensor(self._sampler_state, dtype=torch.uint8))
            self._sampler_state = generator.get_state().tolist()
        iterator = iter(self.loader)
        skip = self.consumed
        for _ in range(skip):
            next(iterator)
        if resuming:
            set_rng_state(self._resume_rng)
            self._resume_rng = None
        for micro_step, batch in enumerate(iterator, start=skip):
            self.consumed = micro_step + 1
            yield micro_step, batch

    def state_dict(self):
        return {"epoch": self.epoch, "consumed": self.consumed, "sampler_state": self._sampler_state}

    def load_state_dict(self, state, rng=None):
        """Go back to `state`; `rng` (from `rng_state()`) is restored once the resumed epoch has been reached."""
        self.epoch, self.consumed, self._sampler_state = state["epoch"], state["consumed"], state["sampler_state"]
        self._resume_rng = rng


class CountingIterator:
    """An iterator that counts the items drawn from it, so that a resumed run can skip as many (step 3's endless
    cycle of pretraining batches)."""

    def __init__(self, iterable):
        self.iterator, self.drawn = iter(iterable), 0

    def __iter__(self):
        return self

    def __next__(self):
        item = next(self.iterator)
        self.drawn += 1
        return item

    def skip(self, count):
        for _ in range(count):
            next(self)


# ---- saving and resuming -----------------------------------------------------------------------------------------


class Checkpointer:
    """Saves and resumes the checkpoints of one run in `<output_dir>/checkpoints/`.

    engines   {name: DeepSpeed engine} trained with an optimizer: saved with `engine.save_checkpoint`
    weights   {name: DeepSpeed engine} without an optimizer (step 3's EMA): its weights as safetensors
    tensors   {name: object} whose `state_tensors()` (the same on every rank) rank 0 saves as safetensors and whose
              `load_state_tensors(tensors)` every rank is given on resume (step 3's best weights)
    position  the run's TrainingPosition
    flags     the flags that shape training (utils.runtime.args.training_flags): recorded with each checkpoint, and a
              resume with other ones is refused, naming each difference

    Every rank must call `save_if_due`, `save` and `resume` (they gather, and wait for each other).
    """

    def __init__(self, output_dir, save_steps, save_total_limit, engines, position, weights=None, flags=None,
                 tensors=None):
        self.root = Path(output_dir) / CHECKPOINTS
        self.flags = resolved_flags(flags or {})
        self.save_steps, self.save_total_limit = save_steps, save_total_limit
        self.engines, self.position = engines, position
        self.weights = {name: engine for name, engine in (weights or {}).items() if engine is not None}
        self.tensors = {name: holder for name, holder in (tensors or {}).items() if holder is not None}
        self.last_step = 0
        self.kept = []  # this run's checkpoints, oldest first (a fresh run does not count an earlier run's)
        if self.root.resolve() in DISCARD:  # --overwrite_output_dir, now that the run's inputs have loaded
            DISCARD.discard(self.root.resolve())
            if is_rank_0() and self.root.is_dir():
                shutil.rmtree(self.root)
                print_rank_0(f"--overwrite_output_dir: deleted the earlier run's checkpoints in {self.root}")

    def due(self, step, total_steps):
        """True at the first step at or after each multiple of save_steps, and at the last step."""
        if self.save_steps <= 0 or step <= self.last_step:
            return False
        return step // self.save_steps > self.last_step // self.save_steps or step >= total_steps

    def save_if_due(self, step, total_steps, state):
        if self.due(step, total_steps):
            self.save(step, state)

    def save(self, step, state):
        """Write checkpoint `stepN` (`state`: the trainer's own JSON-ready state), atomically; then point `latest`
        at it and delete the checkpoints beyond the newest save_total_limit. SIGINT/SIGTERM wait for its end."""
        with interrupts_deferred():
            self._save(step, state)

    def _save(self, step, state):
        for name, engine in {**self.engines, **self.weights}.items():
            check_finite_weights(engine.module, f"the {name} weights after step {step}")
        rank, world_size = _rank_and_world_size()
        target = self.root / checkpoint_name(step)
        tmp = None
        if rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = make_temp_dir_beside(target)
        tmp = Path(_broadcast(str(tmp) if rank == 0 else None))
        try:
            self._write(step, state, tmp, target, rank, world_size)
        except Exception as err:  # a full disk (torch.save's "unexpected pos", ENOSPC...): the last one is kept
            last = latest_checkpoint(self.root)
            kept = (f"the last complete checkpoint, {last}, is kept: free some space and resume with --resume"
                    if last is not None else "there is no earlier checkpoint: free some space and run again")
            raise ChatRLHFError(f"could not write the checkpoint {target} ({error_line(err)}); {kept}") from None
        finally:
            if rank == 0 and tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
                with contextlib.suppress(OSError):
                    self.root.rmdir()  # made for this checkpoint, which failed: the folder as it was
        barrier()
        self.last_step = step
        interrupt_hint(RESUME_HINT)
        print_rank_0(f"saved checkpoint {target}")

    def _write(self, step, state, tmp, target, rank, world_size):
        """Write the checkpoint into `tmp` and, on rank 0, move it into place as `target` and point `latest` at
        it."""
        for name, engine in self.engines.items():
            engine.save_checkpoint(str(tmp), tag=name, save_latest=False)
        for name, engine in self.weights.items():
            _save_weights(engine, tmp / f"{name}.safetensors")
        for name, holder in self.tensors.items():
            if rank == 0:
                save_safetensors(holder.state_tensors(), tmp / f"{name}.safetensors")
        _write_json(tmp / f"position_rank{rank}.json",
                    {"data": self.position.state_dict(), "rng": rng_state()})
        if rank == 0:
            micro_steps = {name: engine.micro_steps for name, engine in self.engines.items()}
            _write_json(tmp / "state.json", {"step": step, "world_size": world_size, "micro_steps": micro_steps,
                                             "flags": self._flags(), "trainer": state})
        barrier()
        if rank == 0:
            _write_json(tmp / COMPLETE, {"step": step, "files": file_manifest(tmp)})
            replace_dir(tmp, target)
            write_file_atomic(self.root / LATEST, lambda f: f.write(target.name + "\n"))
            self.kept = [path for path in self.kept if path != target] + [target]
            self._prune()

    def resume(self, trainer_shape=None):
        """Load the latest complete checkpoint into the engines, weights and position, and return the trainer's
        state saved with it plus its `step`; None (and a fresh start) when there is no checkpoint yet.
        `trainer_shape`: the shape of that state (see `json_shape_problem`), checked before anything is loaded."""
        path, problem = None, None
        if is_rank_0():
            path, damaged = newest_good_checkpoint(self.root)
            for skipped, why in damaged:
                print(f"warning: --resume: skipping {skipped}, damaged: {why}", file=sys.stderr, flush=True)
            if path is None and damaged:
                problem = (f"--resume: no checkpoint in {self.root} is usable ("
                           f"{'; '.join(f'{skipped.name}: {why}' for skipped, why in damaged)}); start over with "
                           "--overwrite_output_dir")
            path = None if path is None else str(path)
        path, problem = _broadcast(path), _broadcast(problem)
        if problem:
            raise ChatRLHFError(problem)
        if path is None:
            print_rank_0(f"--resume: no complete checkpoint in {self.root}; starting from the beginning")
            return None
        path = Path(path)
        rank, world_size = _rank_and_world_size()
        saved = _read_json(path / "state.json")
        position = _read_json(path / f"position_rank{rank}.json")
        _check_saved_state(path, saved, position, {"step": 0, "world_size": 0, "flags": {},
                                                   "micro_steps": {name: 0 for name in self.engines},
                                                   "trainer": trainer_shape or {}})
        differences = flag_differences({**resolved_flags(saved["flags"]), "processes": saved["world_size"]},
                                       {**self._flags(), "processes": world_size})
        if differences:
            raise ConfigError(f"--resume: {path} was written with other flags: {'; '.join(differences)}. Resume "
                              "with the checkpoint's flags (only the README's 'may change on resume' list may "
                              "differ), or start over with --overwrite_output_dir or another --output_dir")
        for name, engine in self.engines.items():
            load_path, _ = engine.load_checkpoint(str(path), tag=name)
            if load_path is None:
                raise ChatRLHFError(f"--resume: could not load the {name} engine from {path}")
            engine.micro_steps = saved["micro_steps"][name]  # DeepSpeed restores global_steps, not micro_steps
        for name, engine in self.weights.items():
            _load_weights(engine, path / f"{name}.safetensors")
        for name, holder in self.tensors.items():
            holder.load_state_tensors(load_safetensors(path / f"{name}.safetensors"))
        self.position.load_state_dict(position["data"], rng=position["rng"])
        self.last_step = saved["step"]
        self.kept = sorted((p for p in self.root.iterdir() if is_complete(p) and checkpoint_step(p) <= self.last_step),
                           key=checkpoint_step)
        print_rank_0(f"resumed from {path} (step {self.last_step})")
        return {"step": saved["step"], **saved["trainer"]}

    def _flags(self):
        """The flags to record and compare, with the digest of the data the run trains on (DATA_DIGEST)."""
        if DATA_DIGEST not in self.flags and self.position is not None:
            self.flags[DATA_DIGEST] = samples_digest(self.position.loader.dataset)
        return self.flags

    def _prune(self):
        """Keep this run's newest save_total_limit checkpoints and delete its older ones; nothing else in
        `checkpoints/` is touched (claim_output_dir has settled an earlier run's). Rank 0, after `latest` moved."""
        for path in self.kept[:-self.save_total_limit]:
            shutil.rmtree(path, ignore_errors=True)
        self.kept = self.kept[-self.save_total_limit:]


PYTHON_RANDOM_SHAPE = [0, [0], (None, 0.0)]
"""The shape of python_random_state() (`json_shape_problem`)."""
POSITION_SHAPE = {"data": {"epoch": 0, "consumed": 0, "sampler_state": (None, [0])},
                  "rng": {"python": PYTHON_RANDOM_SHAPE, "numpy": ["", [0], 0, 0, 0.0], "torch": [0]}}
"""The shape of a position_rank<N>.json (`json_shape_problem`): TrainingPosition.state_dict() and rng_state()."""


def _check_saved_state(path, saved, position, state_shape):
    """Refuse, in one line, a checkpoint whose JSON files are not what this code writes (files made to pass the
    checksums in COMPLETE, or written by other code): their shape, and random states that the generators take."""
    rank, _ = _rank_and_world_size()
    problem = (json_shape_problem(saved, state_shape, "state.json")
               or json_shape_problem(position, POSITION_SHAPE, f"position_rank{rank}.json"))
    if problem is None:
        try:  # on generators of their own: the run's are set when the resumed epoch is reached
            _random_states_taken(position)
        except Exception as err:  # each library its own kinds (numpy's IndexError, torch's RuntimeError...)
            problem = f"position_rank{rank}.json: a random state no generator takes ({error_line(err)})"
    if problem is not None:
        raise ChatRLHFError(f"--resume: {path} cannot be resumed: {problem}; start over with --overwrite_output_dir")


def _random_states_taken(position):
    """Set the position's random states on new generators (errors as the run's own would raise them)."""
    set_python_random_state(position["rng"]["python"], random.Random())
    name, keys, pos, has_gauss, cached_gaussian = position["rng"]["numpy"]
    np.random.RandomState().set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached_gaussian))
    for state in (position["rng"]["torch"], position["data"]["sampler_state"]):
        if state is not None:
            torch.Generator().set_state(torch.tensor(state, dtype=torch.uint8))


def json_shape_problem(value, shape, where):
    """Where `value` (read from JSON) is not of `shape`, in words, or None. A shape is an example of what this
    code writes: a dict's keys must all be there (others may be too), each of its value's shape, except that a key
    "*" gives the shape of every other key's value; a list of one item: a list whose items are all of its shape
    ([]: any items); of several: a list of as many items, each of its own shape (a record); a number, string or bool stands for its type (an int for an int, a float for any number); a
    tuple for any one of its shapes; None for None."""
    if isinstance(shape, tuple):
        problems = [json_shape_problem(value, one, where) for one in shape]
        return None if None in problems else problems[-1]
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return f"{where} is {_json_kind(value)}, not an object"
        for key, item in value.items():
            if key in shape or "*" in shape:
                problem = json_shape_problem(item, shape.get(key, shape.get("*")), f"{where}.{key}")
                if problem:
                    return problem
        missing = [key for key in shape if key != "*" and key not in value]
        return f"{where} has no \"{missing[0]}\"" if missing else None
    if isinstance(shape, list):
        if not isinstance(value, list):
            return f"{where} is {_json_kind(value)}, not a list"
        if len(shape) > 1 and len(value) != len(shape):
            return f"{where} has {len(value)} items, not {len(shape)}"
        for index, item in enumerate(value if shape else ()):
            problem = json_shape_problem(item, shape[index if len(shape) > 1 else 0], f"{where}[{index}]")
            if problem:
                return problem
        return None
    kinds = {bool: (bool,), int: (int,), float: (int, float), str: (str,), type(None): (type(None),)}[type(shape)]
    if isinstance(value, kinds) and (isinstance(value, bool) == isinstance(shape, bool)):
        return None
    return f"{where} is {_json_kind(value)}, not {_json_kind(shape)}"


def _json_kind(value):
    """What a JSON value is, in words."""
    if isinstance(value, bool):
        return "true or false"
    for kind, words in ((type(None), "null"), (int, "a whole number"), (float, "a number"), (str, "a string"),
                        (list, "a list"), (dict, "an object")):
        if isinstance(value, kind):
            return words
    return type(value).__name__


def samples_digest(dataset):
    """The sha256 of a dataset's samples as the step built them (token ids, texts): a resume whose data differs
    from the checkpoint's (a file changed at the same path, another tokenizer, another reasoning-gym version) is
    refused rather than trained on as if it were the same."""
    digest = hashlib.sha256()
    for index in range(len(dataset)):  # under a second for 10,000 samples of 200 tokens
        digest.update(json.dumps(dataset[index], sort_keys=True, default=_values).encode())
    return digest.hexdigest()[:16]


def _values(value):
    return value.tolist()  # a tensor's (or a NumPy array's)


def resolved_flags(flags):
    """`flags` with the local paths of PATH_FLAGS made absolute, symbolic links followed (a name that is no local
    path, a hub model or data set, `builtin`, stays as it is)."""
    return {name: _resolved(value) if name in PATH_FLAGS else value for name, value in flags.items()}


def _resolved(value):
    if isinstance(value, list):
        return [_resolved(item) for item in value]
    if not isinstance(value, str) or not value:
        return value
    path, suffix = value, ""
    if ":" in value and not os.path.exists(value):  # path/to/file.py:function (a reward function)
        path, _, function = value.rpartition(":")
        suffix = f":{function}"
    if path in KNOWN_NAMES or not os.path.exists(os.path.expanduser(path)):
        return value
    return str(Path(os.path.expanduser(path)).resolve()) + suffix


def flag_differences(saved, current):
    """`--name <saved> (now <current>)` for each flag both record with different values; a flag only one of them
    knows (added or removed by another version of the code), and NOT_COMPARED, are not compared."""
    differences = []
    for name in sorted((saved.keys() & current.keys()) - set(NOT_COMPARED)):
        if saved[name] != current[name]:
            label = COMPARED_LABELS.get(name, f"--{name}")
            differences.append(f"{label} {_flag_text(saved[name])} (now {_flag_text(current[name])})")
    return differences


def _flag_text(value):
    if isinstance(value, list):
        return " ".join(map(str, value))
    return json.dumps(value, separators=(",", ":")) if isinstance(value, dict) else str(value)


def check_finite_weights(module, what):
    """Refuse to checkpoint weights that hold a NaN or inf (this rank's partition under ZeRO-3): the last good
    checkpoint stays the latest."""
    with torch.no_grad():
        for param in module.parameters():
            local = param.ds_tensor if hasattr(param, "ds_tensor") else param
            if not torch.isfinite(local).all():
                raise ChatRLHFError(f"{what} are not finite: stopping without writing a checkpoint (the last one "
                                    "is kept; try a lower learning rate)")


def _save_weights(engine, path):
    release_prefetched(engine)
    state_dict = gather_state_dict(engine.module, engine.zero_optimization_stage())
    if state_dict is not None:
        save_safetensors(state_dict, path)


def _load_weights(engine, path):
    """Copy saved weights into `engine.module` in place (gathered, then re-partitioned, under ZeRO-3)."""
    import deepspeed


    tensors = load_safetensors(path)
    zero3 = engine.zero_optimization_stage() == 3
    persistent = set(engine.module.state_dict().keys())
    with torch.no_grad():
        for name, param in engine.module.named_parameters():
            with deepspeed.zero.GatheredParameters([param], modifier_rank=0, enabled=zero3):
                param.copy_(tensors[name])
        for name, buffer in engine.module.named_buffers():
            if name in persistent:
                buffer.copy_(tensors[name])


def _rank_and_world_size():
    if torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _broadcast(value):
    """Rank 0's `value` (a string or None) on every rank."""
    if not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
        return value
    box = [value]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def _write_json(path, value):
    with open(path, "w") as f:
        json.dump(value, f)


def _read_json(path):
    with open(path) as f:
        return json.load(f)
