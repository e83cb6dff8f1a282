"""Benchmark chatrlhf on this machine in one run, print a table and write the figures as JSON.

    python -m bench                      # the full bench (~10 min on 2 cores)
    python -m bench --quick              # a smoke run: tiny model only, one repeat (~1 min)
    python -m bench --output out.json --repeats 7

Measured, each as min / median / max over repeats after a warm-up (ratios pair by pair, ours and the baseline
alternated, since a shared machine is noisy):
  1. step 1 training tokens/s: our DeepSpeed engine against a bare PyTorch loop (tiny; ~100M Llama in bf16);
  2. step 3 rollout tokens/s: `PPOTrainer.generate_sequence` against plain Hugging Face `generate`;
  3. a PPO step on the tiny model: generation, experience forward passes, training, other; samples/s;
  4. MFU: step 1's FLOP/s (DeepSpeed-Chat's formula) over the peak of a large matmul in the same dtype, measured
     just before each run;
  5. peak RSS of step 1 and step 3, and of step 1 at ZeRO 0/1/2/3 with one and two processes.
"""
import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results.json"
SECTIONS = ("step1", "rollout", "ppo", "memory")
TARGETS = {"step1_ratio": 0.9, "rollout_ratio": 1.0, "mfu_bf16": 0.4}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="Smoke run: the tiny model only, one repeat, two memory runs (step 1, one and two "
                             "processes) started together.")
    parser.add_argument("--output", default=str(DEFAULT_OUTPUT), help="Where the JSON goes.")
    parser.add_argument("--repeats", type=int, default=None, help="Timed repeats (default 7; 1 with --quick).")
    parser.add_argument("--warmup", type=int, default=None, help="Untimed runs before the timed ones (default 1; "
                                                                 "0 with --quick).")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the timed sections.")
    parser.add_argument("--models", nargs="+", default=None, choices=("tiny", "llama-100m"),
                        help="Models of step 1 and the MFU (default both; tiny with --quick).")
    parser.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS)
    args = parser.parse_args(argv)
    args.repeats = args.repeats or (1 if args.quick else 7)
    args.warmup = (0 if args.quick else 1) if args.warmup is None else args.warmup
    args.models = args.models or (["tiny"] if args.quick else ["tiny", "llama-100m"])
    return args


def main(argv=None):
    args = parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    torch.set_num_threads(args.threads)
    from utils.runtime.dist import init_distributed, quiet_transformers

    init_distributed()
    quiet_transformers()
    start = time.time()
    results = {"machine": machine_info(args), "settings": vars(args).copy()}
    memory = start_memory(args) if "memory" in args.sections and args.quick else None
    results["peak_matmul_flops"] = measure_peaks(args)
    if "step1" in args.sections:
        results["step1"], results["mfu"] = run_step1(args)
    if "rollout" in args.sections or "ppo" in args.sections:
        results.update(run_step3(args))
    if "memory" in args.sections:
        results["memory"] = finish_memory(memory) if memory else run_memory(args)
    results["machine"]["load_average_end"] = os.getloadavg()
    results["wall_time_s"] = time.time() - start
    from bench.measure import summarize_tree

    results = summarize_tree(results)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(results, indent=2) + "\n")
    print(format_report(results))
    print(f"\nwrote {args.output} ({results['wall_time_s']:.0f} s)")
    return results


def machine_info(args):
    import deepspeed
    import transformers

    return {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
            "load_average_start": os.getloadavg(), "threads": args.threads, "torch": torch.__version__,
            "deepspeed": deepspeed.__version__, "transformers": transformers.__version__}


def measure_peaks(args):
    """FLOP/s of a large matmul in fp32 and in bf16, on their own (the MFU divides by the one measured just before
    each training run)."""
    from bench.measure import peak_matmul_flops

    repeats = args.repeats if args.quick else max(3, args.repeats)
    return {"fp32": peak_matmul_flops(torch.float32, repeats=repeats),
            "bf16": peak_matmul_flops(torch.bfloat16, repeats=repeats)}


def run_step1(args):
    """Section 1 (throughput against the bare loop) and section 4 (MFU) for each model."""
    import gc

    from bench.step1 import measure_step1

    step1, mfu = {}, {}
    for model in args.models:
        print(f"step 1: {model}", flush=True)
        result = measure_step1(model, args.repeats, args.warmup, quick=args.quick)
        gc.collect()
        mfu[model] = {side: result[side].pop("mfu") for side in ("ours", "baseline")}
        mfu[model].update(dtype=result["dtype"], peak_flops=result["ours"].pop("peak_flops")
                          + result["baseline"].pop("peak_flops"))
        step1[model] = result
    return step1, mfu


