"""Peak memory: each configuration runs in fresh processes (`bench/worker.py`; two ranks through the `deepspeed`
launcher), one thread each, and reports the peak RSS of every rank; the figure is the max over the ranks."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from bench.worker import RESULT_PREFIX
from utils.runtime.dist import free_port
from utils.runtime.progress import progress

ROOT = Path(__file__).resolve().parent.parent
# A worker must start its own world, not join the bench's (a world of one it started in this process).
RENDEZVOUS_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_SIZE", "MASTER_ADDR", "MASTER_PORT",
                        "CROSS_RANK", "CROSS_SIZE")
WORKER_TIMEOUT_S = 600


def worker_command(step, model, zero_stage, processes, steps, plain_logits=False):
    """The command line of one memory measurement: `python -m bench.worker` for one process, the `deepspeed`
    launcher for more."""
    flags = [step, "--model", model, "--zero_stage", str(zero_stage), "--steps", str(steps),
             *(["--plain_logits"] if plain_logits else [])]
    if processes == 1:
        return [sys.executable, "-m", "bench.worker", *flags]
    launcher = shutil.which("deepspeed")
    if launcher is None:
        raise RuntimeError("the `deepspeed` launcher is not on PATH (pip install deepspeed)")
    return [launcher, "--num_gpus", str(processes), "--master_port", str(free_port()), "--module", "bench.worker",
            *flags]


def worker_env(omp=None):
    """This process's environment without its rendezvous, with the OpenMP variables `omp` (default one thread)
    in place of this process's own."""
    env = {key: value for key, value in os.environ.items()
           if key not in RENDEZVOUS_VARIABLES and not key.startswith(("OMP_", "GOMP_"))}
    env.update({"OMP_NUM_THREADS": "1"} if omp is None else omp)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def start_worker(config, omp=None):
    """Start the processes of one configuration (a dict: step, model, zero_stage, processes, steps), with the
    OpenMP variables `omp` (default one thread)."""
    command = worker_command(config["step"], config["model"], config["zero_stage"], config["processes"],
                             config["steps"], config.get("plain_logits", False))
    return subprocess.Popen(command, cwd=ROOT, env=worker_env(omp), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def worker_result(process, config):
    """Wait for a worker; the dict of its result line (peak_rss_mb per rank, step_seconds, threads)."""
    output, _ = process.communicate(timeout=WORKER_TIMEOUT_S)
    for line in output.splitlines():
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    tail = "\n".join(output.splitlines()[-15:])
    raise RuntimeError(f"bench worker {config} failed (exit {process.returncode}):\n{tail}")


def finish_worker(process, config):
    """Wait for a configuration's processes; its peak RSS in MiB (max over ranks) and each rank's."""
    per_rank = tuple(worker_result(process, config)["peak_rss_mb"])  # a tuple: not summarised
    return {"peak_rss_mb": max(per_rank), "per_rank_mb": per_rank}


def measure_memory(configs):
    """Peak RSS of each configuration, one after the other: {label: {"peak_rss_mb", "per_rank_mb"}}."""
    return {config["label"]: finish_worker(start_worker(config), config)
            for config in progress(configs, desc="memory", unit="run")}


def memory_configs(zero_model, zero_stages, process_counts, steps=2, with_step3=True, head_models=()):
    """What the memory section measures: step 1 (and step 3, unless told not to) on the tiny model, one process,
    ZeRO-0; step 1 of `zero_model` at each ZeRO stage with each process count; and step 1 of each of
    `head_models` with the fused output layer and with the full logits. A configuration listed twice runs
    once."""
    wanted = [("step1", "tiny", 0, 1)] + ([("step3", "tiny", 0, 1)] if with_step3 else [])
    wanted += [("step1", zero_model, stage, processes) for stage in zero_stages for processes in process_counts]
    configs = {}
    for step, model, stage, processes in wanted:
        label = memory_label(step, model, stage, processes)
        configs[label] = {"label": label, "step": step, "model": model, "zero_stage": stage, "processes": processes,
                          "steps": 1 if step == "step3" else steps}
    for model in head_models:
        for plain in (False, True):
            label = memory_label("step1", model, 0, 1) + (" full logits" if plain else " fused output layer")
            configs[label] = {"label": label, "step": "step1", "model": model, "zero_stage": 0, "processes": 1,
                              "steps": steps, "plain_logits": plain}
    return list(configs.values())


def memory_label(step, model, stage, processes):
    return f"{step} {model} zero{stage} x{processes}"
