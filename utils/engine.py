"""Turning a loaded model into a DeepSpeed training engine: LoRA, activation checkpointing, grouped optimizer,
learning-rate schedule. Steps 1 and 2 train one such engine, step 3 two (actor and critic)."""
import math

from utils.ds_utils import create_optimizer, get_optimizer_grouped_parameters
from utils.lora import convert_linear_layer_to_lora, only_optimize_lora_parameters


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
    return engine


def count_training_steps(batches_per_epoch, gradient_accumulation_steps, num_train_epochs, max_steps=0):
    """Optimizer steps of the whole run: epochs x ceil(batches / accumulation), capped by max_steps if set."""
    total = num_train_epochs * math.ceil(batches_per_epoch / gradient_accumulation_steps)
    return min(total, max_steps) if max_steps > 0 else total


def start_run(args):
    """What every step does first: join the distributed world, settle the dtype, seed everything, quiet
    transformers. Returns (rank, world_size, device)."""
    from utils.ds_utils import resolve_dtype
    from utils.utils import init_distributed, quiet_transformers, set_random_seed

    rank, world_size, _, device = init_distributed()
    args.dtype = resolve_dtype(args.dtype)
    set_random_seed(args.seed)
    quiet_transformers()
    return rank, world_size, device


def train_ds_config_from_args(args, world_size):
    """The DeepSpeed config of steps 1 and 2 from their flags, with the user's --deepspeed_config on top."""
    from utils.ds_utils import get_train_ds_config, merge_user_ds_config

    config = get_train_ds_config(micro_batch_size=args.per_device_train_batch_size,
                                 gradient_accumulation_steps=args.gradient_accumulation_steps,
                                 world_size=world_size, dtype=args.dtype, stage=args.zero_stage,
                                 offload=args.offload)
    return merge_user_ds_config(config, args.deepspeed_config)


def write_metrics(output_dir, metrics):
    """The step's measured figures as <output_dir>/metrics.json (rank 0 only), for train.py's report."""
    import json

    from utils.utils import is_rank_0

    if is_rank_0():
        with open(f"{output_dir}/metrics.json", "w") as f:
            json.dump(metrics, f, indent=2)