def run_step3(args):
    """Sections 2 (rollouts) and 3 (PPO step) on one RLHF engine of the tiny model."""
    from bench.step3 import build_trainer, measure_ppo, measure_rollout, prompt_batches

    print("step 3: tiny", flush=True)
    trainer, step3_args, tokenizer = build_trainer()
    batches = prompt_batches(step3_args, tokenizer, 2 if args.quick else 4)
    out = {}
    if "rollout" in args.sections:
        out["rollout"] = measure_rollout(trainer, step3_args, tokenizer, batches, args.repeats, args.warmup)
    if "ppo" in args.sections:
        out["ppo"] = measure_ppo(trainer, step3_args, batches, args.repeats, args.warmup)
    return out


def memory_plan(args):
    from bench.memory import memory_configs

    if args.quick:
        return memory_configs("tiny", zero_stages=(0,), process_counts=(1, 2), steps=1, with_step3=False)
    return memory_configs("llama-100m" if "llama-100m" in args.models else "tiny", zero_stages=(0, 1, 2, 3),
                          process_counts=(1, 2))


def start_memory(args):
    """--quick starts the memory workers at once, alongside the timed sections (their timings are a smoke test)."""
    from bench.memory import start_worker

    return [(config, start_worker(config)) for config in memory_plan(args)]


def finish_memory(started):
    from bench.memory import finish_worker

    return {config["label"]: finish_worker(process, config) for config, process in started}


def run_memory(args):
    from bench.memory import measure_memory

    print("memory", flush=True)
    return measure_memory(memory_plan(args))


# ---- report ---------------------------------------------------------------------------------------------------

def spread(summary, scale=1.0, digits=1):
    """`min / median / max` of a summary, scaled."""
    return " / ".join(f"{summary[key] * scale:.{digits}f}" for key in ("min", "median", "max"))


def format_report(results):
    """The Markdown tables of the README's performance section."""
    load = results["machine"]
    lines = [f"{load['cpus']} CPUs, {load['threads']} thread(s) per process; load average (1/5/15 min) "
             f"{_load(load['load_average_start'])} at the start, {_load(load['load_average_end'])} at the end",
             "", "| measure | ours (min / median / max) | baseline (min / median / max) | ratio (min / median / max) "
                 "| target |", "|---|---|---|---|---|"]
    for model, r in results.get("step1", {}).items():
        lines.append(f"| step 1 train tokens/s, {model} {r['dtype']} (batch {r['batch_size']}, seq <= {r['seq_len']}) "
                     f"vs bare PyTorch | {spread(r['ours']['tokens'])} | {spread(r['baseline']['tokens'])} | "
                     f"{spread(r['ratio'], digits=3)} | >= {TARGETS['step1_ratio']} |")
    if "rollout" in results:
        r = results["rollout"]
        lines.append(f"| step 3 rollout tokens/s, tiny (batch {r['batch_size']}, {r['max_new_tokens']} new) vs HF "
                     f"generate | {spread(r['ours']['tokens'])} | {spread(r['baseline']['tokens'])} | "
                     f"{spread(r['ratio'], digits=3)} | >= {TARGETS['rollout_ratio']} |")
    for model, r in results.get("mfu", {}).items():
        target = f">= {TARGETS['mfu_bf16']:.0%}" if r["dtype"] == "bf16" else ""
        lines.append(f"| MFU, step 1 {model} {r['dtype']} (matmul peak {spread(r['peak_flops'], 1e-9, 0)} GFLOP/s) | "
                     f"{spread(r['ours'], 100)} % | {spread(r['baseline'], 100)} % | | {target} |")
    if "ppo" in results:
        lines += ["", *format_ppo(results["ppo"])]
    if "memory" in results:
        lines += ["", *format_memory(results["memory"])]
    peaks = results["peak_matmul_flops"]
    lines += ["", "Peak matmul (2048^3, GFLOP/s, min / median / max): "
              + ", ".join(f"{dtype} {spread(s, 1e-9, 0)}" for dtype, s in peaks.items())]
    return "\n".join(lines)


def format_ppo(ppo):
    lines = [f"PPO step, tiny model ({ppo['generation_batch_size']} rollouts of <= {ppo['max_new_tokens']} tokens, "
             f"{ppo['ppo_epochs']} epochs of minibatch {ppo['training_batch_size']}): "
             f"{spread(ppo['samples_per_s'])} samples/s, {spread(ppo['step_seconds'], digits=2)} s/step",
             "", "| part | seconds (min / median / max) | share of the step (median) |", "|---|---|---|"]
    for part, seconds in ppo["seconds"].items():
        lines.append(f"| {part} | {spread(seconds, digits=3)} | {ppo['share'][part]['median']:.1%} |")
    return lines


def format_memory(memory):
    lines = ["| peak RSS (max over processes) | MiB | per process |", "|---|---|---|"]
    for label, r in memory.items():
        lines.append(f"| {label} | {r['peak_rss_mb']:.0f} | {', '.join(f'{m:.0f}' for m in r['per_rank_mb'])} |")
    return lines


def _load(values):
    return "/".join(f"{v:.1f}" for v in values)


if __name__ == "__main__":
    main()
