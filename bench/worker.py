"""One process (or one rank under the `deepspeed` launcher) of the memory bench: a few training steps of step 1
(any bench model, any ZeRO stage) or of step 3 (the tiny model), then the peak RSS of every rank, printed by
rank 0 as one `BENCH_WORKER_RESULT {json}` line, with the seconds of each of rank 0's steps.

    python -m bench.worker step1 --model llama-100m --zero_stage 2 --steps 2
    deepspeed --num_gpus 2 --module bench.worker step1 --model tiny --zero_stage 3
"""
import argparse
import contextlib
import json

import utils.runtime.threads  # noqa: F401 (first: sets OpenMP threads and wait policy before torch loads)
# isort: split
import torch

RESULT_PREFIX = "BENCH_WORKER_RESULT "


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("step1", "step3"), help="Train step 1 (SFT) or step 3 (PPO, tiny model).")
    parser.add_argument("--model", default="tiny", help="A bench model of step 1 (bench/step1.py CASES).")
    parser.add_argument("--zero_stage", type=int, default=0, choices=(0, 1, 2, 3), help="ZeRO stage of step 1.")
    parser.add_argument("--steps", type=int, default=2, help="Training steps (step 1) or PPO steps (step 3).")
    parser.add_argument("--plain_logits", action="store_true",
                        help="Step 1's loss from the model's full logits instead of the fused output layer.")
    parser.add_argument("--local_rank", type=int, default=-1, help="Set by the deepspeed launcher.")
    return parser.parse_args(argv)


def run_step1(model_name, zero_stage, steps, world_size):
    from bench.measure import timed
    from bench.step1 import engine_train_step, step1_case

    _, batches, engine = step1_case(model_name, steps, zero_stage, world_size=world_size)
    return [timed(engine_train_step, engine, batch)[1] for batch in batches]


def run_step3(steps):
    import random

    from bench.measure import timed
    from bench.step3 import ExperienceTimers, build_trainer, ppo_step, prompt_batches

    trainer, args, tokenizer = build_trainer()
    timers, shuffler = ExperienceTimers(trainer), random.Random(args.seed)
    batches = prompt_batches(args, tokenizer, steps)
    return [timed(ppo_step, trainer, args, batch, timers, shuffler)[1] for batch in batches]


def main(argv=None):
    from bench.measure import peak_rss_mb
    from utils.runtime.dist import init_distributed, quiet_transformers
    from utils.runtime.progress import is_rank_0

    args = parse_args(argv)
    _, world_size, _, _ = init_distributed()
    quiet_transformers()
    if args.step == "step1":
        from utils.model.model_utils import plain_output_layer

        with plain_output_layer() if args.plain_logits else contextlib.nullcontext():
            step_seconds = run_step1(args.model, args.zero_stage, args.steps, world_size)
    else:
        step_seconds = run_step3(args.steps)
    peaks = [torch.zeros(1, dtype=torch.float64) for _ in range(world_size)]
    torch.distributed.all_gather(peaks, torch.tensor([peak_rss_mb()], dtype=torch.float64))
    if is_rank_0():
        result = {"peak_rss_mb": [p.item() for p in peaks], "step_seconds": step_seconds,
                  "threads": utils.runtime.threads.describe()}
        print(RESULT_PREFIX + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
