"""Step 1's training throughput against a bare PyTorch loop, and its MFU.

Ours is the DeepSpeed engine built as step 1 builds it (step 1's own flags, `train_ds_config_from_args`,
`create_hf_model`, `train_engine_from_args`) stepping as step 1's loop steps it. The baseline is
the same model, batches, dtype, parameter groups and optimizer (torch's fused AdamW, as `create_optimizer` picks
on a CPU), learning-rate schedule and gradient clipping, in a plain PyTorch loop.
"""
import itertools
import time

import torch

from bench.measure import matmul_flops, paired_rates
from bench.models import model_path
from utils.data.data_utils import DataCollatorSFT, create_prompt_dataset, create_unsupervised_dataset, make_dataloader
from utils.data.packing import batch_counts
from utils.model.model_utils import causal_lm_loss, count_parameters, create_hf_model, load_tokenizer
from utils.runtime.args import ArgumentParser, add_step_args, parse_step_args
from utils.runtime.dist import assert_finite
from utils.runtime.ds_utils import GRADIENT_CLIPPING, get_optimizer_grouped_parameters, resolve_dtype, torch_dtype
from utils.trainer.engine import eager, train_ds_config_from_args, train_engine_from_args
from utils.trainer.monitor import training_flops

# The tiny model and SmolLM2-135M (whose 49,152-token vocabulary makes the output layer its largest matmul) on step
# 1's SFT data at the batch and length of their recipes (training/recipes.py); the ~100M model (the MFU target) on
# full 256-token blocks of the built-in plain-text corpus. Both in the dtype `--dtype auto` picks on this machine (bf16
# only where the hardware runs it natively: utils.runtime.ds_utils.choose_dtype).
CASES = {"tiny": {"dtype": "auto", "batch_size": 64, "seq_len": 64, "steps_per_run": 5, "data": "sft"},
         "llama-100m": {"dtype": "auto", "batch_size": 4, "seq_len": 256, "steps_per_run": 1, "data": "blocks"},
         "smollm2-135m": {"dtype": "auto", "batch_size": 8, "seq_len": 64, "steps_per_run": 1, "data": "sft"}}
ADAM_BETAS = (0.9, 0.95)  # utils.runtime.ds_utils.create_optimizer's default


def step1_args(path, dtype, batch_size, seq_len, zero_stage=0, compiled=False):
    """Step 1's parsed flags for this model and batch (every other flag at step 1's default)."""
    parser = ArgumentParser()
    add_step_args(parser, packing=True)  # step 1's flags, as its main.py declares them
    args = parse_step_args(parser, ["--model_name_or_path", path, "--output_dir", "unused", "--dtype", dtype,
                                    "--per_device_train_batch_size", str(batch_size), "--max_seq_len", str(seq_len),
                                    "--zero_stage", str(zero_stage), *(["--compile"] if compiled else [])])
    args.dtype = resolve_dtype(args.dtype)
    return args


def step1_batches(model_name, tokenizer, args, count):
    """`count` collated batches in step 1's order: step 1's own SFT data (prompts labelled -100), or for the ~100M
    model full `max_seq_len`-token blocks of the built-in corpus (real text, no padding, as a throughput test
    wants), through the same collator."""
    if CASES[model_name]["data"] == "sft":
        dataset, _ = create_prompt_dataset(args.data_path, args.data_split, args.data_output_path, 1, args.seed,
                                           tokenizer, args.max_seq_len)
    else:
        dataset = create_unsupervised_dataset("builtin", None, tokenizer, args.max_seq_len, args.seed)
    loader = make_dataloader(dataset, DataCollatorSFT(tokenizer.pad_token_id), args.per_device_train_batch_size,
                             True, args.seed)
    return list(itertools.islice(loader, count))


def build_engine(args, tokenizer, world_size=1, total_steps=10 ** 6):
    """The training engine exactly as step 1's main builds it from `args`."""
    from transformers import AutoModelForCausalLM


    ds_config = train_ds_config_from_args(args, world_size)
    model = create_hf_model(AutoModelForCausalLM, args.model_name_or_path, tokenizer, ds_config, args.dropout,
                            args.trust_remote_code)
    return train_engine_from_args(model, ds_config, args, total_steps)


def step1_case(model_name, num_batches, zero_stage=0, compiled=False, world_size=1):
    """(args, batches, engine) of a CASES model: step 1's flags for it, `num_batches` of its batches and the
    engine step 1 would build (weights drawn after the seed, as step 1 draws them)."""
    case = CASES[model_name]
    path = model_path(model_name)
    tokenizer = load_tokenizer(path)
    args = step1_args(path, case["dtype"], case["batch_size"], case["seq_len"], zero_stage, compiled)
    batches = step1_batches(model_name, tokenizer, args, num_batches)
    torch.manual_seed(args.seed)
    return args, batches, build_engine(args, tokenizer, world_size)


def engine_train_step(engine, batch):
    """One micro-step of step 1's loop (utils.trainer.loop.train_loop): step 1's loss (`causal_lm_loss`: the
    output layer fused with it), finiteness check, backward, step; the loss."""
    loss = causal_lm_loss(engine, batch)
    assert_finite(loss, "the training loss")
    engine.backward(loss)
    engine.step()
    return loss.detach()


