"""Benchmark chatrlhf on this machine in one run, print a table and write the figures as JSON.

    python -m bench                      # the full bench (~10 min on 2 cores)
    python -m bench --quick              # a smoke run: tiny model only, few repeats (~1-2 min)
    python -m bench --output out.json --repeats 7
    python -m bench --sections threads   # threads and OpenMP wait policy, quiet and beside a busy process

Measured, each as min / median / max over repeats after a warm-up (ratios pair by pair, ours and the baseline
alternated, since a shared machine is noisy), in the dtype `--dtype auto` picks here (bf16 only with native bf16):
  1. step 1 training tokens/s: our DeepSpeed engine against a bare PyTorch loop (tiny; a ~100M Llama);
  2. step 3 rollout tokens/s: `PPOTrainer.generate_sequence` against plain Hugging Face `generate`;
  3. a PPO step on the tiny model: generation, experience forward passes, training, other; samples/s;
  4. MFU: step 1's FLOP/s (DeepSpeed-Chat's formula) over the peak of a large matmul in the same dtype, measured
     just before each run (the peaks of fp32 and bf16 are both reported);
  5. peak RSS of step 1 and step 3, and of step 1 at ZeRO 0/1/2/3 with one and two processes;
  6. step 1 training tokens/s with --packing against dynamic padding, on synthetic data of dialogue-like
     lengths (bench/packing.py), and both runs' per-step losses (not in --quick);
  7. step 3's sampler against `generate` on 64 distinct prompts and on 4 prompts x 8 answers (also with the LoRA
     layers of step 3's actor), for the bench models and SmolLM2-135M when installed (bench/sampler.py; section
     `sampler`, only when named);
  8. step 3's actor forward + backward on answer groups, each prompt run once for its group against every row's
     full pass (bench/groups.py; tiny and the ~100M Llama), and the two's largest logit difference;
  9. only when asked (`--sections threads`, bench/threads.py): step 1's seconds per step quiet and beside a busy
     process, by thread count and OpenMP wait policy, and with what utils.runtime.threads picks;
  10. only when asked (`--sections compile`): step 1's tokens/s and MFU with --compile against without (one engine
      run compiled and eager in alternation), for each of --models, and the seconds the compile took;
  11. the output layer fused with the labels' log-probs against the model's full logits (bench/head.py): step 1's
      train tokens/s and step 3's actor update pass, for each of --models but llama-100m (not in --quick);
  12. a critic-free RL round as the SmolLM2 reasoning-gym recipe runs it, the old policy's log-probs from the
      sampler (`--rollout_logprobs`) against a forward pass (bench/rl_round.py; each of --models but llama-100m;
      not in --quick).

The tables and a plot of the ratios are written beside each other under docs/ (`--report`, bench/report.py) with
the CPU, the dtype, the commit and the command, so that no table of these figures is typed by hand.
"""
import json
import os
import sys
import time
from pathlib import Path

import utils.runtime.threads  # noqa: F401 (first: sets OpenMP threads and wait policy before torch loads)
# isort: split
import torch

from bench.models import MODELS, installed_models
from utils.runtime.errors import ArgumentParser, ConfigError, cli_entry
from utils.runtime.paths import check_writable_file

DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results.json"
SECTIONS = ("step1", "rollout", "ppo", "memory", "packing", "groups", "head", "grpo")
NOT_QUICK = ("packing", "groups", "head", "grpo")
OPT_IN_SECTIONS = ("threads", "compile", "sampler")
TARGETS = {"step1_ratio": 0.9, "rollout_ratio": 1.0, "mfu_100m": 0.4, "busy_slowdown": 2.5, "packing_ratio": 1.3,
           "step1_smollm2_ratio": 1.5}
DEFAULT_REPORT = Path(__file__).resolve().parent.parent / "docs" / "bench.md"


