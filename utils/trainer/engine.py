"""Turning a loaded model into a DeepSpeed training engine: LoRA, activation checkpointing, grouped optimizer,
learning-rate schedule. Steps 1 and 2 train one such engine, step 3 two (actor and critic)."""
import math

import torch

from utils.model.lora import convert_linear_layer_to_lora, only_optimize_lora_parameters
from utils.runtime import threads
from utils.runtime.dist import init_distributed, print_rank_0, quiet_transformers, set_random_seed
from utils.runtime.ds_utils import (create_optimizer, get_optimizer_grouped_parameters, get_train_ds_config,
                                    merge_user_ds_config, training_dtype)
from utils.runtime.progress import is_rank_0


def prepare_trainable(model, *, lora_dim=0, lora_module_name="layers.", only_optimize_lora=False,
                      gradient_checkpointing=False):
    """Wrap LoRA layers (and freeze all else when asked), and turn on activation checkpointing."""
    if lora_dim > 0:
        convert_linear_layer_to_lora(model, lora_module_name, lora_dim)
        if only_optimize_lora:
            only_optimize_lora_parameters(model)
            if gradient_checkpointing:
                model.enable_input_require_grads()  # checkpointed blocks need an input that requires grad
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def init_train_engine(model, *, ds_config, learning_rate, weight_decay, lora_learning_rate, offload,
                      lr_scheduler_type, num_warmup_steps, num_training_steps):
    """`deepspeed.initialize` with DeepSpeed-Chat's grouped AdamW and a transformers LR schedule."""
    import deepspeed
    from transformers import get_scheduler

    groups = get_optimizer_grouped_parameters(model, weight_decay, lora_learning_rate)
    optimizer = create_optimizer(groups, learning_rate, offload)
    scheduler = get_scheduler(lr_scheduler_type, optimizer=optimizer, num_warmup_steps=num_warmup_steps,
                              num_training_steps=num_training_steps)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config)
    skip_allreduce_without_data_parallelism(engine)
    skip_redundant_bf16_overflow_scan(engine)
    return engine


def train_engine_from_args(model, ds_config, args, num_training_steps):
    """Steps 1 and 2 (and bench/): LoRA and activation checkpointing from their flags, then the engine, compiled
    with --compile."""
    prepare_trainable(model, lora_dim=args.lora_dim, lora_module_name=args.lora_module_name,
                      only_optimize_lora=args.only_optimize_lora, gradient_checkpointing=args.gradient_checkpointing)
    engine = init_train_engine(model, ds_config=ds_config, learning_rate=args.learning_rate,
                               weight_decay=args.weight_decay, lora_learning_rate=args.lora_learning_rate,
                               offload=args.offload, lr_scheduler_type=args.lr_scheduler_type,
                               num_warmup_steps=args.num_warmup_steps, num_training_steps=num_training_steps)
    if args.compile:
        compile_engine(engine)
    return engine


def compile_engine(engine):
    """`torch.compile` of the model (TorchInductor; the backward too, through AOTAutograd), by DeepSpeed's
    `engine.compile()`: it compiles the module in place (`nn.Module.compile`), so the module, its parameters and
    its state dict keep their names and saving, checkpoints and ZeRO's hooks see the same model. The first
    training step compiles (minutes on a small CPU; later runs reuse TorchInductor's cache), and so does the first
    batch of a new length (then lengths are traced as dynamic). Evaluations run eager (`eager`)."""
    engine.compile()
    return engine


def eager():
    """A context in which compiled modules run eager: evaluations, whose eval mode and no-grad would each
    need a compile of their own, for a few batches."""
    return torch.compiler.set_stance("force_eager")


def skip_allreduce_without_data_parallelism(engine):
    """At ZeRO stage 0 with one data-parallel rank, DeepSpeed still "all-reduces" the gradients after every
    backward: it flattens them all into one buffer, reduces it over a group of one and copies each gradient back,
    two needless copies of every gradient per step (a fifth of a ~100M model's step on a CPU, `bench/`). Turn
    that off when it is a no-op. ZeRO stages 1-3 reduce and partition gradients through the same call: they
    keep it."""
    if engine.zero_optimization_stage() == 0 and engine.dp_world_size == 1:
        engine.enable_backward_allreduce = False


