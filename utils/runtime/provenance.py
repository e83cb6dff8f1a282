"""Where a measurement was made: the CPU (its model name and whether it has native bf16, which decides the dtype
`--dtype auto` picks and how fast bf16 runs) and the code's commit. A run's report, the model cards, the bench's
pages and the seed tables all name them through `cpu_name` and `code_commit`."""
import platform
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

NATIVE_BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")
"""CPU flags (/proc/cpuinfo) of native bf16 matmuls: Intel AMX, AVX-512 BF16 (Intel Cooper Lake+, AMD Zen 4+).
Without them PyTorch emulates bf16 through fp32 conversions, many times slower than fp32 (docs/performance.md)."""


def read_cpuinfo():
    """/proc/cpuinfo's text ("" where there is none: not Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:
        return ""


def native_bf16_flags(cpuinfo):
    """The NATIVE_BF16_CPU_FLAGS present on the first `flags` line of /proc/cpuinfo text."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return [flag for flag in NATIVE_BF16_CPU_FLAGS if flag in value.split()]
    return []


def cpu_model(cpuinfo=None):
    """The CPU's model name (/proc/cpuinfo's first `model name`, else the platform's)."""
    cpuinfo = read_cpuinfo() if cpuinfo is None else cpuinfo
    names = [line.partition(":")[2].strip() for line in cpuinfo.splitlines() if line.startswith("model name")]
    return names[0] if names else platform.processor() or platform.machine() or "unknown CPU"


def cpu_name(cpuinfo=None):
    """The CPU and its bf16: "<model>, native bf16" or "<model>, no native bf16 (fp32)"."""
    cpuinfo = read_cpuinfo() if cpuinfo is None else cpuinfo
    bf16 = "native bf16" if native_bf16_flags(cpuinfo) else "no native bf16 (fp32)"
    return f"{cpu_model(cpuinfo)}, {bf16}"


def gpu_name():
    """The CUDA GPUs as "<count> x <name>", or None where torch sees none."""
    import torch

    if not torch.cuda.is_available():
        return None
    return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"


def code_commit(root=ROOT):
    """This clone's commit (short), with " + uncommitted changes" where its tracked files differ from it;
    "unknown" outside a git clone."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30, check=True
                              ).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + (" + uncommitted changes" if dirty else "")
