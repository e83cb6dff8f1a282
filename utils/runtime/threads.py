"""How many OpenMP threads each process gets and how its idle threads wait: decided here, once, for the launch
scripts (`python -m utils.runtime.threads --processes N` prints the shell exports) and for the python entry points,
which import this module before torch (OpenMP reads its settings when torch loads).

Two rules, each applied only where the user did not set the variable:
- OMP_NUM_THREADS: the idle CPUs this process may use (its affinity, less their measured busy share) divided by
  the processes sharing them, at least 1;
- OMP_WAIT_POLICY=PASSIVE (unless GOMP_SPINCOUNT is set): an idle OpenMP thread sleeps instead of spinning. With
  the GNU OpenMP torch ships, a spinning team of 2 on a 2-core machine where another process holds one core
  waits at every barrier for the thread the scheduler parked: step 1 of the quick start ran 6 s/step instead of
  0.3-0.6 (`python -m bench --sections threads` measures it).
"""
import os
import sys
import time

WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
SAMPLE_SECONDS = 0.2
DECISION = []  # what set_omp_defaults decided in this process, as "NAME=value (why)" strings


def cpu_times(stat_text):
    """{cpu index: (busy jiffies, total jiffies)} from /proc/stat text; busy = total - idle - iowait."""
    times = {}
    for line in stat_text.splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit():
            values = [int(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
            times[int(name[3:])] = (sum(values) - values[3] - values[4], sum(values))
    return times


def busy_shares(before, after, cpus):
    """The busy share of each CPU in `cpus` between two `cpu_times` samples: d(busy) / d(total), 0 when a CPU
    is missing or did not tick."""
    shares = {}
    for cpu in cpus:
        (busy0, total0), (busy1, total1) = before.get(cpu, (0, 0)), after.get(cpu, (0, 0))
        shares[cpu] = (busy1 - busy0) / (total1 - total0) if total1 > total0 else 0.0
    return shares


def sample_busy_shares(cpus, seconds=SAMPLE_SECONDS):
    """Each CPU's busy share over the next `seconds` ({} where /proc/stat cannot be read: not Linux)."""
    try:
        with open("/proc/stat") as f:
            before = cpu_times(f.read())
        time.sleep(seconds)
        with open("/proc/stat") as f:
            after = cpu_times(f.read())
    except OSError:
        return {}
    return busy_shares(before, after, cpus)


def allowed_cpus():
    """The CPUs this process may run on (its affinity; every CPU where the OS does not say)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:
        return list(range(os.cpu_count() or 1))


def choose_threads(cpus, busy, processes=1):
    """(threads, why) for each of `processes` processes sharing `cpus`, whose busy shares are `busy` (cpu ->
    0..1): threads = max(1, floor(idle / processes + 0.3)) with idle = sum over cpus of (1 - busy share), so a
    CPU at least 70% taken by other work is not counted."""
    idle = sum(1.0 - min(1.0, max(0.0, busy.get(cpu, 0.0))) for cpu in cpus)
    threads = max(1, int(idle / max(1, processes) + 0.3))
    why = f"{len(cpus)} CPU(s) allowed, {idle:.1f} idle"
    if processes > 1:
        why += f", {processes} processes"
    return threads, why


def thread_counts(text):
    """Whether `text` is an OMP_NUM_THREADS value OpenMP takes: a positive count, or a comma list of them (one per
    nesting level)."""
    return all(part.strip().isdigit() and int(part) > 0 for part in text.split(","))


def omp_settings(environ, processes=1, busy=None, cpus=None):
    """({variable: value} to set, [why, ...]): the thread count and wait policy for a process started with
    `environ`; a variable the user set is kept (and nothing is measured when OMP_NUM_THREADS is set to a count)."""
    settings, reasons = {}, []
    given = environ.get("OMP_NUM_THREADS")
    if given is not None and thread_counts(given):
        reasons.append(f"OMP_NUM_THREADS={given} (set by the caller)")
    else:  # unset, or no count OpenMP takes ("banana", "0": libgomp says so and runs on as if unset)
        cpus = allowed_cpus() if cpus is None else cpus
        busy = sample_busy_shares(cpus) if busy is None else busy
        threads, why = choose_threads(cpus, busy, processes)
        settings["OMP_NUM_THREADS"] = str(threads)
        if given is not None:
            why += f"; the caller's {given!r} is no positive thread count"
        reasons.append(f"OMP_NUM_THREADS={threads} (auto: {why})")
    if not any(name in environ for name in WAIT_VARIABLES):
        settings["OMP_WAIT_POLICY"] = "PASSIVE"
        reasons.append("OMP_WAIT_POLICY=PASSIVE (auto: idle threads sleep instead of spinning)")
    else:
        reasons += [f"{name}={environ[name]} (set by the caller)" for name in WAIT_VARIABLES if name in environ]
    return settings, reasons


def local_processes(environ):
    """The processes of this run on this machine, as a launcher names them (torchrun's LOCAL_WORLD_SIZE,
    DeepSpeed's LOCAL_SIZE), else 1."""
    return int(environ.get("LOCAL_WORLD_SIZE") or environ.get("LOCAL_SIZE") or 1)


def set_omp_defaults(processes=None):
    """Put `omp_settings` into os.environ (for `processes` processes, by default `local_processes`). Call before
    torch is imported: OpenMP reads them once, when it loads (after that only the thread count can still change,
    through torch.set_num_threads)."""
    settings, reasons = omp_settings(os.environ, processes or local_processes(os.environ))
    if "torch" in sys.modules:
        import torch

        if "OMP_NUM_THREADS" in settings:
            torch.set_num_threads(int(settings["OMP_NUM_THREADS"]))
        if "OMP_WAIT_POLICY" in settings:
            reasons[-1] = "OMP_WAIT_POLICY not applied (torch was imported before utils.runtime.threads)"
    os.environ.update(settings)
    DECISION[:] = reasons
    return reasons


def describe():
    """One line for a run's log: the thread settings of this process and why."""
    return "threads: " + "; ".join(DECISION or omp_settings(os.environ, busy={})[1])


def main(argv=None):
    """`python -m utils.runtime.threads [--processes N]`: shell `export` lines of the settings to add, the reasons on
    stderr."""
    import argparse

    parser = argparse.ArgumentParser(description="Print the OpenMP settings a launch should export.")
    parser.add_argument("--processes", type=int, default=1, help="Processes that will share this machine's CPUs.")
    args = parser.parse_args(argv)
    settings, reasons = omp_settings(os.environ, args.processes)
    for name, value in settings.items():
        print(f"export {name}={value}")
    print("threads: " + "; ".join(reasons), file=sys.stderr)


if __name__ == "__main__":
    main()
else:
    set_omp_defaults()
