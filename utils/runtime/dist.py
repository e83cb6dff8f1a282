"""Small helpers every step uses: distributed start-up, seeding, rank-0 printing, device moves."""
import os
import random
import socket
import warnings
from pathlib import Path

import numpy as np
import torch

from utils.runtime.errors import ChatRLHFError
from utils.runtime.progress import is_rank_0, log_line


def init_distributed():
    """Start torch.distributed through DeepSpeed and return (rank, world_size, local_rank, device).

    Under the `deepspeed` launcher (or torchrun) the environment already names the rank and the world; a plain
    `python main.py` runs as a world of one, so the same script works both ways.
    """
    # DeepSpeed 0.19 still calls collectives that torch 2.13 deprecates: one warning per call, nothing to act on.
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.\w+` is deprecated", category=FutureWarning)
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    if os.environ.get("WORLD_SIZE") == "1":
        skip_shared_memory_op_build()
    else:
        check_op_build_lock("deepspeed_shm_comm")
    deepspeed.init_distributed(verbose=False)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    accelerator = get_accelerator()
    if accelerator.device_name() == "cpu":
        device = torch.device("cpu")
        unlink_shared_memory_buffer()
    else:
        accelerator.set_device(local_rank)
        device = torch.device(accelerator.device_name(local_rank))
    return torch.distributed.get_rank(), torch.distributed.get_world_size(), local_rank, device


def skip_shared_memory_op_build():
    """DeepSpeed compiles its shared-memory all-reduce op (C++, once per machine, a minute) whenever it starts
    torch.distributed on a CPU, also for a world of one that never reduces anything: not there."""
    import importlib

    backend = importlib.import_module("deepspeed.comm.torch")  # (the attribute deepspeed.comm.torch is torch)
    if hasattr(backend, "build_shm_op"):
        backend.build_shm_op = lambda: None


def unlink_shared_memory_buffer():
    """Remove the name of this rank's buffer of DeepSpeed's shared-memory all-reduce (a CPU world whose ranks are
    all on this machine), keeping the buffer. DeepSpeed 0.19 maps a 69 MB buffer per rank from /dev/shm and never
    unlinks it, so every run of two processes left 138 MB of memory taken until a reboot (14 GB on one machine here
    after a day of test runs). Once every rank has mapped every rank's buffer (DeepSpeed's start-up, then the
    barrier), the names are no longer needed: the memory stays mapped while the processes run and is freed when the
    last one ends, however it ends."""
    world_size = os.environ.get("WORLD_SIZE", "1")
    if world_size == "1" or os.environ.get("LOCAL_SIZE") != world_size:  # no shared-memory all-reduce
        return
    torch.distributed.barrier()
    name = (f"deepspeed_allreduce_buffer_{os.getuid()}_{os.environ.get('MASTER_ADDR', '')}_"
            f"{os.environ.get('MASTER_PORT', '')}_{torch.distributed.get_rank()}")
    (Path("/dev/shm") / name).unlink(missing_ok=True)


def check_op_build_lock(name):
    """Refuse to start on a torch-extension build lock that no build holds. torch builds an op (`name`) under a
    `lock` file in its build folder and waits, silently and forever, while that file exists; a build killed half-way
    leaves it behind. The building process holds the file open, so a lock no process has open is stale."""
    import time

    from torch.utils.cpp_extension import _get_build_directory

    lock = Path(_get_build_directory(name, verbose=False)) / "lock"
    for _ in range(2):  # a build that just ended closes its lock, then deletes it: look twice
        if not lock.exists() or _processes_holding(lock):
            return
        time.sleep(1.0)
    if lock.exists():
        raise ChatRLHFError(f"{lock} is left by a build of DeepSpeed's {name} op that was stopped half-way (no "
                            f"process has it open): remove that file and start again (the op is then built anew)")


def _processes_holding(path):
    """PIDs of the processes (that this user may inspect) with `path` open."""
    holders = []
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            if any(os.readlink(fd) == str(path) for fd in fd_dir.iterdir()):
                holders.append(int(fd_dir.parent.name))
        except OSError:
            continue
    return holders


def free_port():
    """A TCP port free on this machine now, for a rendezvous (a world of one, or a launcher's master port)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def print_rank_0(*args, **kwargs):
    """print on rank 0, above any progress bar (utils/runtime/progress.py), never through it."""
    if is_rank_0():
        with log_line(kwargs.get("file")):
            print(*args, **kwargs, flush=True)


def barrier():
    if torch.distributed.is_initialized():
        torch.distributed.barrier()


def set_random_seed(seed):
    """Seed Python, NumPy and torch (all devices) so a run is reproducible."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    from deepspeed.accelerator import get_accelerator

    get_accelerator().manual_seed_all(seed)


def to_device(batch, device):
    """Move every tensor of a dict batch to `device` (non-tensors pass through)."""
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}


def all_reduce_sum(value):
    """Sum of a tensor over all ranks, element by element (the tensor itself on a world of one)."""
    return _all_reduce(value, torch.distributed.ReduceOp.SUM)


def all_reduce_min(value):
    """Minimum of a tensor over all ranks, element by element (the tensor itself on a world of one)."""
    return _all_reduce(value, torch.distributed.ReduceOp.MIN)


def _all_reduce(value, op):
    if not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
        return value
    value = value.detach().clone()
    torch.distributed.all_reduce(value, op=op)
    return value


def all_reduce_mean(value):
    """Mean of a scalar tensor over all ranks (the tensor itself on a world of one)."""
    if not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
        return value
    return all_reduce_sum(value) / torch.distributed.get_world_size()


def quiet_transformers():
    """Silence transformers' per-load progress bars and advisory warnings; errors still show."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def assert_finite(value, what):
    """Stop the run with one clear line on a NaN or inf loss, before it reaches the weights."""
    if not torch.isfinite(value).all():
        raise ChatRLHFError(f"{what} is {value.item()}: stopping (try a lower learning rate or --dtype fp32)")
