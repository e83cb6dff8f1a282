"""Threads on a busy machine: seconds per step of the quick start's step 1 (the tiny model, the tiny recipe's batch
64 x <= 64 tokens, `bench/worker.py`) quiet and beside one competing busy process, by thread count and OpenMP wait
policy, and with the settings `utils.runtime.threads` picks when no OMP_* variable is set. Each setting runs in a fresh
process (OpenMP reads its variables when torch loads); settings are alternated within a round, rounds repeated."""
import statistics
import subprocess
import sys
import time

from bench.memory import start_worker, worker_result
from utils.runtime.progress import log_line, progress

# (label, OpenMP variables). GNU OpenMP, torch's on Linux, spins 300000 times (~3 ms) when no wait policy is set:
# the "spinning" row sets that count explicitly, since utils.runtime.threads would otherwise add PASSIVE.
SETTINGS = (
    ("1 thread", {"OMP_NUM_THREADS": "1"}),
    ("2 threads, spinning (GNU default: GOMP_SPINCOUNT=300000)", {"OMP_NUM_THREADS": "2", "GOMP_SPINCOUNT": "300000"}),
    ("2 threads, OMP_WAIT_POLICY=PASSIVE", {"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE"}),
    ("2 threads, GOMP_SPINCOUNT=0", {"OMP_NUM_THREADS": "2", "GOMP_SPINCOUNT": "0"}),
    ("2 threads, GOMP_SPINCOUNT=10000", {"OMP_NUM_THREADS": "2", "GOMP_SPINCOUNT": "10000"}),
    ("auto (utils.runtime.threads)", {}),
)
WARMUP_STEPS = 2
BUSY_LOOP = "while True: pass"


def step_seconds(result, warmup=WARMUP_STEPS):
    """The median seconds of a worker's steps after the first `warmup` (model build, first-call caches)."""
    return statistics.median(result["step_seconds"][warmup:])


def run_setting(omp, busy, steps):
    """(seconds per step, the worker's thread line) of step 1 on the tiny model with the OpenMP variables `omp`,
    beside one `while True: pass` process if `busy` (started a second before, so utils.runtime.threads can see it)."""
    config = {"label": "threads", "step": "step1", "model": "tiny", "zero_stage": 0, "processes": 1, "steps": steps}
    competitor = subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) if busy else None
    try:
        if competitor:
            time.sleep(1.0)
        result = worker_result(start_worker(config, omp), config)
    finally:
        if competitor:
            competitor.kill()
            competitor.wait()
    return step_seconds(result), result["threads"]


def measure_threads(repeats=1, steps=12, settings=SETTINGS):
    """{label: {"quiet": [s/step, ...], "busy": [...], "threads": {"quiet": line, "busy": line}}}, each setting run
    quiet and busy once per round, `repeats` rounds."""
    results = {label: {"quiet": [], "busy": [], "threads": {}} for label, _ in settings}
    bar = progress(total=repeats * len(settings) * 2, desc="threads", unit="run")
    for round_index in range(repeats):
        for label, omp in settings:
            for busy in (False, True):
                condition = "busy" if busy else "quiet"
                with log_line():
                    print(f"threads: {label}, {condition} ({round_index + 1}/{repeats})", flush=True)
                seconds, threads = run_setting(omp, busy, steps)
                results[label][condition].append(seconds)
                results[label]["threads"][condition] = threads
                bar.update(1)
    bar.close()
    return results