class BareTrainer:
    """The same training step in plain PyTorch, the loss from the model's full logits. The model loads as step 1 loads it and is cast to the training
    dtype; in bf16 the optimizer updates fp32 master weights and the bf16 weights are copied from them after each
    step, as DeepSpeed does (at ZeRO-0, in its `FP16_UnfusedOptimizer`)."""

    def __init__(self, args, tokenizer, total_steps=10 ** 6):
        from transformers import AutoModelForCausalLM, get_scheduler


        self.model = create_hf_model(AutoModelForCausalLM, args.model_name_or_path, tokenizer, None, args.dropout)
        self.model.to(torch_dtype(args.dtype)).train()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        mixed = args.dtype != "fp32"
        self.masters = [p.detach().float().requires_grad_() for p in self.params] if mixed else self.params
        to_master = {id(p): m for p, m in zip(self.params, self.masters)}
        groups = [dict(group, params=[to_master[id(p)] for p in group["params"]])
                  for group in get_optimizer_grouped_parameters(self.model, args.weight_decay)]
        self.optimizer = torch.optim.AdamW(groups, lr=args.learning_rate, betas=ADAM_BETAS, fused=True)
        self.scheduler = get_scheduler(args.lr_scheduler_type, optimizer=self.optimizer,
                                       num_warmup_steps=args.num_warmup_steps, num_training_steps=total_steps)

    def train_step(self, batch):
        loss = self.model(**batch, use_cache=False).loss
        assert_finite(loss, "the training loss")
        loss.backward()
        if self.masters is not self.params:
            for param, master in zip(self.params, self.masters):
                master.grad = param.grad.float()
                param.grad = None
        torch.nn.utils.clip_grad_norm_(self.masters, GRADIENT_CLIPPING)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.masters is not self.params:
            with torch.no_grad():
                torch._foreach_copy_(self.params, self.masters)


def batch_runner(train_step, batches, config, steps):
    """`() -> (units, seconds)` running `steps` training steps on the next batches (cycling): units are the real
    tokens (of a padded or a packed batch: `batch_counts`) and the FLOPs (DeepSpeed-Chat's formula on the padded
    batch) of those steps."""
    stream = itertools.cycle(batches)

    def run():
        tokens = flops = seconds = 0.0
        for _ in range(steps):
            batch = next(stream)
            start = time.perf_counter()
            train_step(batch)
            seconds += time.perf_counter() - start
            tokens += batch_counts(batch)[1]
            flops += training_flops(config, *batch["input_ids"].shape)
        return {"tokens": tokens, "flops": flops}, seconds

    return run


def with_peak_probe(run, dtype, peaks):
    """`run`, preceded each time by a measure of the matmul peak (appended to `peaks`), so each run's MFU divides
    by the peak of the same moment: a slow spell of the shared machine slows both."""
    def probed_run():
        peaks.append(matmul_flops(torch_dtype(dtype)))
        return run()

    return probed_run


def measure_step1(model_name, repeats, warmup, num_batches=8):
    """Tokens/s and FLOP/s of ours and of the bare loop (pairs), their ratio, and the MFU of each run: its FLOP/s
    over the FLOP/s of a large matmul in the same dtype measured just before it."""
    case = CASES[model_name]
    args, batches, engine = step1_case(model_name, num_batches)
    bare = BareTrainer(args, load_tokenizer(args.model_name_or_path))
    steps = case["steps_per_run"]
    ours = batch_runner(lambda batch: engine_train_step(engine, batch), batches, engine.module.config, steps)
    baseline = batch_runner(bare.train_step, batches, bare.model.config, steps)
    rates = paired_mfu(ours, baseline, args.dtype, repeats, warmup, desc=f"step 1 {model_name}")
    rates.update(parameters=count_parameters(engine.module), dtype=args.dtype,
                 batch_size=args.per_device_train_batch_size, seq_len=args.max_seq_len, steps_per_run=steps)
    return rates


def paired_mfu(ours, baseline, dtype, repeats, warmup, desc):
    """`paired_rates` of two batch runners, each run preceded by a matmul peak in `dtype`, and the MFU of each run:
    its FLOP/s over that peak (lists `mfu` and `peak_flops` on each side)."""
    peaks = {"ours": [], "baseline": []}
    rates = paired_rates(with_peak_probe(ours, dtype, peaks["ours"]),
                         with_peak_probe(baseline, dtype, peaks["baseline"]), repeats, warmup, desc=desc)
    for side in ("ours", "baseline"):
        side_peaks = peaks[side][warmup:]
        rates[side]["mfu"] = [flops / peak for flops, peak in zip(rates[side]["flops"], side_peaks)]
        rates[side]["peak_flops"] = side_peaks
    return rates


def measure_compile(model_name, repeats, warmup, num_batches=8):
    """Step 1 with --compile (`ours`) against without (`baseline`): tokens/s, FLOP/s and MFU as `measure_step1`
    measures them. One engine, built as step 1 builds it with --compile, steps compiled and eager
    (`utils.trainer.engine.eager`) in alternation, so both sides train the same weights on the same batches.
    Before the timed runs the compiled engine takes one step on a batch of each shape: the compile (and a
    recompile for a new shape), whose seconds (with those steps') are `compile_seconds`."""
    args, batches, engine = step1_case(model_name, num_batches, compiled=True)
    start = time.perf_counter()
    for batch in {tuple(batch["input_ids"].shape): batch for batch in batches}.values():
        engine_train_step(engine, batch)
    compile_seconds = time.perf_counter() - start

    def eager_step(batch):
        with eager():
            return engine_train_step(engine, batch)

    steps = CASES[model_name]["steps_per_run"]
    ours = batch_runner(lambda batch: engine_train_step(engine, batch), batches, engine.module.config, steps)
    baseline = batch_runner(eager_step, batches, engine.module.config, steps)
    rates = paired_mfu(ours, baseline, args.dtype, repeats, warmup, desc=f"step 1 {model_name} --compile")
    rates.update(parameters=count_parameters(engine.module), dtype=args.dtype, compile_seconds=compile_seconds,
                 batch_size=args.per_device_train_batch_size, seq_len=args.max_seq_len, steps_per_run=steps)
    return rates