def parse_args(argv=None):
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="Smoke run: the tiny model only, 3 short repeats, two memory runs (step 1, one and "
                             "two processes) started together.")
    parser.add_argument("--output", default=str(DEFAULT_OUTPUT), help="Where the JSON goes.")
    parser.add_argument("--repeats", type=int, default=None,
                        help="Timed repeats (default 7; 3 with --quick; the threads section runs min(repeats, 2) "
                             "rounds).")
    parser.add_argument("--warmup", type=int, default=None, help="Untimed runs before the timed ones (default 1).")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the timed sections.")
    parser.add_argument("--models", nargs="+", default=None, choices=MODELS,
                        help="Models of step 1, the MFU and the fused output layer (default: all, smollm2-135m when "
                             "its package is installed; tiny with --quick).")
    parser.add_argument("--report", default=None,
                        help="Where the Markdown tables go, the plot beside them (.png) (default docs/bench.md, "
                             "docs/bench-quick.md with --quick; `none`: not written).")
    parser.add_argument("--sections", nargs="+", default=None, choices=SECTIONS + OPT_IN_SECTIONS,
                        help=f"Which measurements to run (default: {' '.join(SECTIONS)}, without "
                             f"{' '.join(NOT_QUICK)} with --quick; {' '.join(OPT_IN_SECTIONS)} only when named).")
    args = parser.parse_args(argv)
    for flag, least in (("repeats", 1), ("warmup", 0), ("threads", 1)):  # refused before minutes of measuring
        if getattr(args, flag) is not None and getattr(args, flag) < least:
            raise ConfigError(f"--{flag} must be at least {least}, not {getattr(args, flag)}")
    check_writable_file("--output", args.output)
    if args.report is None:
        args.report = str(DEFAULT_REPORT.with_name("bench-quick.md") if args.quick else DEFAULT_REPORT)
    if args.report != "none":
        check_writable_file("--report", args.report)
    args.repeats = args.repeats or (3 if args.quick else 7)
    args.warmup = 1 if args.warmup is None else args.warmup
    args.sections = args.sections or [s for s in SECTIONS if not (args.quick and s in NOT_QUICK)]
    args.models = args.models or (["tiny"] if args.quick else installed_models())
    return args


@cli_entry
def main(argv=None):
    args = parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    torch.set_num_threads(args.threads)
    from utils.runtime.dist import init_distributed, quiet_transformers

    init_distributed()
    quiet_transformers()
    start = time.time()
    results = {"machine": machine_info(args),
               "settings": {**vars(args), "argv": list(sys.argv[1:] if argv is None else argv)}}
    memory = start_memory(args) if "memory" in args.sections and args.quick else None
    results["peak_matmul_flops"], results["peak_matmul_size"] = measure_peaks(args)
    if "step1" in args.sections:
        results["step1"], results["mfu"] = run_step1(args)
    if "head" in args.sections:
        results["head"] = run_head(args)
    if "rollout" in args.sections or "ppo" in args.sections:
        results.update(run_step3(args))
    if "memory" in args.sections:
        results["memory"] = finish_memory(memory) if memory else run_memory(args)
    if "packing" in args.sections:
        from bench.packing import measure_packing

        print("step 1: packing", flush=True)
        results["packing"] = measure_packing(args.repeats, args.warmup)
    if "groups" in args.sections:
        from bench.groups import measure_groups

        results["groups"] = {}
        for model in args.models:
            print(f"step 3: answer groups, {model}", flush=True)
            results["groups"][model] = measure_groups(model, args.repeats, args.warmup)
    if "grpo" in args.sections:
        results["grpo"] = run_grpo(args)
    if "sampler" in args.sections:
        results["sampler"] = run_sampler(args)
    if "threads" in args.sections:
        from bench.threads import measure_threads

        results["threads"] = measure_threads(repeats=min(args.repeats, 2))
    if "compile" in args.sections:
        results["compile"] = run_compile(args)
    results["machine"]["load_average_end"] = os.getloadavg()
    results["wall_time_s"] = time.time() - start
    from bench.measure import summarize_tree

    results = summarize_tree(results)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(results, indent=2) + "\n")
    print(format_report(results))
    print(f"\nwrote {args.output} ({results['wall_time_s']:.0f} s)")
    if args.report != "none":
        from bench.report import write_report

        for path in write_report(results, format_report(results), args.report, TARGETS,
                                 results["settings"]["argv"]):
            print(f"wrote {path}")
    return results


