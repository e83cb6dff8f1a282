"""How the bench measures on a noisy shared machine: repeated runs after a warm-up, reported as min / median / max;
ours and a baseline alternated, with the ratio taken pair by pair; the peak FLOP/s of a matmul; peak RSS."""
import functools
import resource
import statistics
import time

import torch

from utils.runtime.progress import progress


def summarize(values):
    """{"min", "median", "max", "n"} of a list of numbers."""
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "n": len(values)}


def timed(fn, *args, **kwargs):
    """(result, seconds) of one call."""
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - start


def paired_rates(ours, baseline, repeats, warmup=1, desc=None):
    """Rates of `ours` and `baseline` (each `() -> ({unit: amount}, seconds)`) measured in alternation, and the
    ratio ours / baseline of each pair on the first unit, so a slow spell of the machine hits both sides of a
    ratio alike. The order inside a pair alternates too (ours first, then baseline first), so neither side always
    runs on a warmer cache. Returns {"ours": {unit: [...]}, "baseline": {unit: [...]}, "ratio": [...]}. `desc`:
    the label of the progress bar over the pairs."""
    bar = progress(total=warmup + repeats, desc=desc, unit="pair")
    for _ in range(warmup):
        ours()
        baseline()
        bar.update(1)
    result = {"ours": {}, "baseline": {}, "ratio": []}
    for index in range(repeats):
        order = ("ours", "baseline") if index % 2 == 0 else ("baseline", "ours")
        for side in order:
            _append_rates(result[side], *(ours if side == "ours" else baseline)())
        first = next(iter(result["ours"]))
        result["ratio"].append(result["ours"][first][-1] / result["baseline"][first][-1])
        bar.update(1)
    bar.close()
    return result


def _append_rates(rates, units, seconds):
    for unit, amount in units.items():
        rates.setdefault(unit, []).append(amount / seconds)


def summarize_tree(tree):
    """A copy of a nested dict with every list of numbers replaced by its summary."""
    if isinstance(tree, dict):
        return {key: summarize_tree(value) for key, value in tree.items()}
    if isinstance(tree, list) and tree and all(isinstance(v, (int, float)) for v in tree):
        return summarize(tree)
    return tree


@functools.cache
def matmul_size(dtype, max_size=2048, max_call_seconds=0.5):
    """The matrix size of this process's matmul peak in `dtype`: the largest power of two <= max_size whose one
    call is predicted (8x the call at half the size) to take at most max_call_seconds. A dtype with kernels for
    this CPU reaches max_size; one without (bf16 with no AMX / AVX-512 BF16: ~0.1-0.3 GFLOP/s, minutes for one
    2048^3 matmul) is measured on a smaller matrix. Chosen once per dtype and process."""
    size = 128
    while size < max_size:
        _, call = _timed_matmuls(dtype, size, 1)
        if call * 8 > max_call_seconds:
            break
        size *= 2
    return size


def matmul_flops(dtype, calls=4):
    """FLOP/s of `calls` square matmuls of `matmul_size(dtype)` in `dtype`, as this process sees it now (same
    threads): 2 size^3 FLOPs a call."""
    size = matmul_size(dtype)
    _, seconds = _timed_matmuls(dtype, size, calls)
    return 2 * size ** 3 * calls / seconds


def _timed_matmuls(dtype, size, calls):
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    return timed(lambda: [torch.mm(a, b) for _ in range(calls)])


def peak_matmul_flops(dtype, repeats=5):
    """The machine's peak in `dtype`: `matmul_flops` after one warm-up, `repeats` times (a list)."""
    matmul_flops(dtype)
    return [matmul_flops(dtype) for _ in range(repeats)]


def peak_rss_mb():
    """The largest resident set of this process so far, in MiB: VmHWM, which starts afresh at exec (ru_maxrss
    would carry over the high-water mark of the parent the process was forked from)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
