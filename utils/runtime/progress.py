"""Progress bars of the long loops (training, evaluation, scoring, the bench), one way for all: tqdm on stderr, shown
only on rank 0 and only when both stdout and stderr are terminals (a log file, a pipe or `train.py`'s per-step log
gets none), and never torn by the log lines: `print_rank_0` writes above the bars (`log_line`)."""
import contextlib
import itertools
import sys

import torch

# tqdm redraws at most this often (seconds): a bar costs nothing next to a training step.
MIN_INTERVAL = 1.0


def is_rank_0():
    """Whether this process is rank 0 (or alone): the one that prints, logs and draws bars."""
    return not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0


def show_progress(streams=None):
    """Whether this process draws progress bars: rank 0, and every one of `streams` (default stdout and stderr)
    is a terminal."""
    streams = (sys.stdout, sys.stderr) if streams is None else streams
    return is_rank_0() and all(_isatty(stream) for stream in streams)


def progress(iterable=None, *, total=None, desc=None, unit="it", initial=0, leave=False, disable=False):
    """A tqdm bar over `iterable` (or one updated by hand, `total` long), disabled where show_progress() says so
    (or by `disable`). The bar is cleared when done (`leave=False`): the log lines keep the record."""
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=desc, unit=unit, initial=initial, leave=leave, file=sys.stderr,
                disable=disable or not show_progress(), mininterval=MIN_INTERVAL, dynamic_ncols=True)


def eval_batches(loader, eval_iters=0):
    """The batches of an evaluation, under a bar: the whole `loader`, or its first `eval_iters` batches (0: all)."""
    total = min(len(loader), eval_iters) if eval_iters else len(loader)
    return progress(itertools.islice(loader, total), total=total, desc="eval", unit="batch")


@contextlib.contextmanager
def log_line(file=None):
    """Print a line (to `file`, default stdout) inside this block: the bars are cleared first and redrawn after,
    so a line never lands in the middle of a bar (tqdm's external_write_mode)."""
    tqdm = sys.modules["tqdm"].tqdm if "tqdm" in sys.modules else None
    if tqdm is None or not getattr(tqdm, "_instances", None):  # no bar is shown: nothing to clear
        yield
        return
    with tqdm.external_write_mode(file=file or sys.stdout):
        yield


def _isatty(stream):
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # replaced by an object without isatty, or closed
        return False