def machine_info(args):
    import deepspeed
    import transformers

    from utils.runtime.ds_utils import training_dtype
    from utils.runtime.provenance import cpu_model

    dtype, why = training_dtype("auto")
    return {"cpus": os.cpu_count(), "cpu_model": cpu_model(),
            "dtype": dtype, "dtype_why": why, "load_average_start": os.getloadavg(), "threads": args.threads,
            "torch": torch.__version__, "deepspeed": deepspeed.__version__, "transformers": transformers.__version__}


def measure_peaks(args):
    """FLOP/s of a matmul in fp32 and in bf16 on their own, and the matrix size of each (`matmul_size`: smaller
    where the CPU has no kernels for the dtype); the MFU divides by the one measured just before each run."""
    from bench.measure import matmul_size, peak_matmul_flops
    from utils.runtime.ds_utils import TORCH_DTYPES

    dtypes = {name: TORCH_DTYPES[name] for name in ("fp32", "bf16")}
    return ({name: peak_matmul_flops(dtype, repeats=args.repeats) for name, dtype in dtypes.items()},
            {name: matmul_size(dtype) for name, dtype in dtypes.items()})


def run_step1(args):
    """Section 1 (throughput against the bare loop) and section 4 (MFU) for each model."""
    import gc

    from bench.step1 import measure_step1

    step1, mfu = {}, {}
    for model in args.models:
        print(f"step 1: {model}", flush=True)
        result = measure_step1(model, args.repeats, args.warmup)
        gc.collect()
        mfu[model] = {side: result[side].pop("mfu") for side in ("ours", "baseline")}
        mfu[model].update(dtype=result["dtype"], peak_flops=result["ours"].pop("peak_flops")
                          + result["baseline"].pop("peak_flops"))
        step1[model] = result
    return step1, mfu


def run_head(args):
    """Section 11: the fused output layer against the full logits, step 1 and step 3, for each model."""
    import gc

    from bench.head import SHAPES, measure_head_step1, measure_head_step3

    results = {}
    for model in (m for m in args.models if m != "llama-100m"):
        print(f"fused output layer: {model}", flush=True)
        results[f"{model} step 1"] = measure_head_step1(model, args.repeats, args.warmup)
        gc.collect()
        for shape in SHAPES:
            results[f"{model} step 3 {shape}"] = measure_head_step3(model, shape, args.repeats, args.warmup)
            gc.collect()
    return results


def run_grpo(args):
    """Section 12: an RL round with the sampler's log-probs against a forward pass's, for each model."""
    import gc

    from bench.rl_round import measure_grpo_round

    results = {}
    for model in (m for m in args.models if m != "llama-100m"):
        print(f"step 3 grpo round: {model}", flush=True)
        results[model] = measure_grpo_round(model, args.repeats, args.warmup)
        gc.collect()
    return results


def run_compile(args):
    """Section 10: --compile against eager, for each model."""
    import gc

    from bench.step1 import measure_compile

    results = {}
    for model in args.models:
        print(f"step 1 --compile: {model}", flush=True)
        result = measure_compile(model, args.repeats, args.warmup)
        result["peak_flops"] = result["ours"].pop("peak_flops") + result["baseline"].pop("peak_flops")
        results[model] = result
        gc.collect()
    return results


