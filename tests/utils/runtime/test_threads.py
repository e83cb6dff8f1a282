"""Tests of utils/runtime/threads.py: busy shares from /proc/stat samples, threads per process from the idle CPUs, the
OpenMP variables added (never one the user set, unless OpenMP would not take it), and the launch scripts' use of it."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from utils.runtime.threads import busy_shares, choose_threads, cpu_times, omp_settings

ROOT = Path(__file__).resolve().parents[3]
# Two /proc/stat samples of a 2-core machine 100 jiffies apart: cpu0 fully busy (user), cpu1 idle but for 10
# jiffies of system time and 5 of iowait (waiting, so idle).
STAT_BEFORE = """cpu  2000 0 200 7000 20 0 10 0 0 0
cpu0 1000 0 100 3500 10 0 5 0 0 0
cpu1 1000 0 100 3500 10 0 5 0 0 0
intr 12345 0 0
ctxt 6789
"""
STAT_AFTER = """cpu  2100 0 210 7085 25 0 10 0 0 0
cpu0 1100 0 100 3500 10 0 5 0 0 0
cpu1 1000 0 110 3585 15 0 5 0 0 0
intr 12400 0 0
"""


def test_busy_shares_from_two_proc_stat_samples():
    before, after = cpu_times(STAT_BEFORE), cpu_times(STAT_AFTER)
    assert set(before) == {0, 1}  # the "cpu" total line and the other lines are not CPUs
    assert before[0] == (1105, 4615)
    shares = busy_shares(before, after, [0, 1, 5])
    assert shares[0] == 1.0
    assert abs(shares[1] - 10 / 100) < 1e-9
    assert shares[5] == 0.0  # a CPU the samples do not list


def test_threads_follow_the_idle_cpus_this_process_may_use():
    assert choose_threads([0, 1], {0: 0.0, 1: 0.02})[0] == 2  # quiet
    assert choose_threads([0, 1], {0: 1.0, 1: 0.1})[0] == 1  # one core taken by another process
    assert choose_threads([0, 1], {0: 1.0, 1: 1.0})[0] == 1  # never fewer than one
    assert choose_threads([1], {0: 0.0, 1: 0.0})[0] == 1  # affinity: only cpu1, although cpu0 is idle too
    assert choose_threads(list(range(8)), {}, processes=2)[0] == 4
    assert choose_threads(list(range(8)), {cpu: 1.0 for cpu in range(4)}, processes=2)[0] == 2
    threads, why = choose_threads([0, 1], {0: 1.0, 1: 0.1}, processes=1)
    assert why == "2 CPU(s) allowed, 0.9 idle"


def test_omp_settings_never_override_what_the_user_set():
    settings, reasons = omp_settings({}, busy={0: 0.0, 1: 0.0}, cpus=[0, 1])
    assert settings == {"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE"}
    assert reasons[0].startswith("OMP_NUM_THREADS=2 (auto: ")
    settings, reasons = omp_settings({"OMP_NUM_THREADS": "3"}, busy={0: 0.0, 1: 0.0}, cpus=[0, 1])
    assert settings == {"OMP_WAIT_POLICY": "PASSIVE"} and reasons[0] == "OMP_NUM_THREADS=3 (set by the caller)"
    for wait in ({"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "10000"}):
        settings, reasons = omp_settings({"OMP_NUM_THREADS": "1", **wait}, cpus=[0])
        assert settings == {} and len(reasons) == 2
    assert omp_settings({"OMP_NUM_THREADS": "4,2"}, busy={}, cpus=[0])[0] == {"OMP_WAIT_POLICY": "PASSIVE"}


@pytest.mark.parametrize("value", ["banana", "0", "-4", "", "2,x"])
def test_a_thread_count_openmp_would_not_take_is_replaced_by_the_measured_one_and_said(value):
    """libgomp prints "Invalid value for environment variable OMP_NUM_THREADS" and runs on its own default: the
    value was passed on to every step."""
    settings, reasons = omp_settings({"OMP_NUM_THREADS": value}, busy={0: 0.0, 1: 0.0}, cpus=[0, 1])
    assert settings["OMP_NUM_THREADS"] == "2"
    assert reasons[0].endswith(f"; the caller's {value!r} is no positive thread count)")


def test_launch_scripts_export_the_choice_and_keep_the_callers():
    script = f"source {ROOT / 'training' / 'launch.sh'}; launch single_node main.py --flag"
    env = {key: value for key, value in os.environ.items() if not key.startswith(("OMP_", "GOMP_"))}
    env.update(DRY_RUN="1", PATH=os.path.dirname(sys.executable) + os.pathsep + env["PATH"])
    line = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, check=True).stdout
    threads = int(line.split()[0].removeprefix("OMP_NUM_THREADS="))
    assert 1 <= threads <= max(1, len(os.sched_getaffinity(0)) // 2)  # two processes share the CPUs
    assert " OMP_WAIT_POLICY=PASSIVE deepspeed --num_gpus 2 " in line
    env.update(OMP_NUM_THREADS="5", OMP_WAIT_POLICY="ACTIVE")
    line = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, check=True).stdout
    assert line.startswith("OMP_NUM_THREADS=5 OMP_WAIT_POLICY=ACTIVE deepspeed ")