def skip_redundant_bf16_overflow_scan(engine):
    """In bf16 at ZeRO stage 0 DeepSpeed wraps the optimizer in its `FP16_UnfusedOptimizer`, which before each
    step scans every gradient for inf/NaN (an amax and an amin per tensor, slow in bf16 on a CPU: ~7% of a ~100M
    model's step, `bench/`) and then computes the gradient norm, which is inf/NaN in exactly those cases and makes
    the optimizer skip the step all the same. bf16 has no loss scale for the scan to adjust, so skip the scan;
    a non-finite gradient still skips the step, through the norm."""
    from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer

    optimizer = engine.optimizer
    if (isinstance(optimizer, FP16_UnfusedOptimizer) and optimizer.low_precision_dtype == torch.bfloat16
            and not optimizer.fused_lamb_legacy and hasattr(optimizer, "overflow_checker")):
        optimizer.overflow_checker.check = lambda param_groups=None: False


def count_training_steps(batches_per_epoch, gradient_accumulation_steps, num_train_epochs, max_steps=0):
    """Optimizer steps of the whole run: epochs x ceil(batches / accumulation), capped by max_steps if set."""
    total = num_train_epochs * math.ceil(batches_per_epoch / gradient_accumulation_steps)
    return min(total, max_steps) if max_steps > 0 else total


def step_budget(batches_per_epoch, gradient_accumulation_steps, num_train_epochs, max_steps=0):
    """The run's optimizer steps, and how they were bounded, for metrics.json: {"steps_asked": max_steps (0:
    none), "epochs_asked": num_train_epochs, "steps_per_epoch", "total_steps" (count_training_steps)}; and a
    WARNING line when --num_train_epochs gives fewer steps than --max_steps asks (None otherwise)."""
    per_epoch = math.ceil(batches_per_epoch / gradient_accumulation_steps)
    total = count_training_steps(batches_per_epoch, gradient_accumulation_steps, num_train_epochs, max_steps)
    budget = {"steps_asked": max_steps, "epochs_asked": num_train_epochs, "steps_per_epoch": per_epoch,
              "total_steps": total}
    warning = None
    if max_steps > total:
        warning = (f"WARNING: {max_steps} steps asked, {num_train_epochs} epochs of the data give only {total} "
                   f"({per_epoch} an epoch); raise --num_train_epochs to train them all")
    return budget, warning


def start_run(args):
    """What every step does first: join the distributed world, settle the dtype, seed everything, quiet
    transformers; print the dtype and the thread settings chosen, and why. Returns (start_time, world_size,
    device): the run's wall clock starts here."""
    import time


    start_time = time.time()
    _, world_size, _, device = init_distributed()
    args.dtype, why = training_dtype(args.dtype)
    print_rank_0(f"dtype: {args.dtype} ({why})")
    print_rank_0(threads.describe())
    set_random_seed(args.seed)
    quiet_transformers()
    return start_time, world_size, device


def train_ds_config_from_args(args, world_size):
    """The DeepSpeed config of steps 1 and 2 from their flags, with the user's --deepspeed_config on top."""
    config = get_train_ds_config(micro_batch_size=args.per_device_train_batch_size,
                                 gradient_accumulation_steps=args.gradient_accumulation_steps,
                                 world_size=world_size, dtype=args.dtype, stage=args.zero_stage,
                                 offload=args.offload)
    return merge_user_ds_config(config, args.deepspeed_config)


def write_metrics(output_dir, metrics):
    """The step's measured figures as <output_dir>/metrics.json (rank 0 only), for train.py's report."""
    import json


    if is_rank_0():
        with open(f"{output_dir}/metrics.json", "w") as f:
            json.dump(metrics, f, indent=2)