def run_sampler(args):
    """Section 7: step 3's sampler against `generate`, for each model and shape (12 new tokens, as the tiny
    recipe's answers), sampling both; in the rows shape against greedy `generate` too; and in the groups shape
    with the LoRA layers of step 3's actor (`--only_optimize_lora`); and our sampler at ZeRO-3, the parameters
    gathered whole (the hybrid engine's actor) against partitioned."""
    import gc

    from bench.sampler import SHAPES, measure_sampler, sampler_models
    from utils.runtime.ds_utils import training_dtype

    dtype, _ = training_dtype("auto")
    results = {}
    for model in sampler_models(args.models):
        for shape in SHAPES:
            print(f"step 3 sampler: {model}, {shape}", flush=True)
            results[f"{model} {shape}"] = measure_sampler(model, shape, 12, dtype, args.repeats, args.warmup)
            gc.collect()
        print(f"step 3 sampler: {model}, rows, against greedy generate", flush=True)
        results[f"{model} rows vs greedy"] = measure_sampler(model, "rows", 12, dtype, args.repeats, args.warmup,
                                                             greedy_baseline=True)
        gc.collect()
        print(f"step 3 sampler: {model} with LoRA layers (step 3's actor), groups", flush=True)
        results[f"{model} groups, LoRA"] = measure_sampler(model, "groups", 12, dtype, args.repeats, args.warmup,
                                                           lora_dim=16)
        gc.collect()
        print(f"step 3 sampler: {model} at ZeRO-3, gathered whole against partitioned, groups", flush=True)
        results[f"{model} groups, ZeRO-3"] = measure_sampler(model, "groups", 12, dtype, args.repeats,
                                                             args.warmup, zero3=True)
        gc.collect()
    return results


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
                          process_counts=(1, 2), head_models=[m for m in args.models if m == "smollm2-135m"])


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

def step1_target(model):
    """Step 1's ratio to the bare loop asked for: 1.5x on SmolLM2-135M (issue 34), parity elsewhere."""
    return TARGETS["step1_smollm2_ratio"] if model == "smollm2-135m" else TARGETS["step1_ratio"]


def spread(summary, scale=1.0, digits=1):
    """`min / median / max` of a summary, scaled."""
    return " / ".join(f"{summary[key] * scale:.{digits}f}" for key in ("min", "median", "max"))


