"""Small helpers every step uses: distributed start-up, seeding, rank-0 printing, device moves."""
import os
import random
import socket
import warnings

import numpy as np
import torch


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

    deepspeed.init_distributed(verbose=False)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    accelerator = get_accelerator()
    if accelerator.device_name() == "cpu":
        device = torch.device("cpu")
    else:
        accelerator.set_device(local_rank)
        device = torch.device(accelerator.device_name(local_rank))
    return torch.distributed.get_rank(), torch.distributed.get_world_size(), local_rank, device


def free_port():
    """A TCP port free on this machine now, for a rendezvous (a world of one, or a launcher's master port)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def is_rank_0():
    return not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0


def print_rank_0(*args, **kwargs):
    if is_rank_0():
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
    if not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
        return value
    value = value.detach().clone()
    torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.SUM)
    return value


def all_reduce_mean(value):
    """Mean of a scalar tensor over all ranks (the tensor itself on a world of one)."""
    if not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
        return value
    return all_reduce_sum(value) / torch.distributed.get_world_size()


def threads_per_process(num_processes):
    """The OMP thread count that keeps `num_processes` from oversubscribing this machine's cores."""
    return max(1, (os.cpu_count() or 1) // max(1, num_processes))


def quiet_transformers():
    """Silence transformers' per-load progress bars and advisory warnings; errors still show."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def assert_finite(value, what):
    """Stop the run with one clear line on a NaN or inf loss, before it reaches the weights."""
    if not torch.isfinite(value).all():
        from utils.runtime.errors import ChatRLHFError

        raise ChatRLHFError(f"{what} is {value.item()}: stopping (try a lower learning rate or --dtype fp32)")