def format_report(results):
    """The Markdown tables the bench prints (docs/performance.md quotes them)."""
    load = results["machine"]
    lines = [f"{load.get('cpu_model', '')}, {load['cpus']} CPUs, {load['threads']} thread(s) per process; load "
             f"average (1/5/15 min) {_load(load['load_average_start'])} at the start, "
             f"{_load(load['load_average_end'])} at the end; dtype {load.get('dtype')} ({load.get('dtype_why')})",
             "", "| measure | ours (min / median / max) | baseline (min / median / max) | ratio (min / median / max) "
                 "| target |", "|---|---|---|---|---|"]
    for model, r in results.get("step1", {}).items():
        lines.append(f"| step 1 train tokens/s, {model} {r['dtype']} (batch {r['batch_size']}, seq <= {r['seq_len']}) "
                     f"vs bare PyTorch | {spread(r['ours']['tokens'])} | {spread(r['baseline']['tokens'])} | "
                     f"{spread(r['ratio'], digits=3)} | >= {step1_target(model)} |")
    if "rollout" in results:
        r = results["rollout"]
        lines.append(f"| step 3 rollout tokens/s, tiny (batch {r['batch_size']}, {r['max_new_tokens']} new) vs HF "
                     f"generate | {spread(r['ours']['tokens'])} | {spread(r['baseline']['tokens'])} | "
                     f"{spread(r['ratio'], digits=3)} | >= {TARGETS['rollout_ratio']} |")
    for r in results.get("sampler", {}).values():
        lines.append(f"| step 3 sampler tokens/s, {r['model']} {r['dtype']}, {r['shape']} ({r['rows']} rows, prompts "
                     f"of <= {r['prompt_len']} tokens, {r['max_new_tokens']} new, T = 1) vs {r['baseline_decoding']} | "
                     f"{spread(r['ours']['tokens'])} | {spread(r['baseline']['tokens'])} | "
                     f"{spread(r['ratio'], digits=3)} | |")
    if "packing" in results:
        r = results["packing"]
        lengths = r["lengths"]
        lines.append(f"| step 1 train tokens/s, tiny {r['dtype']} --packing vs dynamic padding (batch "
                     f"{r['batch_size']}, {lengths['min']}-{lengths['max']} tokens, median "
                     f"{lengths['median']:.0f}, seq <= {r['max_seq_len']}) | {spread(r['ours']['tokens'])} | "
                     f"{spread(r['baseline']['tokens'])} | {spread(r['ratio'], digits=3)} | "
                     f">= {TARGETS['packing_ratio']} |")
    for model, r in results.get("groups", {}).items():
        case = r["case"]
        lines.append(f"| step 3 actor forward + backward, answer tokens/s, {model} fp32 ({case['prompts']} prompts of "
                     f"{case['prompt_len']} tokens x {case['group']} answers of {case['answer_len']}): each prompt "
                     f"once vs every row whole (logits agree to {r['max_logit_difference']:.1g}) | "
                     f"{spread(r['ours']['answer_tokens'])} | {spread(r['baseline']['answer_tokens'])} | "
                     f"{spread(r['ratio'], digits=2)} | |")
    for label, r in results.get("head", {}).items():
        what = (f"step 1 train tokens/s ({r['dtype']}, batch {r['batch_size']}, seq <= {r['seq_len']}; losses "
                f"agree to {r['max_loss_difference']:.1g})" if "step 1" in label else
                f"step 3 actor update, answer tokens/s ({r['dtype']}, {r['case']['prompts']} prompts of "
                f"{r['case']['prompt_len']} x {r['case']['group']} answers of {r['case']['answer_len']}; log-probs "
                f"and gradients agree to {r['max_difference']:.1g})")
        unit = "tokens" if "step 1" in label else "answer_tokens"
        lines.append(f"| {what}, {label.split(' step')[0]} (vocabulary {r['vocab_size']}): fused output layer vs "
                     f"full logits | {spread(r['ours'][unit])} | {spread(r['baseline'][unit])} | "
                     f"{spread(r['ratio'], digits=3)} | |")
    for model, r in results.get("grpo", {}).items():
        lines.append(f"| step 3 GRPO round, rollouts/s, {model} {r['dtype']} ({r['prompts']} prompts x {r['group']} "
                     f"answers of <= {r['max_new_tokens']} tokens, minibatches of {r['training_batch_size']}, LoRA): "
                     f"old log-probs from the sampler vs a forward pass | {spread(r['ours']['rollouts'])} | "
                     f"{spread(r['baseline']['rollouts'])} | {spread(r['ratio'], digits=3)} | |")
    for model, r in results.get("mfu", {}).items():
        target = f">= {TARGETS['mfu_100m']:.0%}" if model == "llama-100m" else ""
        lines.append(f"| MFU, step 1 {model} {r['dtype']} (of the {r['dtype']} matmul peak, "
                     f"{spread(r['peak_flops'], 1e-9, 0)} GFLOP/s) | {spread(r['ours'], 100)} % | "
                     f"{spread(r['baseline'], 100)} % | | {target} |")
    for model, r in results.get("compile", {}).items():
        lines.append(f"| step 1 train tokens/s, {model} {r['dtype']} (batch {r['batch_size']}, seq <= {r['seq_len']}) "
                     f"--compile vs eager (compile {r['compile_seconds']:.0f} s) | {spread(r['ours']['tokens'])} | "
                     f"{spread(r['baseline']['tokens'])} | {spread(r['ratio'], digits=3)} | |")
        target = f">= {TARGETS['mfu_100m']:.0%}" if model == "llama-100m" else ""
        lines.append(f"| MFU, step 1 {model} {r['dtype']} --compile vs eager (of the {r['dtype']} matmul peak, "
                     f"{spread(r['peak_flops'], 1e-9, 0)} GFLOP/s) | "
                     f"{spread(r['ours']['mfu'], 100)} % | {spread(r['baseline']['mfu'], 100)} % | | {target} |")
    if "packing" in results:
        lines += ["", format_packing(results["packing"])]
    if "ppo" in results:
        lines += ["", *format_ppo(results["ppo"])]
    if "memory" in results:
        lines += ["", *format_memory(results["memory"])]
    if "threads" in results:
        lines += ["", *format_threads(results["threads"])]
    sizes = results["peak_matmul_size"]
    lines += ["", "Peak matmul (GFLOP/s, min / median / max): " + ", ".join(
        f"{dtype} {spread(s, 1e-9, 1)} ({sizes[dtype]}^3)" for dtype, s in results["peak_matmul_flops"].items())]
    return "\n".join(lines)


def format_ppo(ppo):
    lines = [f"PPO step, tiny model ({ppo['generation_batch_size']} rollouts of <= {ppo['max_new_tokens']} tokens, "
             f"{ppo['ppo_epochs']} epochs of minibatch {ppo['training_batch_size']}): "
             f"{spread(ppo['samples_per_s'])} samples/s, {spread(ppo['step_seconds'], digits=2)} s/step",
             "", "| part | seconds (min / median / max) | share of the step (median) |", "|---|---|---|"]
    for part, seconds in ppo["seconds"].items():
        lines.append(f"| {part} | {spread(seconds, digits=3)} | {ppo['share'][part]['median']:.1%} |")
    return lines


def format_packing(packing):
    """The losses of the packed and padded runs (which must agree) and the positions each computes."""
    first, last, positions = packing["first_loss"], packing["last_loss"], packing["positions_per_batch"]
    return (f"Packing: per-step losses of the packed and the padded run agree to {packing['max_loss_difference']:.2g} "
            f"over {packing['steps']} steps (packed {first['ours']:.4f} -> {last['ours']:.4f}, padded "
            f"{first['baseline']:.4f} -> {last['baseline']:.4f}); positions per batch: packed "
            f"{positions['ours']:.0f}, padded {positions['baseline']:.0f}, for {positions['real']:.0f} real tokens.")


def format_memory(memory):
    lines = ["| peak RSS (max over processes) | MiB | per process |", "|---|---|---|"]
    for label, r in memory.items():
        lines.append(f"| {label} | {r['peak_rss_mb']:.0f} | {', '.join(f'{m:.0f}' for m in r['per_rank_mb'])} |")
    return lines


def format_threads(threads):
    """Seconds per step of each thread setting quiet and beside a busy process; the target is auto's slowdown."""
    best_quiet = min(r["quiet"]["median"] for r in threads.values())
    lines = ["Step 1 of the quick start, tiny model, seconds per step (min / median / max), quiet and beside one "
             "busy process:", "", "| setting | quiet | beside a busy process | busy / quiet (median) | "
             "busy / best quiet |", "|---|---|---|---|---|"]
    for label, r in threads.items():
        slowdown = r["busy"]["median"] / r["quiet"]["median"]
        target = f" (target <= {TARGETS['busy_slowdown']})" if label.startswith("auto") else ""
        lines.append(f"| {label} | {spread(r['quiet'], digits=3)} | {spread(r['busy'], digits=3)} | "
                     f"{slowdown:.2f}{target} | {r['busy']['median'] / best_quiet:.2f} |")
    for label, r in threads.items():
        if label.startswith("auto"):
            lines += ["", f"{label}, quiet: {r['threads']['quiet']}", f"{label}, busy: {r['threads']['busy']}"]
    return lines


def _load(values):
    return "/".join(f"{v:.1f}" for v in values)


if __name__ == "__main__":
    main()
